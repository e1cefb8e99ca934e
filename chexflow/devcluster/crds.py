"""Installing the real Kubeflow CRDs (MPIJob v2beta1, Katib Experiment v1beta1) into the cluster.

The CRDs come from the manifests inside their projects' Go modules, as the module proxy serves
them: mpi-operator at the version build/go.mod pins (`manifests/base/kubeflow.org_mpijobs.yaml`)
and Katib v0.19.0 (`manifests/v1beta1/components/crd/{experiment,trial,suggestion}.yaml`: the
Experiment and the Trials and Suggestion its controller creates). `go mod download`
fetches each module once into the Go module cache; later starts read it from there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import yaml

from chexflow.devcluster.binaries import GO_DIR
from chexflow.errors import ChexflowError

MPI_OPERATOR_MODULE = "github.com/kubeflow/mpi-operator"
KATIB_MODULE = "github.com/kubeflow/katib"
KATIB_VERSION = "v0.19.0"
# module -> CRD manifests inside it
CRD_MANIFESTS = {
    MPI_OPERATOR_MODULE: ("manifests/base/kubeflow.org_mpijobs.yaml",),
    KATIB_MODULE: tuple(f"manifests/v1beta1/components/crd/{kind}.yaml"
                        for kind in ("experiment", "trial", "suggestion")),
}
GO = "/usr/local/go/bin/go"
# The checksum database does not list Katib's module; the module proxy serves it.
GONOSUMDB = "github.com/kubeflow,github.com/google/go-containerregistry"


class CRDMissing(ChexflowError):
    """The CRD manifests were not found or not accepted by the apiserver."""


def module_versions() -> dict[str, str]:
    """module -> version: mpi-operator's from build/go.mod, Katib's pinned here."""
    m = re.search(rf"^\s*{re.escape(MPI_OPERATOR_MODULE)} (v\S+)",
                  (GO_DIR / "go.mod").read_text(), re.M)
    if not m:
        raise CRDMissing(f"{GO_DIR / 'go.mod'}: no `{MPI_OPERATOR_MODULE} vX.Y.Z` requirement")
    return {MPI_OPERATOR_MODULE: m.group(1), KATIB_MODULE: KATIB_VERSION}


def module_dir(module: str, version: str) -> Path:
    """The module's folder in the Go module cache (`go mod download`, cached after the first)."""
    go = GO if os.access(GO, os.X_OK) else "go"
    env = {**os.environ, "GOFLAGS": "", "GONOSUMDB": GONOSUMDB}
    try:
        proc = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"],
                              capture_output=True, text=True, env=env, cwd="/")
    except FileNotFoundError as e:
        raise CRDMissing(f"{module}@{version}: Go not found ({GO}) to fetch its CRDs") from e
    info = json.loads(proc.stdout or "{}")
    if proc.returncode != 0 or not info.get("Dir"):
        raise CRDMissing(f"go mod download {module}@{version}: "
                         f"{info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])


def crd_files() -> list[Path]:
    """The CRD manifests, from the Go modules."""
    files = []
    for module, version in module_versions().items():
        for manifest in CRD_MANIFESTS[module]:
            path = module_dir(module, version) / manifest
            if not path.is_file():
                raise CRDMissing(f"{module}@{version}: no {manifest} in the module")
            files.append(path)
    return files


def load_crds(files: list[Path] | None = None) -> list[dict]:
    """The CustomResourceDefinition documents of the CRD manifests."""
    docs = []
    for path in files or crd_files():
        # libyaml's loader when present: the MPIJob CRD is large
        for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                                   yaml.SafeLoader)):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    return docs


def install_crds(api_client, files: list[Path] | None = None, timeout: float = 60) -> list[str]:
    """Create (or replace) the CRDs and wait until each is Established; returns their names."""
    return install_crd_docs(api_client, load_crds(files), timeout)


def install_crd_docs(api_client, docs: list[dict], timeout: float = 60) -> list[str]:
    """Create (or replace) these CRD documents and wait until each is Established."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for doc in docs:
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


def apply_webhook_configurations(api_client, docs: list[dict],
                                 error: type[ChexflowError]) -> None:
    """Create (or replace) Mutating/ValidatingWebhookConfigurations; a refusal is `error`."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    adm = client.AdmissionregistrationV1Api(api_client)
    for doc in docs:
        create, read, replace = ((adm.create_mutating_webhook_configuration,
                                  adm.read_mutating_webhook_configuration,
                                  adm.replace_mutating_webhook_configuration)
                                 if doc["kind"] == "MutatingWebhookConfiguration" else
                                 (adm.create_validating_webhook_configuration,
                                  adm.read_validating_webhook_configuration,
                                  adm.replace_validating_webhook_configuration))
        name = doc["metadata"]["name"]
        try:
            create(doc)
        except ApiException as e:
            if e.status != 409:
                raise error(f"{doc['kind']} {name}: {e.status} {e.reason}") from None
            # there from before (a resumed cluster): a replace names the version it replaces
            doc = {**doc, "metadata": {**doc["metadata"],
                                       "resourceVersion": read(name).metadata.resource_version}}
            replace(name, doc)
