"""Calibration and operating points beside AUROC (calibration.json), without TensorFlow.

Per class: the reliability diagram's points (scikit-learn's calibration_curve, 10 equal-width
bins) and the expected calibration error (the images' share in each bin times the gap between
its mean probability and its share of positives, summed); and the operating point at 90%
specificity: the threshold chosen on the validation split (the lowest one whose validation
specificity is at least 90%, i.e. the highest sensitivity there) and the sensitivity and
specificity it gives on the evaluated split. Masked labels (mask 0) are left out of both.
"""

from __future__ import annotations

import math

import numpy as np

BINS = 10
SPECIFICITY = 0.90
CALIBRATION_FILE = "calibration.json"
THRESHOLD_SPLIT = "val"


def _known(labels: np.ndarray, probs: np.ndarray, mask: np.ndarray, k: int):
    keep = mask[:, k] > 0
    return labels[keep, k].astype(int), probs[keep, k].astype(np.float64)


def reliability(labels: np.ndarray, probs: np.ndarray, bins: int = BINS) -> dict | None:
    """One class's reliability diagram (the non-empty bins' mean probability, share of
    positives and image count) and its expected calibration error; None without images."""
    from sklearn.calibration import calibration_curve

    if len(labels) == 0:
        return None
    prob_true, prob_pred = calibration_curve(labels, probs, n_bins=bins, strategy="uniform")
    edges = np.linspace(0.0, 1.0, bins + 1)  # calibration_curve's bins, for their counts
    counts = np.bincount(np.searchsorted(edges[1:-1], probs), minlength=bins)
    counts = counts[counts > 0]
    ece = float(np.sum(counts / counts.sum() * np.abs(prob_true - prob_pred)))
    return {"ece": ece, "prob_pred": prob_pred.tolist(), "prob_true": prob_true.tolist(),
            "count": counts.tolist()}


def threshold_at_specificity(labels: np.ndarray, probs: np.ndarray,
                             specificity: float = SPECIFICITY) -> tuple[float | None, str]:
    """(the lowest threshold t with specificity >= `specificity` when p >= t is called
    positive, why there is none), from scikit-learn's roc_curve."""
    from sklearn.metrics import roc_curve

    if labels.sum() == 0 or labels.sum() == len(labels):
        return None, "no positives" if labels.sum() == 0 else "no negatives"
    fpr, _, thresholds = roc_curve(labels, probs, drop_intermediate=False)
    best = int(np.flatnonzero(fpr <= 1.0 - specificity + 1e-12)[-1])
    if not math.isfinite(thresholds[best]):
        return None, f"no threshold reaches {specificity:.0%} specificity"
    return float(thresholds[best]), ""


def rates(labels: np.ndarray, probs: np.ndarray, threshold: float) -> dict:
    """Sensitivity and specificity of p >= threshold (None where a label value is absent)."""
    called = probs >= threshold
    pos, neg = labels == 1, labels == 0
    return {"sensitivity": float(called[pos].mean()) if pos.any() else None,
            "specificity": float((~called[neg]).mean()) if neg.any() else None,
            "positives": int(pos.sum()), "negatives": int(neg.sum())}


def operating_point(k: int, split: tuple, chosen_on: tuple | None,
                    specificity: float = SPECIFICITY) -> dict:
    """Class k's threshold chosen on `chosen_on` (labels, probs, mask of the validation split;
    None when there is none) and its rates there and on `split`."""
    if chosen_on is None:
        return {"threshold": None, "note": f"no {THRESHOLD_SPLIT} split to choose it on"}
    val_labels, val_probs = _known(*chosen_on, k)
    threshold, why = threshold_at_specificity(val_labels, val_probs, specificity)
    if threshold is None:
        return {"threshold": None, "note": f"{THRESHOLD_SPLIT} split: {why}"}
    return {"threshold": threshold, THRESHOLD_SPLIT: rates(val_labels, val_probs, threshold),
            **rates(*_known(*split, k), threshold)}


def calibration_summary(classes, split_name: str, split: tuple, chosen_on: tuple | None,
                        bins: int = BINS, specificity: float = SPECIFICITY) -> dict:
    """calibration.json: per class its ECE and reliability points on the evaluated split
    (`split`: labels, probs, mask) and its operating point (threshold from `chosen_on`, the
    validation split's labels, probs and mask); the mean ECE over classes with images."""
    per_class = {}
    for k, cls in enumerate(classes):
        diagram = reliability(*_known(*split, k), bins)
        per_class[cls] = {"ece": None if diagram is None else diagram.pop("ece"),
                          "reliability": diagram,
                          "operating_point": operating_point(k, split, chosen_on, specificity)}
    eces = [d["ece"] for d in per_class.values() if d["ece"] is not None]
    return {"split": split_name, "threshold_split": THRESHOLD_SPLIT, "bins": bins,
            "specificity_target": specificity,
            "ece_mean": float(np.mean(eces)) if eces else None, "per_class": per_class}


def calibration_metrics(summary: dict) -> dict[str, float]:
    """The numbers KFP's Metrics artifact shows: ece_mean, and per class ece_CLASS,
    threshold_CLASS and sensitivity_CLASS (at the validation-chosen 90%-specificity point)."""
    out = {"ece_mean": summary.get("ece_mean")}
    for cls, d in (summary.get("per_class") or {}).items():
        point = d.get("operating_point") or {}
        out[f"ece_{cls}"] = d.get("ece")
        out[f"threshold_{cls}"] = point.get("threshold")
        out[f"sensitivity_{cls}"] = point.get("sensitivity")
    return {k: float(v) for k, v in out.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
