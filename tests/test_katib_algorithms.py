"""On a function with one clear optimum, tpe and bayesianoptimization beat random over the same
trial budget, across several seeds (the suggesters the local runner uses, one trial at a time)."""

from __future__ import annotations

import statistics

import pytest
import yaml

from chexflow.katib.experiment.spec import parse_experiment
from chexflow.katib.suggestions.base import History
from chexflow.katib.suggestions.libraries import make_suggester
from tests.support.reference import reference_dir


def base() -> dict:
    """Katib's tpe example, read when a test runs (not at import)."""
    return yaml.safe_load((reference_dir() / "katib-examples" / "tpe.yaml").read_text())


def bowl(p: dict) -> float:
    """Minimum 0 at lr=0.0412, momentum=0.613 (inside the examples' space, off its centre)."""
    return ((p["lr"] - 0.0412) / 0.04) ** 2 + ((p["momentum"] - 0.613) / 0.4) ** 2


def best_after(algorithm: str, seed: int, budget: int, settings: tuple = ()) -> float:
    d = base()
    d["spec"]["algorithm"] = {"algorithmName": algorithm, "algorithmSettings": [
        {"name": "random_state", "value": str(seed)}, *settings]}
    exp = parse_experiment(d)
    suggester, history = make_suggester(exp, seed), []
    while len(history) < budget:
        for s in suggester.suggest(history, 1):
            history.append(History(s.parameters, bowl(s.parameters), False))
    return min(h.objective for h in history)


def test_tpe_beats_random_over_ten_seeds():
    random = [best_after("random", s, 30) for s in range(10)]
    tpe = [best_after("tpe", s, 30) for s in range(10)]
    assert statistics.mean(tpe) < 0.5 * statistics.mean(random), (tpe, random)
    assert statistics.median(tpe) < statistics.median(random)


@pytest.mark.slow
def test_bayesianoptimization_beats_random_over_three_seeds():
    settings = ({"name": "n_initial_points", "value": "5"},)
    random = [best_after("random", s, 15) for s in range(3)]
    bo = [best_after("bayesianoptimization", s, 15, settings) for s in range(3)]
    assert statistics.mean(bo) < 0.2 * statistics.mean(random), (bo, random)
    assert all(b < r for b, r in zip(bo, random, strict=True)), (bo, random)
