"""Fixtures for tests against the local Kubernetes control plane (marker `cluster`).

`k8s_cluster` (session): etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
(4 nodes x 8 nvidia.com/gpu) and mpi-operator, with the MPIJob and Experiment CRDs, and a real
node (containerd, kubelet, CoreDNS; tainted, so only pods that ask for it land there). The
binaries come from ~/.cache/chexflow/k8s/, built by build/build.sh and build/build-node.sh on
first use (cold: about 6 + 4 minutes on 2 idle cores). `k8s_namespace`: a fresh namespace per
test, deleted afterwards.
`KUBECONFIG` points at the cluster's admin kubeconfig while the session runs.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest

from chexflow.localcluster import binaries
from chexflow.localcluster.controlplane import LocalCluster

NODES = 4
GPUS_PER_NODE = 8


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    go_path = "/usr/local/go/bin:" + os.environ.get("PATH", "")
    if binaries.missing(binaries.cache_dir()) and shutil.which("go", path=go_path) is None:
        pytest.skip("no Kubernetes binaries cached and no Go toolchain to build them")
    cluster = LocalCluster(tmp_path_factory.mktemp("k8s"), nodes=NODES,
                           gpus_per_node=GPUS_PER_NODE, die_with_parent=True, real_node=True)
    cluster.start(timeout=240)
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


@pytest.fixture(scope="session")
def k8s_api(k8s_cluster: LocalCluster):
    """kubernetes.client.ApiClient as the cluster admin."""
    return k8s_cluster.api_client()


@pytest.fixture
def k8s_namespace(k8s_api, request) -> Iterator[str]:
    """A namespace of its own for one test (deleted afterwards, with everything in it)."""
    from kubernetes import client

    name = f"t-{request.node.name.lower().replace('_', '-')[:40].strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(c for c in name if c.isalnum() or c == "-")
    core = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
