"""Installing the real Kubeflow CRDs (MPIJob v2beta1, Katib Experiment v1beta1) into the cluster.

The CRD files are the upstream ones in the shared reference folder's `crds/`
(chexflow.reference). `CHEXFLOW_CRDS_DIR` points elsewhere.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml

from chexflow.errors import ChexflowError
from chexflow.reference import ReferenceMissing, reference_dir

CRD_FILES = ("mpijobs.kubeflow.org.v2beta1.yaml", "experiments.kubeflow.org.v1beta1.yaml")


class CRDMissing(ChexflowError):
    """The CRD files were not found or not accepted by the apiserver."""


def crds_dir() -> Path:
    """The folder holding CRD_FILES."""
    override = os.environ.get("CHEXFLOW_CRDS_DIR")
    try:
        d = Path(override) if override else reference_dir() / "crds"
    except ReferenceMissing as e:
        raise CRDMissing(f"{e}, or CHEXFLOW_CRDS_DIR to the folder of the CRD files") from e
    missing = [f for f in CRD_FILES if not (d / f).is_file()]
    if missing:
        raise CRDMissing(
            f"{d}: CRD files {', '.join(missing)} not found; set CHEXFLOW_CRDS_DIR to the "
            "folder holding them"
        )
    return d


def load_crds(directory: Path | None = None) -> list[dict]:
    """The CustomResourceDefinition documents of CRD_FILES."""
    directory = directory or crds_dir()
    docs = []
    for name in CRD_FILES:
        for doc in yaml.safe_load_all((directory / name).read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    return docs


def install_crds(api_client, directory: Path | None = None, timeout: float = 60) -> list[str]:
    """Create (or replace) the CRDs and wait until each is Established; returns their names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for doc in load_crds(directory):
        name = doc["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as e:
            if e.status != 409:
                raise CRDMissing(f"CRD {name}: apiserver refused it: {e.status} {e.body}") from e
            current = ext.read_custom_resource_definition(name)
            doc["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(name, doc)
        names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise CRDMissing(f"CRD {name} not Established after {timeout:.0f} s: {conds}")
            time.sleep(0.2)
    return names
