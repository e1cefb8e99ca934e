"""The suggester of each algorithm: the library module that runs it here (algorithms.py says
which library serves which algorithm)."""

from __future__ import annotations

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.suggestions.base import Suggester
from chexflow.katib.suggestions.cmaes import CmaesSuggester
from chexflow.katib.suggestions.hyperopt import HyperoptSuggester
from chexflow.katib.suggestions.optuna import OptunaSuggester
from chexflow.katib.suggestions.skopt import SkoptSuggester


def make_suggester(exp: Experiment, base_seed: int, study_attrs: dict | None = None
                   ) -> Suggester:
    if exp.algorithm in ("random", "tpe"):
        return HyperoptSuggester(exp, base_seed, study_attrs)
    if exp.algorithm == "bayesianoptimization":
        return SkoptSuggester(exp, base_seed, study_attrs)
    if exp.algorithm == "cmaes":
        return CmaesSuggester(exp, base_seed, study_attrs)
    return OptunaSuggester(exp, base_seed, study_attrs)
