"""The tune step of tune-then-train: a real `chexflow tune` sweep (Katib's local runner) launched
as a job, its optimal.json read back and mapped onto the final training's options."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from chexflow.components.steps import StepError, Target, apply_hparams, tune_step
from chexflow.train.options import TrainOptions

SPEC = Path(__file__).resolve().parent.parent / "katib" / "specs" / "chexnet-random.yaml"
TRAIN_FLAGS = {"lr", "batch-size"}


def small_spec(tmp_path: Path) -> Path:
    """chexnet-random with only the parameters `chexflow train` has, 2 trials."""
    doc = yaml.safe_load(SPEC.read_text())
    spec = doc["spec"]
    spec["parameters"] = [p for p in spec["parameters"] if p["name"] in TRAIN_FLAGS]
    keep = {p["name"] for p in spec["parameters"]}
    tp = spec["trialTemplate"]["trialParameters"]
    dropped = {t["name"] for t in tp if not t["reference"].startswith("$")
               and t["reference"] not in keep}
    spec["trialTemplate"]["trialParameters"] = [t for t in tp if t["name"] not in dropped]
    for replica in spec["trialTemplate"]["trialSpec"]["spec"]["mpiReplicaSpecs"].values():
        for c in replica["template"]["spec"]["containers"]:
            for field in ("command", "args"):
                argv = c.get(field) or []
                out = []
                for a in argv:
                    if any(f"${{trialParameters.{d}}}" in str(a) for d in dropped):
                        out.pop()  # its flag
                        continue
                    out.append(a)
                if argv:
                    c[field] = out
    spec.update(maxTrialCount=2, parallelTrialCount=1, maxFailedTrialCount=1)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_tune_step_runs_the_sweep_and_feeds_training(tmp_path):
    state = tmp_path / "state"
    out = io.StringIO()
    with redirect_stdout(out):
        optimal = tune_step(
            str(small_spec(tmp_path)), str(state), "run-1", Target(),
            ["--trial-command", "echo val_auroc=0.71 images_per_sec=12 val_loss=0.4"],
        )
    assert json.loads((state / "optimal.json").read_text()) == optimal
    assert set(optimal["parameters"]) == TRAIN_FLAGS
    assert optimal["metrics"]["val_auroc"] == pytest.approx(0.71)
    options = apply_hparams(TrainOptions(lr=1.0), json.dumps(optimal["parameters"]))
    argv = options.to_argv()
    assert argv[argv.index("--lr") + 1] == str(float(optimal["parameters"]["lr"]))
    assert argv[argv.index("--batch-size") + 1] == str(int(optimal["parameters"]["batch-size"]))
    assert "[tune-run-1]" in out.getvalue()


def test_tuned_optimizer_and_weight_decay_map_onto_train_options():
    options = apply_hparams(TrainOptions(lr=1.0), json.dumps(
        {"lr": 0.01, "optimizer": "sgd", "weight-decay": 0.0001}))
    argv = options.to_argv()
    assert argv[argv.index("--optimizer") + 1] == "sgd"
    assert float(argv[argv.index("--weight-decay") + 1]) == pytest.approx(0.0001)


def test_tuned_parameter_without_a_train_option_is_refused():
    with pytest.raises(StepError, match="'momentum' is not an option of chexflow train"):
        apply_hparams(TrainOptions(), json.dumps({"lr": 0.01, "momentum": 0.9}))
    with pytest.raises(StepError, match="'data' is not an option"):
        apply_hparams(TrainOptions(), json.dumps({"data": "/elsewhere"}))
    with pytest.raises(StepError, match="batch_size 'many' is not int"):
        apply_hparams(TrainOptions(), json.dumps({"batch-size": "many"}))
