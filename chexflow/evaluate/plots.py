"""ROC curves, one panel per class, as a PNG (matplotlib, Agg)."""

from __future__ import annotations

import math
from pathlib import Path


def plot_roc(classes, labels, probs, mask, summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    from chexflow.pathologies import CHEXNET_AUROC

    cols = 4
    rows = math.ceil(len(classes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for k, cls in enumerate(classes):
        ax = axes[k // cols][k % cols]
        keep = mask[:, k] > 0
        y, s = labels[keep, k], probs[keep, k]
        auc = summary["per_class"][cls]["auroc"]
        if auc is not None:
            fpr, tpr, _ = roc_curve(y, s)
            ax.plot(fpr, tpr, lw=1.5, label=f"AUROC {auc:.3f}")
        else:
            ax.text(0.5, 0.5, "one label value:\nno ROC", ha="center", va="center")
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color="grey")
        paper = CHEXNET_AUROC.get(cls)
        title = cls if paper is None else f"{cls} (CheXNet {paper:.3f})"
        ax.set_title(title, fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
        if auc is not None:
            ax.legend(loc="lower right", fontsize=7)
    for k in range(len(classes), rows * cols):
        axes[k // cols][k % cols].axis("off")
    mean = summary["mean"]
    fig.suptitle(
        f"ROC per class, n={len(labels)} images, mean AUROC "
        + ("n/a" if mean is None else f"{mean:.3f}")
    )
    fig.supxlabel("false positive rate")
    fig.supylabel("true positive rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


