"""The real NIH and CheXpert metadata (shipped in the torchxrayvision wheel): split it all."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import read_json, run_chexflow

WHEEL = "torchxrayvision==1.5.7"
CACHE_ROOT = Path(os.environ.get("CHEXFLOW_CACHE", Path.home() / ".cache" / "chexflow"))
CACHE = CACHE_ROOT / "torchxrayvision"

# NIH's published label counts over 112,120 images (README_CHESTXRAY, Data_Entry_2017).
NIH_PUBLISHED = {
    "Atelectasis": 11559, "Cardiomegaly": 2776, "Effusion": 13317, "Infiltration": 19894,
    "Mass": 5782, "Nodule": 6331, "Pneumonia": 1431, "Pneumothorax": 5302,
    "Consolidation": 4667, "Edema": 2303, "Emphysema": 2516, "Fibrosis": 1686,
    "Pleural_Thickening": 3385, "Hernia": 227,
}


@pytest.fixture(scope="session")
def xrv_data(tmp_path_factory) -> Path:
    """The wheel's data folder, fetched once with `pip download --no-deps` into a cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob("torchxrayvision-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(CACHE)],
            check=True,
        )
        wheels = sorted(CACHE.glob("torchxrayvision-*.whl"))
    out = tmp_path_factory.mktemp("xrv")
    with zipfile.ZipFile(wheels[-1]) as z:
        for name in ("Data_Entry_2017_v2020.csv.gz", "chexpert_train.csv.gz"):
            (out / name).write_bytes(z.read(f"torchxrayvision/data/{name}"))
    return out


@pytest.mark.slow
def test_full_nih_metadata_splits_by_patient_with_published_counts(xrv_data, tmp_path):
    out = tmp_path / "plan"
    run_chexflow(
        "preprocess", "--plan-only", "--csv", xrv_data / "Data_Entry_2017_v2020.csv.gz",
        "--images", tmp_path / "no-images", "--out", out, "--seed", 7,
    )
    m = read_json(out / "manifest.json")
    assert m["csv_rows"] == 112_120 and m["accepted"] == 112_120 and m["rejected"] == 0
    splits = m["splits"]
    assert sum(s["images"] for s in splits.values()) == 112_120
    assert sum(s["patients"] for s in splits.values()) == 30_805
    totals = {c: sum(s["labels"][c] for s in splits.values()) for c in NIH_PUBLISHED}
    assert totals == NIH_PUBLISHED
    assert sum(s["no_positive_label"] for s in splits.values()) == 60_361
    for name, share in (("train", 0.7), ("val", 0.1), ("test", 0.2)):
        assert splits[name]["images"] / 112_120 == pytest.approx(share, abs=0.005)

    # zero patient overlap, checked from the per-image split file, not from the manifest
    by_patient: dict[str, set[str]] = {}
    with open(out / "splits.csv") as f:
        for row in csv.DictReader(f):
            by_patient.setdefault(row["patient_id"], set()).add(row["split"])
    assert len(by_patient) == 30_805
    assert all(len(s) == 1 for s in by_patient.values())
    assert m["patient_overlap"] == 0


@pytest.mark.slow
def test_nih_split_is_deterministic_for_a_seed(xrv_data, tmp_path):
    args = ["preprocess", "--plan-only", "--csv", xrv_data / "Data_Entry_2017_v2020.csv.gz",
            "--images", tmp_path, "--split", "80/10/10"]
    run_chexflow(*args, "--out", tmp_path / "a", "--seed", 3)
    run_chexflow(*args, "--out", tmp_path / "b", "--seed", 3)
    run_chexflow(*args, "--out", tmp_path / "c", "--seed", 4)
    a, b, c = ((tmp_path / d / "splits.csv").read_bytes() for d in "abc")
    assert a == b
    assert a != c


@pytest.mark.slow
def test_full_chexpert_metadata_with_uncertainty_policies(xrv_data, tmp_path):
    csv_path = xrv_data / "chexpert_train.csv.gz"
    counts = {}
    for policy in ("ones", "zeros", "ignore"):
        out = tmp_path / policy
        run_chexflow("preprocess", "--plan-only", "--format", "chexpert", "--csv", csv_path,
                     "--images", tmp_path, "--out", out, "--uncertain", policy)
        m = read_json(out / "manifest.json")
        assert m["csv_rows"] == 223_414
        assert m["accepted"] == 223_414 and m["patient_overlap"] == 0
        assert m["uncertain_policy"] == policy
        counts[policy] = {c: sum(s["labels"][c] for s in m["splits"].values())
                          for c in m["classes"]}
    # U-Ones counts every uncertain label as positive; U-Zeros and U-Ignore do not
    for c in ("Atelectasis", "Edema", "Pleural Effusion"):
        assert counts["ones"][c] > counts["zeros"][c] == counts["ignore"][c] > 0
