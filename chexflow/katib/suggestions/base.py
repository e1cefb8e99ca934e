"""What every suggester shares (Katib's base_service): the history it sees, what it returns,
its failures, and the seeds.

Each call rebuilds the library's view from the sweep's trial records (completed trials with
their objective; optuna also sees running ones), as Katib's services do from the Trial list,
plus the study-level state the runner keeps (`study_attrs`), so a resumed sweep continues
where it stopped. Seeds derive from `random_state` (or the sweep's
own seed) and the number of trials so far: the same history gives the same suggestions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.suggestions.algorithms import LIBRARY
from chexflow.katib.suggestions.search_space import SearchSpace


class SearchSpaceExhausted(Exception):
    """The algorithm has no new point to offer (grid: every combination started)."""


class SuggestionFailed(Exception):
    """The suggestion library failed (Katib marks the Experiment Failed: Suggestion has failed)."""


@dataclass
class Suggestion:
    parameters: dict[str, Any]
    optuna_attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class History:
    """What a suggester sees of one trial: its assignment and objective (None: no result)."""

    parameters: dict[str, Any]
    objective: float | None
    active: bool
    optuna_attrs: dict[str, Any] = field(default_factory=dict)

def derived_seed(base: int, n_trials: int) -> int:
    """A seed for the call after `n_trials` trials: same history, same suggestions."""
    return int(np.random.SeedSequence([base, n_trials]).generate_state(1)[0] & 0x7FFFFFFF)


class Suggester(ABC):
    """Base: `suggest(history, n)` returns up to n new assignments.

    The library searches `self.params` (the search space's searched parameters); every
    suggestion also carries the fixed ones (search_space.py). `study_attrs` is the library's
    study-level state that the trials do not hold (optuna's QMC sample counter); the runner
    saves it with the sweep and passes it back when a sweep resumes.
    """

    def __init__(self, exp: Experiment, base_seed: int, study_attrs: dict | None = None):
        self.exp = exp
        self.space = SearchSpace.of(exp)
        self.params = self.space.searched
        self.settings = dict(exp.algorithm_settings)
        self.base_seed = int(self.settings.pop("random_state", base_seed))
        self.study_attrs: dict[str, Any] = dict(study_attrs or {})

    def suggest(self, history: list[History], n: int) -> list[Suggestion]:
        """Up to n new assignments given every trial so far (in creation order)."""
        if self.params:
            try:
                out = self._suggest(history, n)
            except (ValueError, RuntimeError, ArithmeticError) as e:
                raise SuggestionFailed(f"{LIBRARY[self.exp.algorithm]}: {e}") from e
        else:
            out = [Suggestion({}) for _ in range(n)]
        for s in out:
            s.parameters = self.space.assignment(s.parameters)
        return out

    @abstractmethod
    def _suggest(self, history: list[History], n: int) -> list[Suggestion]:
        """The library's suggestions for the parameters in self.params."""

    def _loss(self, value: float) -> float:
        return -value if self.exp.objective.maximize else value
