"""The shared reference folder (upstream CRDs and Katib examples) is found from any checkout."""

from __future__ import annotations

import pytest

from chexflow.localcluster.crds import CRD_FILES, CRDMissing, crds_dir
from chexflow.reference import REFERENCE_ENV, ReferenceMissing, reference_dir


def test_reference_dir_holds_the_crds_and_katib_examples():
    ref = reference_dir()
    assert all((ref / "crds" / f).is_file() for f in CRD_FILES)
    assert (ref / "katib-examples").is_dir() and crds_dir() == ref / "crds"


def test_missing_reference_dir_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv(REFERENCE_ENV, str(tmp_path / "nowhere"))
    monkeypatch.delenv("CHEXFLOW_CRDS_DIR", raising=False)
    with pytest.raises(ReferenceMissing, match=f"{tmp_path}/nowhere; set {REFERENCE_ENV}"):
        reference_dir()
    with pytest.raises(CRDMissing, match="or CHEXFLOW_CRDS_DIR"):
        crds_dir()
    monkeypatch.setenv("CHEXFLOW_CRDS_DIR", str(tmp_path))
    with pytest.raises(CRDMissing, match=f"{tmp_path}: CRD files mpijobs"):
        crds_dir()
