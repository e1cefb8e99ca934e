"""The report's figures (matplotlib, Agg): the ROC curve of every class, and the training
curves per epoch (train and validation loss, validation AUROC, learning rate)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

# Axes reach a little past [0, 1] so that a curve on the frame (a perfectly separated class
# runs up the left edge and along the top) is drawn inside the plot, not under its border.
ROC_LIMITS = (-0.02, 1.02)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def roc_points(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(false positive rates, true positive rates) of one class, from (0, 0) to (1, 1);
    None when the labels hold one value only (no ROC curve exists)."""
    from sklearn.metrics import roc_curve

    if len(np.unique(labels)) < 2:
        return None
    fpr, tpr, _ = roc_curve(labels, scores)
    return fpr, tpr


def roc_figure(classes, labels, probs, mask, summary: dict):
    """One panel per class: its ROC curve (every class with both label values, AUROC 1.0
    included), the chance diagonal and CheXNet's AUROC in the title."""
    from chexflow.pathologies import CHEXNET_AUROC

    plt = pyplot()
    cols = 4
    rows = math.ceil(len(classes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for k, cls in enumerate(classes):
        ax = axes[k // cols][k % cols]
        keep = mask[:, k] > 0
        points = roc_points(labels[keep, k], probs[keep, k])
        auc = summary["per_class"][cls]["auroc"]
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="grey")
        if points is None:
            ax.text(0.5, 0.5, "one label value:\nno ROC", ha="center", va="center")
        else:
            ax.plot(*points, lw=1.8, color="tab:blue", zorder=3, clip_on=False,
                    label=f"AUROC {auc:.3f}", gid=f"roc-{cls}")
            ax.legend(loc="lower right", fontsize=7)
        paper = CHEXNET_AUROC.get(cls)
        ax.set_title(cls if paper is None else f"{cls} (CheXNet {paper:.3f})", fontsize=9)
        ax.set_xlim(*ROC_LIMITS)
        ax.set_ylim(*ROC_LIMITS)
        ax.tick_params(labelsize=7)
    for k in range(len(classes), rows * cols):
        axes[k // cols][k % cols].axis("off")
    mean = summary["mean"]
    fig.suptitle(f"ROC per class, n={len(labels)} images, mean AUROC "
                 + ("n/a" if mean is None else f"{mean:.3f}"))
    fig.supxlabel("false positive rate")
    fig.supylabel("true positive rate")
    fig.tight_layout()
    return fig


def plot_roc(classes, labels, probs, mask, summary: dict, path: Path) -> Path:
    plt = pyplot()
    fig = roc_figure(classes, labels, probs, mask, summary)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(h["epoch"], h[key]) for h in history
             if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
    return [e for e, _ in pairs], [v for _, v in pairs]


def history_figure(history: list[dict[str, Any]]):
    """Three panels over epochs: train and validation loss, validation AUROC, learning rate."""
    plt = pyplot()
    fig, (loss, auroc, lr) = plt.subplots(1, 3, figsize=(12, 3.4))
    for key, label in (("loss", "train loss"), ("val_loss", "validation loss")):
        epochs, values = _series(history, key)
        if epochs:
            loss.plot(epochs, values, marker="o", label=label)
    loss.set(title="Loss (summed BCE)", xlabel="epoch")
    loss.legend(fontsize=8)
    epochs, values = _series(history, "val_auroc")
    auroc.plot(epochs, values, marker="o", color="tab:green")
    auroc.set(title="Validation AUROC (mean)", xlabel="epoch", ylim=(0, 1.02))
    epochs, values = _series(history, "lr")
    lr.plot(epochs, values, marker="o", color="tab:purple")
    lr.set(title="Learning rate", xlabel="epoch")
    if values and min(values) > 0 and max(values) / min(values) > 5:  # e.g. after plateaus
        lr.set_yscale("log")
    for ax in (loss, auroc, lr):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    return fig


def history_png(history: list[dict[str, Any]]) -> bytes:
    """history_figure as PNG bytes."""
    plt = pyplot()
    fig = history_figure(history)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
