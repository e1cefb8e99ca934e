"""End to end: chexflow's own Katib spec run locally; each trial is the MPIJob launcher's
`mpirun -np 2 python -m chexflow.train.worker ...` run as horovodrun with 2 local workers in the
trainer environment, on generated data (tiny: 1 trial, 1 epoch, 3 steps, 2 timed, 64 px); the
trial's TensorBoard events read with Katib's TensorFlowEvent tag semantics. One trial: a second
(TPE's next suggestion) would train again what the local tune-then-train pipeline test's two
trials already show on the chexnet-random spec, and TPE's suggestions are tested on trivial
trials (test_katib_algorithms.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chexflow.katib.local.metrics import read_tfevents
from tests.conftest import REPO, read_json, run_chexflow

SPEC = REPO / "katib" / "specs" / "chexnet-tpe.yaml"


@pytest.mark.trainer
@pytest.mark.slow
def test_chexnet_spec_runs_locally_with_chexflow_train_trials(nih_tfrecords: Path, tmp_path: Path):
    state = tmp_path / "sweep"
    proc = run_chexflow(
        "tune", SPEC, "--local", "--state", state, "--no-progress",
        "--set", "spec.maxTrialCount=1", "--set", "spec.parallelTrialCount=1",
        "--set", "spec.maxFailedTrialCount=1",
        "--trial-arg", f"data={nih_tfrecords}", "--trial-arg", "weights=none",
        "--trial-arg", "epochs=1", "--trial-arg", "image-size=64",
        "--trial-arg", "steps-per-epoch=3", "--trial-arg", "warmup-steps=1",
        "--trial-arg", "validation-steps=1",
        timeout=1500,
    )
    res = read_json(state / "results.json")
    assert res["condition"]["reason"] == "ExperimentMaxTrialsReached", proc.stdout
    assert [t["status"] for t in res["trials"]] == ["Succeeded"]
    for t in res["trials"]:
        assert 0.0 <= t["val_auroc"] <= 1.0 and t["images_per_sec"] > 0
        assert t["optimizer"] in ("adam", "sgd") and t["batch-size"] in (8, 16, 32)
        assert 1e-5 <= t["lr"] <= 1e-2 and 1e-6 <= t["weight-decay"] <= 1e-3
        # the trial's run folder: /mnt/chexflow/runs/katib/${trialSpec.Name} on the PVC, here
        # the default local folder of the volume `data`
        run_dir = state / "volumes" / "data" / "runs" / "katib" / t["trial"]
        assert (run_dir / "metrics.json").exists()
        # the TensorBoard events the trainer writes, read as Katib's TensorFlowEvent collector
        # reads them: `validation/epoch_auroc` is the val_auroc the trial printed
        events = read_tfevents(run_dir / "logs", ["validation/epoch_auroc", "epoch_loss"])
        assert events["validation/epoch_auroc"] == [pytest.approx(t["val_auroc"], abs=1e-6)]
        assert len(events["epoch_loss"]) == 2  # train and validation, as Katib matches them
        log = (state / "trials" / t["trial"] / "stdout.log").read_text()
        assert "horovodrun -np 2 -H localhost:2 --gloo" in log
        assert "<stdout>:epoch=1 val_auroc=" in log
        assert f"--lr {t['lr']!r}" in log and f"--optimizer {t['optimizer']}" in log
    opt = read_json(state / "optimal.json")
    assert set(opt["parameters"]) == {"lr", "batch-size", "optimizer", "weight-decay"}
    assert set(opt["metrics"]) == {"val_auroc", "images_per_sec", "val_loss"}
    assert opt["metrics"]["val_auroc"] == max(t["val_auroc"] for t in res["trials"])
    assert "val_auroc" in proc.stdout and "images_per_sec" in proc.stdout
