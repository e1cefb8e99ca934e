"""The suggestions package: the one table of algorithms picks each algorithm's suggester and the
settings its Katib service checks; the shared search space keeps fixed parameters out of the
libraries and in every suggestion."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from chexflow.katib.experiment.spec import SpecError, parse_experiment
from chexflow.katib.suggestions.algorithms import ALGORITHMS, CLUSTER_ONLY
from chexflow.katib.suggestions.base import SuggestionFailed
from chexflow.katib.suggestions.libraries import SUGGESTERS, make_suggester
from chexflow.katib.suggestions.validation import SETTINGS, validate_algorithm
from tests.support.reference import reference_dir


def experiment(algorithm: str, settings: tuple = (), momentum: dict | None = None):
    """Katib's tpe example (lr, momentum; steps so that grid runs) with another algorithm."""
    d = yaml.safe_load((reference_dir() / "katib-examples" / "tpe.yaml").read_text())
    d["spec"]["algorithm"] = {"algorithmName": algorithm, "algorithmSettings": list(settings)}
    params = d["spec"]["parameters"]
    params[0]["feasibleSpace"]["step"] = "0.01"
    params[1]["feasibleSpace"] = momentum or {"min": "0.5", "max": "0.9", "step": "0.1"}
    return parse_experiment(d)


@pytest.mark.parametrize("algorithm", [a.name for a in ALGORITHMS.values() if a.suggester])
def test_each_algorithm_that_runs_here_gets_the_suggester_the_table_names(algorithm):
    exp = experiment(algorithm)
    suggester = make_suggester(exp, 7)
    assert type(suggester) is SUGGESTERS[ALGORITHMS[algorithm].suggester]
    assert algorithm in SETTINGS
    for s in suggester.suggest([], 2):
        assert list(s.parameters) == ["lr", "momentum"]
        assert 0.01 <= s.parameters["lr"] <= 0.05 and 0.5 <= s.parameters["momentum"] <= 0.9


@pytest.mark.parametrize("algorithm", CLUSTER_ONLY)
def test_a_cluster_only_algorithm_has_no_suggester_here(algorithm):
    exp = dataclasses.replace(experiment("random"), algorithm=algorithm)
    with pytest.raises(SuggestionFailed, match=f"{algorithm}: no suggester here"):
        make_suggester(exp, 7)


@pytest.mark.parametrize("algorithm", ["random", "multivariate-tpe", "bayesianoptimization",
                                       "sobol"])
def test_a_fixed_parameter_is_carried_in_spec_order_but_not_searched(algorithm):
    exp = experiment(algorithm, momentum={"min": "0.7", "max": "0.7"})
    suggester = make_suggester(exp, 3)
    assert [p.name for p in suggester.params] == ["lr"]
    for s in suggester.suggest([], 3):
        assert list(s.parameters) == ["lr", "momentum"] and s.parameters["momentum"] == 0.7


def test_an_unknown_setting_is_refused_by_katibs_python_services_and_ignored_by_goptuna():
    unknown = ({"name": "patience", "value": "3"},)
    exp = experiment("random")
    for algorithm, refused in (("tpe", True), ("bayesianoptimization", True), ("grid", True),
                               ("sobol", False), ("cmaes", False)):
        exp = dataclasses.replace(exp, algorithm=algorithm, algorithm_settings={"patience": "3"})
        found = [m for _, m in validate_algorithm(exp)]
        assert (f"unknown setting patience for algorithm {algorithm}" in found) is refused, found
    # the same setting in a spec: refused in one line that names the field
    with pytest.raises(SpecError, match=r"algorithmSettings\[0\]\.name: unknown setting"):
        experiment("tpe", unknown)
