"""Figures of where a model looked and how well its probabilities are calibrated (matplotlib,
Agg, no TensorFlow): the Grad-CAM grid of the report, `chexflow explain`'s overlays and the
reliability diagram of every class."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from chexflow.evaluate.plots import pyplot

CAM_COLORMAP, CAM_ALPHA = "jet", 0.45


def overlay(ax, image: np.ndarray, cam: np.ndarray | None, title: str) -> None:
    """The greyscale image, with the map over it in CAM_COLORMAP when one is given."""
    ax.imshow(image.squeeze(), cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    if cam is not None:
        ax.imshow(cam, cmap=CAM_COLORMAP, alpha=CAM_ALPHA, vmin=0, vmax=1,
                  interpolation="bilinear")
    ax.set_title(title, fontsize=8)
    ax.axis("off")


def cam_grid_figure(classes, images: np.ndarray, maps: np.ndarray, probs: np.ndarray,
                    labels: np.ndarray, names: list[str], pairs_per_row: int = 4):
    """The report's grid: for each class, the test image it gave the highest probability
    (images[k], named names[k]) beside that image with the class's map over it, titled with
    the class, the probability and the image's label for the class (1, 0 or '?' if masked)."""
    plt = pyplot()
    rows = math.ceil(len(classes) / pairs_per_row)
    fig, axes = plt.subplots(rows, 2 * pairs_per_row, squeeze=False,
                             figsize=(2.0 * 2 * pairs_per_row, 2.35 * rows))
    for k, cls in enumerate(classes):
        row, col = divmod(k, pairs_per_row)
        label = "?" if np.isnan(labels[k]) else f"{labels[k]:g}"
        overlay(axes[row][2 * col], images[k], None, f"{cls}\n{names[k]}")
        overlay(axes[row][2 * col + 1], images[k], maps[k],
                f"p={probs[k]:.3f}, label {label}")
        axes[row][2 * col + 1].set_gid(f"cam-{cls}")
    for k in range(len(classes), rows * pairs_per_row):
        axes[k // pairs_per_row][2 * (k % pairs_per_row)].axis("off")
        axes[k // pairs_per_row][2 * (k % pairs_per_row) + 1].axis("off")
    fig.suptitle("Grad-CAM per class on the test image with its highest probability")
    fig.tight_layout()
    return fig


def explain_figure(name: str, image: np.ndarray, maps: np.ndarray, probs: np.ndarray,
                   classes: list[str], cols: int = 5):
    """One image and, for each of `classes`, its map over the image and its probability."""
    plt = pyplot()
    rows = math.ceil((len(classes) + 1) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(2.2 * cols, 2.4 * rows))
    flat = [ax for row in axes for ax in row]
    overlay(flat[0], image, None, name)
    for ax, cls, cam, p in zip(flat[1:], classes, maps, probs, strict=False):
        overlay(ax, image, cam, f"{cls}\np={p:.3f}")
    for ax in flat[len(classes) + 1:]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def reliability_figure(calibration: dict, cols: int = 5):
    """One panel per class: its reliability points (mean probability against share of
    positives per bin, marker area by the bin's images) over the diagonal, ECE in the title."""
    plt = pyplot()
    per_class = calibration["per_class"]
    rows = math.ceil(len(per_class) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(2.6 * cols, 2.6 * rows),
                             sharex=True, sharey=True)
    for k, (cls, d) in enumerate(per_class.items()):
        ax = axes[k // cols][k % cols]
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="grey")
        points = d.get("reliability")
        if points:
            sizes = 10 + 90 * np.asarray(points["count"]) / max(points["count"])
            ax.plot(points["prob_pred"], points["prob_true"], color="tab:blue", lw=1)
            ax.scatter(points["prob_pred"], points["prob_true"], s=sizes, color="tab:blue",
                       zorder=3, clip_on=False)
        ece = d.get("ece")
        ax.set_title(f"{cls}\nECE " + ("n/a" if ece is None else f"{ece:.3f}"), fontsize=8)
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=7)
    for k in range(len(per_class), rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.supxlabel("mean predicted probability (bin)")
    fig.supylabel("share of positives (bin)")
    mean = calibration.get("ece_mean")
    fig.suptitle(f"Reliability per class on the {calibration['split']} split, "
                 f"{calibration['bins']} bins; mean ECE "
                 + ("n/a" if mean is None else f"{mean:.3f}"))
    fig.tight_layout()
    return fig


def save(fig, path: Path, dpi: int = 100) -> Path:
    """Write the figure as PNG and close it."""
    plt = pyplot()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)
