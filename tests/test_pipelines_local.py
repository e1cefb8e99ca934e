"""`chexflow run`: whole pipelines with kfp.local and real Horovod jobs, on tiny data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_chexflow

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

# 3 steps: the first 2 are warm-up (left out of images/s), the third is measured.
TINY = ["--epochs", 1, "--steps-per-epoch", 3, "--batch-size", 8, "--image-size", 64]


def summary_of(out: Path, pipeline: str) -> dict:
    (run_dir,) = sorted(out.glob(f"{pipeline}-*"))
    return json.loads((run_dir / "summary.json").read_text())


def metrics(summary: dict, task: str) -> dict:
    return summary["tasks"][task]["artifacts"]["metrics"]["metadata"]


def test_scaling_study_one_and_two_workers_verbose(tmp_path, nih_tfrecords):
    proc = run_chexflow("run", "scaling-study", "--data", nih_tfrecords, "--out", tmp_path,
                        "--worker-counts", "1,2", "--model", "resnet50", "--epochs", 1,
                        "--steps-per-epoch", 5, "--batch-size", 4, "--image-size", 64,
                        "--verbose")
    # --verbose: the steps' own output (kfp.local's and the jobs') on the terminal too
    assert "Executing task" in proc.stdout and "[train-w1-" in proc.stdout
    assert "1 worker(s): " in proc.stdout and "scaling efficiency 100%" in proc.stdout
    s = summary_of(tmp_path, "scaling-study")
    table = json.loads(s["tasks"]["scaling-report-op"]["parameters"]["Output"])
    assert [r["workers"] for r in table] == [1, 2]
    assert all(r["images_per_sec"] > 0 for r in table)
    assert table[0]["efficiency"] == pytest.approx(1.0)
    assert len(table[1]["images_per_sec_per_worker"]) == 2
    m = metrics(s, "scaling-report-op")
    assert m["images_per_sec_w2"] == pytest.approx(table[1]["images_per_sec"])
    png = Path(s["tasks"]["scaling-report-op"]["artifacts"]["chart"]["uri"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = Path(s["tasks"]["scaling-report-op"]["artifacts"]["report_html"]["uri"]).read_text()
    assert "efficiency %" in html and "data:image/png;base64" in html


def test_failing_training_fails_the_pipeline_with_the_worker_error(tmp_path, nih_tfrecords):
    """What only the worker can tell (the run checks that --weights is there, not what it
    holds) fails the run at its step, with the worker's own message."""
    weights = tmp_path / "weights.keras"
    weights.write_text("not a model")
    proc = run_chexflow("run", "chexnet-train", "--data", nih_tfrecords, "--out", tmp_path,
                        *TINY, "--workers", 1, "--weights", weights, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert "not a Keras model chexflow can load" in out  # the worker's own message
    assert "job train-w1-" in out and "exited with status" in out
    assert "chexflow run: error: pipeline chexnet-train failed at step train-op" in proc.stderr
    # the failed step's log tail, without --verbose; nothing else of the logs
    tail = proc.stdout.split("--- last ")[1]
    assert "not a Keras model chexflow can load" in tail and "train-op.log ---" in tail
    assert len(tail.strip().split("\n")) <= 22 and "Executing task" not in out
