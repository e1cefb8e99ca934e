"""`chexflow tune SPEC --cluster` parses the spec once: the model read from the file is the one
sent (in --namespace), and only a trialSpec that --trial-arg/--volume changed is checked again."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest

from chexflow.katib import commands
from chexflow.katib.cluster import kubernetes
from chexflow.katib.experiment import spec
from chexflow.katib.experiment.spec import load_experiment, parse_experiment

SPECS = sorted((Path(__file__).resolve().parent.parent / "katib" / "specs").glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_the_experiment_sent_unparsed_is_what_parsing_the_sent_document_gives(path):
    exp = load_experiment(path)
    sent = kubernetes.cluster_experiment(exp, "elsewhere", [], {})
    assert sent.namespace == "elsewhere" and sent.raw["metadata"]["namespace"] == "elsewhere"
    again = parse_experiment(copy.deepcopy(sent.raw), exp.source, exp.config_map,
                             exp.template_files)
    assert sent == again
    assert exp.namespace != "elsewhere" and exp.raw["metadata"].get("namespace") != "elsewhere"


def _tune_args(path: Path, trial_args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    return parser.parse_args(["tune", str(path), "--cluster", "--dry-run", "--namespace", "ns1",
                              *(f"--trial-arg={a}" for a in trial_args)])


@pytest.mark.parametrize(("trial_args", "parses"), [([], 1), (["epochs=1"], 2)])
def test_tune_cluster_parses_the_spec_once_and_a_changed_trial_spec_once_more(
        monkeypatch, tmp_path, trial_args, parses):
    calls, sent = [], []

    def counting(*a, **kw):
        calls.append(a[1] if len(a) > 1 else kw.get("source"))
        return parse_experiment(*a, **kw)

    monkeypatch.setattr(spec, "parse_experiment", counting)
    monkeypatch.setattr(kubernetes, "parse_experiment", counting)
    monkeypatch.setattr(kubernetes, "run_on_cluster",
                        lambda exp, *a, **kw: sent.append(exp) or {})
    path = SPECS[0]
    args = _tune_args(path, trial_args)
    args.state = tmp_path
    assert args.func(args) == 0
    assert len(calls) == parses, calls
    assert [e.namespace for e in sent] == ["ns1"]
