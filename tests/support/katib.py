"""Katib helpers of the tests."""

from __future__ import annotations

from pathlib import Path

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.experiment.trialspec import local_command_parts


def local_command(exp: Experiment, spec: dict, volumes: dict[str, Path], default_root: Path,
                  trial_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment a local trial runs for this rendered trialSpec."""
    argv, env, _ = local_command_parts(exp, spec, volumes, default_root, trial_args)
    return argv, env
