"""A pod's main process SIGKILLed through containerd (`ctr task ls`), as a crash of that
process would be; the kubelet restarts the container (tests/cluster/test_cluster_katib_faults.py:
Katib's controller, db-manager, MySQL, a suggestion service)."""

from __future__ import annotations

import os
import signal
import time

from chexflow.devcluster import realnode
from chexflow.devcluster.controlplane import DevClusterError


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _main_pid(node: realnode.RealNode, pod) -> tuple[str, int]:
    """The pod's first container: its containerd id and its main process's host pid."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    for line in node.ctr("task", "ls").stdout.splitlines()[1:]:
        task, pid, status = line.split()
        if task == cid and status == "RUNNING":
            return cid, int(pid)
    raise DevClusterError(f"no running task for {pod.metadata.name} ({cid})")


def kill_pod_process(core, node: realnode.RealNode, pod,
                     timeout: float = 300) -> tuple[float, float]:
    """SIGKILL the main process of the pod's first container; seconds until its container ran
    again (a new containerd task, restartCount up) and until the pod was Ready."""
    cid, pid = _main_pid(node, pod)
    before = pod.status.container_statuses[0].restart_count
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    running = None
    while time.monotonic() - start < timeout:
        pod = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        status = pod.status.container_statuses[0]
        if running is None and status.restart_count > before and status.state.running \
                and status.container_id.split("://", 1)[1] != cid:
            running = time.monotonic() - start
        if running is not None and _ready(pod):
            return running, time.monotonic() - start
        time.sleep(0.5)
    raise DevClusterError(f"pod {pod.metadata.namespace}/{pod.metadata.name} not Ready "
                          f"{timeout:.0f} s after SIGKILL (container running again after "
                          f"{running} s)")
