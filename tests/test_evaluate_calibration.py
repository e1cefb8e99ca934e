"""Calibration and operating points (calibration.json): ECE and reliability per class, the
90%-specificity threshold chosen on validation and reported on the evaluated split, the KFP
metrics made of them; and the report's section on them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.calibration import calibration_curve

from chexflow.evaluate.calibration import (
    calibration_metrics,
    calibration_summary,
    reliability,
    threshold_at_specificity,
)
from chexflow.evaluate.insight_report import insight_sections


def test_ece_is_zero_when_calibrated_and_the_gap_when_overconfident():
    calibrated_probs = np.array([0.25] * 8 + [0.75] * 8)
    calibrated_labels = np.array([1, 1, 0, 0, 0, 0, 0, 0] + [1, 1, 1, 1, 1, 1, 0, 0])
    assert reliability(calibrated_labels, calibrated_probs)["ece"] == pytest.approx(0, abs=1e-12)
    overconfident = reliability(np.array([1, 0] * 10), np.full(20, 0.95))
    assert overconfident["ece"] == pytest.approx(0.45)
    assert overconfident["count"] == [20]


def test_reliability_points_are_sklearns_and_ece_weighs_each_bin_by_its_images():
    rng = np.random.default_rng(0)
    probs = rng.random(500) ** 2
    labels = (rng.random(500) < probs ** 0.7).astype(int)
    got = reliability(labels, probs)
    true, pred = calibration_curve(labels, probs, n_bins=10)
    np.testing.assert_allclose(got["prob_true"], true)
    np.testing.assert_allclose(got["prob_pred"], pred)
    bins = np.digitize(probs, np.linspace(0, 1, 11)[1:-1], right=True)
    gaps = [abs(probs[bins == b].mean() - labels[bins == b].mean()) * (bins == b).mean()
            for b in np.unique(bins)]
    assert got["ece"] == pytest.approx(sum(gaps)) and sum(got["count"]) == 500


def test_threshold_is_the_lowest_with_90_percent_specificity():
    negatives = np.arange(20) / 100  # 0.00 .. 0.19
    positives = np.array([0.15, 0.3, 0.4, 0.5, 0.6])
    labels = np.r_[np.zeros(20), np.ones(5)].astype(int)
    threshold, why = threshold_at_specificity(labels, np.r_[negatives, positives])
    assert threshold == pytest.approx(0.18) and why == ""  # 0.18 and 0.19 called: 2 of 20
    assert threshold_at_specificity(np.zeros(5, int), np.arange(5.0)) == (None, "no positives")
    # the highest score a negative's, and fewer than ten negatives: nothing reaches 90%
    none, why = threshold_at_specificity(np.array([0, 0, 0, 1]), np.array([0.1, 0.2, 0.9, 0.5]))
    assert none is None and "90%" in why


def test_operating_point_is_chosen_on_validation_and_reported_on_the_split():
    val_probs = np.r_[np.arange(20) / 100, [0.15, 0.3, 0.4, 0.5, 0.6]][:, None]
    val_labels = np.r_[np.zeros(20), np.ones(5)][:, None]
    test_probs = np.array([0.05, 0.17, 0.2, 0.9, 0.1, 0.18, 0.5, 0.99])[:, None]
    test_labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])[:, None]
    test_mask = np.ones_like(test_labels)
    test_mask[3] = 0  # a masked negative above the threshold: left out
    summary = calibration_summary(["Mass"], "test", (test_labels, test_probs, test_mask),
                                  (val_labels, val_probs, np.ones_like(val_labels)))
    point = summary["per_class"]["Mass"]["operating_point"]
    assert point["threshold"] == pytest.approx(0.18)
    assert point["val"] == {"sensitivity": 0.8, "specificity": 0.9, "positives": 5,
                            "negatives": 20}
    assert point["sensitivity"] == 0.75 and point["specificity"] == pytest.approx(2 / 3)
    assert (point["positives"], point["negatives"]) == (4, 3)
    assert summary["threshold_split"] == "val" and summary["specificity_target"] == 0.9


def test_classes_without_a_threshold_say_why_and_stay_out_of_the_metrics():
    labels = np.array([[0, 1], [1, 0], [0, 1], [1, 0]], float)
    probs = np.array([[0.1, 0.8], [0.9, 0.3], [0.2, 0.7], [0.8, 0.1]])
    val = (np.array([[0, 1], [0, 0]], float), np.array([[0.3, 0.9], [0.2, 0.1]]),
           np.ones((2, 2)))
    summary = calibration_summary(["A", "B"], "test", (labels, probs, np.ones_like(labels)), val)
    assert summary["per_class"]["A"]["operating_point"] == {"threshold": None,
                                                            "note": "val split: no positives"}
    no_val = calibration_summary(["A", "B"], "test", (labels, probs, np.ones_like(labels)), None)
    assert "no val split" in no_val["per_class"]["B"]["operating_point"]["note"]
    metrics = calibration_metrics(json.loads(json.dumps(summary)))
    assert "threshold_A" not in metrics and "sensitivity_A" not in metrics
    assert set(metrics) == {"ece_mean", "ece_A", "ece_B", "threshold_B", "sensitivity_B"}
    assert all(isinstance(v, float) for v in metrics.values())


def test_report_section_lists_each_class_operating_point(tmp_path):
    labels = np.array([[0], [1], [0], [1]], float)
    probs = np.array([[0.1], [0.9], [0.2], [0.8]])
    summary = calibration_summary(["Hernia"], "test", (labels, probs, np.ones_like(labels)),
                                  (labels, probs, np.ones_like(labels)))
    (tmp_path / "calibration.json").write_text(json.dumps(summary))
    html = "\n".join(insight_sections(tmp_path))
    assert "Calibration and operating points" in html and "<td>Hernia</td>" in html
    assert "90% specificity on the val split" in html
    assert insight_sections(tmp_path / "nothing") == []  # an older evaluation: no section
