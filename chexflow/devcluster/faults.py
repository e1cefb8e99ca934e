"""SIGKILL one process of a local cluster and wait until it is back: the fault table's benchmark
(chexflow.bench.cluster_faults) and the fault tests (tests/cluster/test_cluster_faults_table.py:
while an MPIJob trains; test_cluster_katib_faults.py: while a Katib Experiment with MPIJob
trials runs, which also kills pods' processes: tests/support/pod_faults.py).

A component process (etcd, kube-apiserver, kube-scheduler, mpi-operator, the kubelet,
containerd): the cluster's supervisor restarts it with its recorded arguments; back = restarted
and healthy as its clients need it.
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
