"""The local cluster's CRDs come from the mpi-operator and Katib Go modules, not from a folder
beside the checkout."""

from __future__ import annotations

import pytest
import yaml

from chexflow.devcluster import crds
from tests.support.reference import reference_dir


def test_crds_are_read_from_the_go_module_cache_and_match_upstream():
    files = crds.crd_files()
    assert [f.name for f in files] == ["kubeflow.org_mpijobs.yaml", "experiment.yaml",
                                       "trial.yaml", "suggestion.yaml"]
    assert all("/pkg/mod/github.com/kubeflow/" in str(f) for f in files)
    assert "mpi-operator@v0.8.2" in str(files[0]) and "katib@v0.19.0" in str(files[1])
    docs = {d["metadata"]["name"]: d for d in crds.load_crds(files)}
    assert set(docs) == {"mpijobs.kubeflow.org", "experiments.kubeflow.org",
                         "trials.kubeflow.org", "suggestions.kubeflow.org"}
    # the same schemas as the upstream CRDs kept as test data in the shared reference folder
    ref = reference_dir() / "crds"
    for name, stem in (("mpijobs.kubeflow.org", "mpijobs.kubeflow.org.v2beta1.yaml"),
                       ("experiments.kubeflow.org", "experiments.kubeflow.org.v1beta1.yaml")):
        want = next(d for d in yaml.safe_load_all((ref / stem).read_text()) if d)
        assert docs[name]["spec"] == want["spec"]


def test_a_module_version_the_proxy_lacks_names_the_module(monkeypatch):
    monkeypatch.setattr(crds, "KATIB_VERSION", "v0.0.1-nonexistent")
    with pytest.raises(crds.CRDMissing, match="go mod download github.com/kubeflow/katib@"
                                               "v0.0.1-nonexistent: "):
        crds.crd_files()
