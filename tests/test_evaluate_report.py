"""The reports people read: rendered in headless Chromium (every <img> loads, the data's
provenance is stated) and a perfectly separated class drawn with a visible ROC curve."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from chexflow.auroc import auroc_summary
from chexflow.components.reports import run_report, scaling_chart, scaling_report, scaling_table
from chexflow.evaluate.plots import plot_roc, roc_figure, roc_points
from chexflow.evaluate.report import SYNTH_MARKER, data_provenance, write_report
from chexflow.pathologies import PATHOLOGIES
from tests.support.browser import load_in_chromium

HERNIA = PATHOLOGIES.index("Hernia")


def predictions(seed: int = 0):
    """80 images: Hernia perfectly separated by 2 positives, Pleural_Thickening all negative,
    the rest informative but noisy."""
    rng = np.random.default_rng(seed)
    labels = (rng.random((80, len(PATHOLOGIES))) < 0.2).astype(np.float32)
    probs = np.clip(0.4 * labels + 0.6 * rng.random(labels.shape), 0, 1).astype(np.float32)
    labels[:, HERNIA] = 0
    labels[:2, HERNIA] = 1
    probs[:, HERNIA] = 0.1 + 0.8 * labels[:, HERNIA]
    labels[:, PATHOLOGIES.index("Pleural_Thickening")] = 0
    return labels, probs, np.ones_like(labels)


def generated_data(tmp: Path) -> Path:
    """A preprocess output folder whose CSV sits in a folder `chexflow run` generated."""
    raw, data = tmp / "raw", tmp / "data"
    raw.mkdir()
    data.mkdir()
    (raw / SYNTH_MARKER).write_text(json.dumps({"images": 400, "size": 64, "seed": 0}))
    csv = raw / "Data_Entry_2017.csv"
    csv.write_text("Image Index,Finding Labels\n")
    (data / "manifest.json").write_text(json.dumps(
        {"inputs": {"csv": {"path": str(csv), "sha256": "0" * 64}}}))
    return data


def training_run(tmp: Path) -> Path:
    """A training run folder: metrics.json with a 4-epoch history, and the model file."""
    run = tmp / "train"
    run.mkdir()
    history = [{"epoch": e, "loss": 5.0 / e, "val_loss": 7.0 / e, "val_auroc": 0.5 + e / 10,
                "lr": 0.002 if e < 3 else 0.0002} for e in range(1, 5)]
    metrics = {"model": "densenet121", "workers": 2, "epochs": 4, "lr": 0.001,
               "images_per_sec": 28.5, "wall_seconds": 96.0, "history": history}
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "best_model.keras").write_bytes(b"")
    return run


def evaluation(tmp: Path) -> tuple[dict, Path]:
    """auroc.json's content and roc.png, as `chexflow evaluate` writes them."""
    labels, probs, mask = predictions()
    summary = auroc_summary(PATHOLOGIES, labels, probs, mask, 100, 0)
    summary.update(split="test", model=str(training_run(tmp) / "best_model.keras"),
                   data=str(generated_data(tmp)))
    return summary, plot_roc(PATHOLOGIES, labels, probs, mask, summary, tmp / "roc.png")


def open_in_chromium(page: Path) -> tuple[list[str], str]:
    """Load PAGE in headless Chromium; return each <img>'s natural size (or BROKEN) and the
    text of the element with id="provenance"."""
    images, dom = load_in_chromium(page)
    provenance = re.search(r'id="provenance">(.*?)</', dom, re.S)
    return [size for _, size in images], provenance.group(1) if provenance else ""


def test_roc_points_of_a_perfectly_separated_class_reach_the_top_left_corner():
    labels, probs, _ = predictions()
    fpr, tpr = roc_points(labels[:, HERNIA], probs[:, HERNIA])
    assert (fpr[0], tpr[0]) == (0, 0) and (fpr[-1], tpr[-1]) == (1, 1)
    assert any(f == 0 and t == 1 for f, t in zip(fpr, tpr, strict=True))
    assert roc_points(np.zeros(5), np.arange(5.0)) is None  # one label value: no curve


def test_perfectly_separated_class_has_a_curve_drawn_inside_its_panel(tmp_path):
    labels, probs, mask = predictions()
    summary = auroc_summary(PATHOLOGIES, labels, probs, mask, 0)
    assert summary["per_class"]["Hernia"]["auroc"] == 1.0
    fig = roc_figure(PATHOLOGIES, labels, probs, mask, summary)
    curves = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()
              if line.get_gid()}
    skipped = set(summary["skipped_classes"])
    assert set(curves) == {f"roc-{c}" for c in PATHOLOGIES if c not in skipped}
    hernia = curves["roc-Hernia"]
    x, y = hernia.get_xdata(), hernia.get_ydata()
    assert hernia.get_visible() and len(x) >= 3 and (0, 1) in set(zip(x, y, strict=True))
    # the curve runs along x=0 and y=1: the panel must extend past them, or the frame hides it
    (x0, x1), (y0, y1) = hernia.axes.get_xlim(), hernia.axes.get_ylim()
    assert x0 < 0 and y1 > 1 and x1 >= 1 and y0 <= 0


@pytest.mark.slow
def test_evaluate_report_renders_in_chromium_with_curves_and_provenance(tmp_path):
    summary, roc_png = evaluation(tmp_path)
    page = write_report(summary, roc_png, tmp_path / "report.html", "evaluation")
    text = page.read_text()
    assert "Training, per epoch" in text and "Parameters" in text
    assert "<td>Hernia</td><td>1.000</td>" in text and "<td>0.916</td>" in text  # CheXNet's
    images, provenance = open_in_chromium(page)
    assert len(images) == 2 and "BROKEN" not in images  # training curves + ROC grid
    assert "generated by `chexflow data synth`" in provenance and "not NIH" in provenance


@pytest.mark.slow
def test_pipeline_run_report_renders_in_chromium(tmp_path):
    summary, roc_png = evaluation(tmp_path)
    train = json.loads((tmp_path / "train" / "metrics.json").read_text())
    doc, md = run_report(train, summary, str(roc_png), "chexnet-train report")
    page = tmp_path / "run.html"
    page.write_text(doc)
    images, provenance = open_in_chromium(page)
    assert len(images) == 2 and "BROKEN" not in images
    assert "not NIH" in provenance
    assert "28.5 images/s" in doc and "1 min 36 s" in doc
    assert "**Data:** generated by" in md and "| Hernia | 1 |" in md


def test_scaling_report_renders_in_chromium(tmp_path):
    runs = [{"workers": w, "images_per_sec": 8.0 * w * 0.9 ** (w - 1),
             "images_per_sec_std": 0.2, "step_time_ms": 500.0, "job_wall_seconds": 40.0,
             "model": "resnet50", "image_size": 64, "batch_size_per_worker": 8,
             "synthetic_data": True} for w in (1, 2)]
    table = scaling_table(runs)
    scaling_chart(table, tmp_path / "scaling.png", "scaling")
    doc, md = scaling_report(table, tmp_path / "scaling.png", "scaling")
    page = tmp_path / "scaling.html"
    page.write_text(doc)
    images, provenance = open_in_chromium(page)
    assert len(images) == 1 and "BROKEN" not in images
    assert "synthetic in-memory tensors" in provenance
    assert "efficiency <b>90%</b>" in doc and "resnet50" in doc and "**Data:**" in md


@pytest.mark.parametrize("marker", [True, False])
def test_provenance_says_whether_the_data_were_generated(tmp_path, marker):
    data = generated_data(tmp_path)
    if not marker:
        (tmp_path / "raw" / SYNTH_MARKER).unlink()
    text = data_provenance(data)
    assert ("not NIH's X-rays" in text) == marker
    assert marker or "Data_Entry_2017.csv" in text
