"""Evaluation: AUROC maths against scikit-learn, bootstrap CI, skipped classes, report, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from chexflow.auroc import auroc_summary, bootstrap_auroc, per_class_auroc, rank_auroc
from chexflow.evaluate.plots import plot_roc
from chexflow.evaluate.report import write_report
from chexflow.pathologies import PATHOLOGIES
from chexflow.results import ResultsMissing
from tests.conftest import run_chexflow
from tests.support.results import read_auroc


def _toy(n=120, c=4, seed=0, skill=1.5):
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, c)) < 0.3).astype(np.float32)
    scores = 1 / (1 + np.exp(-(skill * (2 * labels - 1) + rng.normal(0, 1, (n, c)))))
    return labels, np.round(scores, 2)  # rounding makes ties, which AUROC must average


def test_rank_auroc_equals_sklearn_with_ties():
    labels, scores = _toy()
    ours = rank_auroc(labels.T, scores.T)
    theirs = [roc_auc_score(labels[:, k], scores[:, k]) for k in range(labels.shape[1])]
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_single_label_class_is_nan_and_skipped_not_zero():
    labels, scores = _toy(c=3)
    labels[:, 1] = 0  # no positives
    mask = np.ones_like(labels)
    mask[:, 2] = 0  # every label ignored
    point = per_class_auroc(labels, scores, mask)
    assert np.isnan(point[1]) and np.isnan(point[2]) and 0.5 < point[0] <= 1
    s = auroc_summary(["a", "b", "c"], labels, scores, mask, resamples=50)
    assert s["skipped_classes"] == ["b", "c"]
    assert s["mean"] == pytest.approx(point[0], abs=1e-6)  # nanmean over the one real class
    assert s["per_class"]["b"]["auroc"] is None


def test_bootstrap_ci_brackets_estimate_and_narrows_with_data():
    small = auroc_summary(["a", "b"], *_toy(n=60, c=2, seed=1), resamples=400)
    large = auroc_summary(["a", "b"], *_toy(n=2000, c=2, seed=1), resamples=400)
    for s in (small, large):
        assert s["ci_low"] <= s["mean"] <= s["ci_high"]
        for d in s["per_class"].values():
            assert d["ci_low"] <= d["auroc"] <= d["ci_high"]
    assert (large["ci_high"] - large["ci_low"]) < (small["ci_high"] - small["ci_low"]) / 2


def test_bootstrap_masked_class_uses_unmasked_entries_only():
    labels, scores = _toy(n=80, c=2, seed=3)
    mask = np.ones_like(labels)
    mask[::3, 1] = 0
    per_class, _ = bootstrap_auroc(labels, scores, mask, resamples=30, seed=0)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 80, (30, 80))[0]
    keep = mask[idx, 1] > 0
    expected = roc_auc_score(labels[idx, 1][keep], scores[idx, 1][keep])
    assert per_class[0, 1] == pytest.approx(expected)


def test_roc_png_and_report(tmp_path):
    labels, scores = _toy(n=200, c=len(PATHOLOGIES), seed=2)
    labels[:, -1] = 0
    mask = np.ones_like(labels)
    s = auroc_summary(PATHOLOGIES, labels, scores, mask, resamples=100)
    png = plot_roc(PATHOLOGIES, labels, scores, mask, s, tmp_path / "roc.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    html = write_report(s, png, tmp_path / "report.html", "t").read_text()
    assert "0.9248" in html.replace("0.925", "0.9248") and "Hernia" in html
    table = html.split("Test AUROC per pathology")[1].split("</table>")[0]
    assert "data:image/png;base64," in html and table.count("<tr>") == len(PATHOLOGIES) + 1
    (tmp_path / "auroc.json").write_text(json.dumps(s))
    assert read_auroc(tmp_path)["skipped_classes"] == ["Hernia"]
    with pytest.raises(ResultsMissing, match="chexflow evaluate"):
        read_auroc(tmp_path / "nowhere")


@pytest.mark.trainer
def test_evaluate_refuses_model_of_another_image_size(densenet_run, tmp_path, nih_raw):
    other = tmp_path / "data96"
    run_chexflow(
        "preprocess", "--csv", nih_raw / "Data_Entry_2017.csv", "--images", nih_raw / "images",
        "--out", other, "--image-size", 96, "--workers", 1, "--images-per-shard", 400,
    )
    proc = run_chexflow(
        "evaluate", "--data", other, "--model", densenet_run, "--out", tmp_path / "ev",
        "--bootstrap", 10, check=False,
    )
    assert proc.returncode == 2
    assert "takes 64 px images" in proc.stderr and "96 px" in proc.stderr


@pytest.mark.trainer
def test_evaluate_refuses_to_overwrite(densenet_eval, nih_tfrecords, densenet_run):
    proc = run_chexflow(
        "evaluate", "--data", nih_tfrecords, "--model", densenet_run, "--out", densenet_eval,
        "--bootstrap", 10, check=False,
    )
    assert proc.returncode == 2 and "--overwrite" in proc.stderr


@pytest.mark.trainer
def test_evaluate_outputs(densenet_eval, demo_run):
    s = read_auroc(densenet_eval)
    assert set(s["per_class"]) == set(PATHOLOGIES)
    assert s["bootstrap"]["resamples"] == demo_run[0]["arguments"]["bootstrap"] == 200
    assert s["ci_low"] <= s["mean"] <= s["ci_high"]
    pred = np.load(densenet_eval / "predictions.npz")
    assert pred["probs"].shape == pred["labels"].shape == (s["images"], len(PATHOLOGIES))
    recomputed = np.nanmean(per_class_auroc(pred["labels"], pred["probs"], pred["mask"]))
    assert s["mean"] == pytest.approx(recomputed, abs=1e-5)
    assert (densenet_eval / "roc.png").stat().st_size > 20_000
    assert "CheXNet" in (densenet_eval / "report.html").read_text()
