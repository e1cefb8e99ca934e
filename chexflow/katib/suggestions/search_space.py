"""The search space every suggester reads (Katib's `search_space.py`): the parameters a library
searches, the ones with a single possible value (min == max, a one-item list), which no library
is given and every suggestion carries, each parameter's scale, and its values as the libraries
take them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chexflow.katib.experiment.model import Experiment, Parameter

LOG_DISTRIBUTIONS = ("logUniform", "logNormal")


@dataclass
class SearchSpace:
    order: list[str]  # every parameter's name, in the spec's order
    searched: list[Parameter]
    fixed: dict[str, Any]

    @classmethod
    def of(cls, exp: Experiment) -> SearchSpace:
        return cls(order=[p.name for p in exp.parameters],
                   searched=[p for p in exp.parameters if not p.fixed],
                   fixed={p.name: p.snap(p.low) if p.numeric else p.values[0]
                          for p in exp.parameters if p.fixed})

    def assignment(self, searched: dict[str, Any]) -> dict[str, Any]:
        """A suggestion's values for the searched parameters, with the fixed ones, in order."""
        merged = {**searched, **self.fixed}
        return {name: merged[name] for name in self.order}


def log_scale(p: Parameter) -> bool:
    """Searched on a log scale (optuna, skopt, cmaes; goptuna reads normal as uniform)."""
    return p.distribution in LOG_DISTRIBUTIONS


def library_value(p: Parameter, value: Any) -> int | float | str:
    """A trial's value as optuna and skopt take it: int, float, or the listed string."""
    if p.type == "int":
        return int(value)
    return float(value) if p.type == "double" else str(value)
