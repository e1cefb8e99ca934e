"""Katib helpers of the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chexflow.katib.experiment.model import Experiment, Parameter
from chexflow.katib.experiment.trialspec import local_command_parts


def local_command(exp: Experiment, spec: dict, volumes: dict[str, Path], default_root: Path,
                  trial_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment a local trial runs for this rendered trialSpec."""
    argv, env, _ = local_command_parts(exp, spec, volumes, default_root, trial_args)
    return argv, env


def in_feasible_space(p: Parameter, value: Any) -> bool:
    """Whether a suggested value lies in the parameter's feasible space (its list, or between
    its bounds on its step)."""
    if not p.numeric:
        return str(value) in p.values
    v = float(value)
    if p.type == "int" and v != int(v):
        return False
    if not p.low - 1e-12 <= v <= p.high + 1e-12:
        return False
    if p.step:
        k = (v - p.low) / p.step
        return abs(k - round(k)) < 1e-6
    return True
