"""Per-class AUROC (scikit-learn), nanmean over classes, and CheXNet's bootstrap 95% CI.

A class whose (unmasked) labels are all one value has no AUROC: it is nan, left out of the
mean (nanmean), and listed in skipped_classes; it is never replaced by 0. The bootstrap
resamples images with replacement (10,000 times in CheXNet's protocol) and takes the 2.5/97.5
percentiles; its AUROC is the Mann-Whitney rank statistic, which equals roc_auc_score (tested)
and is vectorised over resamples.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score


def class_auroc(labels: np.ndarray, scores: np.ndarray, mask: np.ndarray | None = None) -> float:
    """roc_auc_score over the unmasked entries; nan when they hold only one label value."""
    keep = np.ones(len(labels), bool) if mask is None else mask > 0
    y = labels[keep]
    if y.size == 0 or y.min() == y.max():
        return float("nan")
    return float(roc_auc_score(y, scores[keep]))


def per_class_auroc(labels, scores, mask=None) -> np.ndarray:
    """AUROC for each column (class); nan where a class lacks both label values."""
    mask = np.ones_like(labels) if mask is None else mask
    return np.array(
        [class_auroc(labels[:, k], scores[:, k], mask[:, k]) for k in range(labels.shape[1])]
    )


def nanmean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    if np.all(np.isnan(values)):
        return float("nan")
    return float(np.nanmean(values))


def rank_auroc(labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """AUROC of each row of (resamples, n) arrays via ranks (ties averaged); nan if one class."""
    ranks = rankdata(scores, axis=1)
    pos = labels.sum(axis=1)
    neg = labels.shape[1] - pos
    with np.errstate(invalid="ignore", divide="ignore"):
        u = (ranks * labels).sum(axis=1) - pos * (pos + 1) / 2
        return np.where((pos > 0) & (neg > 0), u / (pos * neg), np.nan)


def bootstrap_auroc(
    labels: np.ndarray,
    scores: np.ndarray,
    mask: np.ndarray | None = None,
    resamples: int = 10_000,
    seed: int = 0,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """AUROC of every class (resamples, classes) and their nanmean (resamples,)."""
    n, c = labels.shape
    mask = np.ones_like(labels) if mask is None else mask
    rng = np.random.default_rng(seed)
    out = np.full((resamples, c), np.nan)
    chunk = max(1, min(resamples, 4_000_000 // max(n, 1)))
    starts = range(0, resamples, chunk)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="bootstrap", unit="chunk")
    for start in starts:
        idx = rng.integers(0, n, (min(chunk, resamples - start), n))
        for k in range(c):
            if mask[:, k].all():
                out[start : start + len(idx), k] = rank_auroc(labels[idx, k], scores[idx, k])
            else:  # masked labels: resample images, score only their unmasked entries
                for r, row in enumerate(idx):
                    out[start + r, k] = class_auroc(labels[row, k], scores[row, k], mask[row, k])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(out, axis=1)
    return out, means


def _ci(samples: np.ndarray) -> tuple[float | None, float | None]:
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return None, None
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return float(lo), float(hi)


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 6)


def auroc_summary(
    classes, labels, scores, mask=None, resamples: int = 10_000, seed: int = 0,
    progress: bool = False,
) -> dict:
    """The content of auroc.json: per-class AUROC and CI, mean and CI, skipped classes."""
    point = per_class_auroc(labels, scores, mask)
    summary = {
        "classes": list(classes),
        "images": int(len(labels)),
        "per_class": {},
        "mean": _num(nanmean(point)),
        "ci_low": None,
        "ci_high": None,
        "skipped_classes": [c for c, a in zip(classes, point, strict=True) if math.isnan(a)],
        "bootstrap": {"resamples": int(resamples), "seed": seed, "percentiles": [2.5, 97.5]},
    }
    boot = means = None
    if resamples > 0 and len(labels):
        boot, means = bootstrap_auroc(labels, scores, mask, resamples, seed, progress)
        summary["ci_low"], summary["ci_high"] = map(_num, _ci(means))
    for k, cls in enumerate(classes):
        lo, hi = _ci(boot[:, k]) if boot is not None else (None, None)
        m = np.ones(len(labels)) if mask is None else mask[:, k]
        summary["per_class"][cls] = {
            "auroc": _num(point[k]),
            "ci_low": _num(lo),
            "ci_high": _num(hi),
            "positives": int(((labels[:, k] > 0) & (m > 0)).sum()),
            "negatives": int(((labels[:, k] == 0) & (m > 0)).sum()),
        }
    return summary
