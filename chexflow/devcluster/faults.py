"""SIGKILL one process of a local cluster and wait until it is back: the fault table's benchmark
(chexflow.bench.cluster_faults) and the fault tests (tests/cluster/test_cluster_faults_table.py:
while an MPIJob trains; test_cluster_katib_faults.py: while a Katib Experiment with MPIJob
trials runs).

- A component process (etcd, kube-apiserver, kube-scheduler, mpi-operator, the kubelet,
  containerd): the cluster's supervisor (LocalCluster.start_supervisor) restarts it with its
  recorded arguments; back = restarted and healthy as its clients need it.
- A pod's main process (Katib's controller, db-manager, MySQL, a suggestion service), found
  through containerd (`ctr task ls`), as a crash of that process would be; the kubelet restarts
  the container; back = a new container running and the pod Ready.
"""

from __future__ import annotations

import os
import signal
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chexflow.devcluster import realnode
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.supervisor import DevClusterError, runs

# the processes the supervisor restarts, in the order the tests kill them
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "mpi-operator", "kubelet",
                 "containerd")


def _get(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as r:
            return r.status == 200
    except OSError:
        return False


def healthy(cluster: LocalCluster, name: str) -> bool:
    """The component answers again, as its clients need it (the kubelet and containerd: the
    Node Ready too)."""
    from kubernetes import client

    ports = cluster.ports
    insecure = ssl.create_default_context()  # loopback health endpoints, self-signed
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    checks = {
        "etcd": lambda: _get(f"{cluster.server}/readyz", cluster.ssl_context()),
        "kube-apiserver": lambda: _get(f"{cluster.server}/readyz", cluster.ssl_context()),
        "kube-scheduler": lambda: _get(f"https://127.0.0.1:{ports['scheduler']}/healthz",
                                       insecure),
        "mpi-operator": lambda: _get(f"http://127.0.0.1:{ports['mpi_health']}/healthz"),
        "kubelet": lambda: _get(f"http://127.0.0.1:{ports['kubelet_healthz']}/healthz"),
        "containerd": lambda: realnode.RealNode(cluster.state_dir).ctr(
            "version", check=False).returncode == 0,
    }
    if not checks[name]():
        return False
    if name in ("kubelet", "containerd"):
        try:
            conds = client.CoreV1Api(cluster.api_client()).read_node(
                realnode.NODE_NAME).status.conditions or []
        except Exception:  # noqa: BLE001 - any API error: not healthy yet
            return False
        return any(c.type == "Ready" and c.status == "True" for c in conds)
    return True


def kill_component(state: Path, name: str, timeout: float = 180) -> tuple[float, float]:
    """SIGKILL component `name`; seconds until the supervisor restarted it (same arguments),
    and until healthy."""
    old = LocalCluster.attach(state).processes[name]
    start = time.monotonic()
    os.kill(old["pid"], signal.SIGKILL)
    restarted = None
    while time.monotonic() - start < timeout:
        cluster = LocalCluster.attach(state)
        new = cluster.processes[name]
        if restarted is None and new["pid"] != old["pid"] and runs(new["pid"], new["exe"]):
            restarted = time.monotonic() - start
            if new["args"] != old["args"]:
                raise DevClusterError(f"{name} restarted with other arguments: {old['args']} "
                                      f"before, {new['args']} now")
        if restarted is not None and healthy(cluster, name):
            return restarted, time.monotonic() - start
        time.sleep(0.5)
    raise DevClusterError(f"{name} not back within {timeout:.0f} s (restarted after "
                          f"{restarted} s); see {state}/logs/{name}.log, supervisor.log")


def restarts(state: Path) -> dict[str, int]:
    """The supervisor's restart count of each component."""
    return {n: p.get("restarts", 0) for n, p in LocalCluster.attach(state).processes.items()}


def retry(fn: Callable[[], Any], timeout: float = 120) -> Any:
    """fn() once the apiserver answers again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - apiserver or etcd still coming back
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


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
