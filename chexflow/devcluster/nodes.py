"""Simulated GPU nodes: Node objects that kwok manages (heartbeats, pod lifecycles).

kwok manages the nodes annotated `kwok.x-k8s.io/node: fake`; their capacity, including
`nvidia.com/gpu`, is what the scheduler sees. No taint: every node here is a kwok node, so
pods need no kwok-specific toleration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from chexflow.errors import ChexflowError

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"
NODE_LABELS = {"type": "kwok", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
# Where each kwok node sits, as a data centre's racks and blocks (Kueue's topology-aware
# scheduling reads them): node i is in rack i // RACK_NODES and block i // BLOCK_NODES.
BLOCK_LABEL, RACK_LABEL = "chexflow.dev/topology-block", "chexflow.dev/topology-rack"
RACK_NODES, BLOCK_NODES = 8, 64
# Pod labels understood by chexflow/cluster/kwok-stages.yaml.
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
HOLD_LABEL = "chexflow.io/kwok-hold"
# Container environment variable: "fail" or "hold" for Job pods (the MPIJob launcher).
OUTCOME_ENV = "CHEXFLOW_KWOK_OUTCOME"


class NodesNotReady(ChexflowError):
    """kwok did not make the nodes Ready in time."""


def topology_labels(index: int) -> dict[str, str]:
    """The rack and block labels of the index-th node."""
    return {BLOCK_LABEL: f"block-{index // BLOCK_NODES}", RACK_LABEL: f"rack-{index // RACK_NODES}"}


def gpu_node(name: str, gpus: int = 8, cpu: str = "96", memory: str = "1024Gi",
             pods: int = 110, topology: dict[str, str] | None = None) -> dict:
    """A Node manifest kwok adopts, with `gpus` nvidia.com/gpu (and `topology` labels)."""
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
            "labels": {**NODE_LABELS, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/role": "agent",
                       **(topology or {})},
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def create_gpu_nodes(api_client, count: int, gpus: int = 8, prefix: str = "kwok-gpu-",
                     workers: int = 8) -> list[str]:
    """Create `count` GPU nodes (skipping existing ones); returns their names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api_client)
    names = [f"{prefix}{i}" for i in range(count)]

    def create(index: int) -> None:
        try:
            core.create_node(gpu_node(names[index], gpus, topology=topology_labels(index)))
        except ApiException as e:
            if e.status != 409:
                raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, range(count)))
    return names


def wait_nodes_ready(api_client, names: list[str], timeout: float = 120,
                     check: Callable[[], None] | None = None) -> None:
    """Block until every named node reports Ready=True (kwok's node-initialize stage); `check`
    runs between polls (it raises when a component it watches has exited)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    wanted = set(names)
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        ready = {
            n.metadata.name for n in core.list_node(label_selector="type=kwok").items
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        }
        if wanted <= ready:
            return
        if time.monotonic() > deadline:
            raise NodesNotReady(
                f"{len(wanted - ready)} of {len(wanted)} kwok nodes not Ready after {timeout:.0f} s"
                f" (e.g. {sorted(wanted - ready)[:3]}): is kwok running? see its log"
            )
        time.sleep(0.5)
