"""The suggester that runs each algorithm here: the module the table of algorithms names
(algorithms.py: algorithm -> Katib's service -> this package's module and its library)."""

from __future__ import annotations

from chexflow.katib.experiment.model import Experiment
from chexflow.katib.suggestions.algorithms import ALGORITHMS
from chexflow.katib.suggestions.base import Suggester, SuggestionFailed
from chexflow.katib.suggestions.cmaes import CmaesSuggester
from chexflow.katib.suggestions.hyperopt import HyperoptSuggester
from chexflow.katib.suggestions.optuna import OptunaSuggester
from chexflow.katib.suggestions.skopt import SkoptSuggester

SUGGESTERS: dict[str, type[Suggester]] = {
    "hyperopt": HyperoptSuggester, "optuna": OptunaSuggester, "skopt": SkoptSuggester,
    "cmaes": CmaesSuggester,
}


def make_suggester(exp: Experiment, base_seed: int, study_attrs: dict | None = None
                   ) -> Suggester:
    """The suggester of `exp.algorithm` (one that runs here: not in CLUSTER_ONLY)."""
    algorithm = ALGORITHMS.get(exp.algorithm)
    if algorithm is None or algorithm.suggester is None:
        raise SuggestionFailed(f"algorithm {exp.algorithm}: no suggester here (Katib runs it in "
                               "its own service, only on a cluster)")
    return SUGGESTERS[algorithm.suggester](exp, base_seed, study_attrs)
