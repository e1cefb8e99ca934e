"""The shared reference folder (upstream CRDs and Katib examples, test data) is found from any
checkout."""

from __future__ import annotations

import pytest

from tests.support.reference import REFERENCE_ENV, ReferenceMissing, reference_dir


def test_reference_dir_holds_the_crds_and_katib_examples():
    ref = reference_dir()
    crds = ("mpijobs.kubeflow.org.v2beta1.yaml", "experiments.kubeflow.org.v1beta1.yaml")
    assert all((ref / "crds" / f).is_file() for f in crds)
    assert (ref / "katib-examples").is_dir()


def test_missing_reference_dir_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv(REFERENCE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ReferenceMissing, match=f"{tmp_path}/nowhere; set {REFERENCE_ENV}"):
        reference_dir()
