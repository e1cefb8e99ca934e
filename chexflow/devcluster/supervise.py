"""Keep a local cluster's processes running: a component that exits is started again with the
exe, arguments and environment recorded in cluster.json, its log goes on in
logs/<component>.log after a line saying so, and cluster.json counts its restarts.

State survives a restart because it lives on disk, not in the process: etcd's data folder,
containerd's root (images, and the shims keep the pods' containers running), the kubelet's
folder (it registers the same Node again and syncs the pods bound to it); the apiserver,
controller-manager, scheduler, kwok, mpi-operator, CoreDNS and kube-proxy keep none.

Whoever holds the cluster supervises it: `chexflow cluster up --foreground` in its loop, a
detached one (and a test's, with `LocalCluster(supervise=True)`) through
`python -m chexflow.devcluster.reaper STATE_DIR PARENT_PID --supervise`. `stop()` takes the
same lock before it stops anything, so nothing is restarted while a cluster goes down.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chexflow.devcluster.controlplane import LocalCluster

LOCK_FILE = "supervise.lock"
STOPPING_FILE = "stopping"
SUPERVISOR_FILE = "supervisor.json"


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """The state folder's supervision lock (one restart pass, or a stop, at a time)."""
    with open(Path(state_dir) / LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def dead(cluster: LocalCluster) -> list[str]:
    """The recorded components whose process has exited, in start order."""
    return [n for n in reversed(cluster._stop_order()) if not cluster.component_alive(n)]


def restart(cluster: LocalCluster, name: str, reason: str = "exited") -> None:
    """Start component `name` again as recorded (same exe, args, env); count it; log it."""
    old = cluster.processes[name]
    cluster._reap(old["pid"])
    count = old.get("restarts", 0) + 1
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(cluster.log_dir / f"{name}.log", "a") as log:
        log.write(f"\n--- chexflow {stamp}: {name} (pid {old['pid']}) {reason}; "
                  f"restart {count} ---\n")
    cluster._spawn(name, old["args"], env=old.get("env"), exe=old["exe"])
    cluster.processes[name]["restarts"] = count
    cluster.save()


def restart_dead(cluster: LocalCluster) -> list[str]:
    """One supervision pass: restart every exited component (etcd before the apiserver, ...),
    unless the cluster is being stopped. Returns the names restarted."""
    with locked(cluster.state_dir):
        if (cluster.state_dir / STOPPING_FILE).exists() or not cluster.recorded():
            return []  # a stop has begun, or ended while this pass waited for the lock
        names = dead(cluster)
        for name in names:
            restart(cluster, name)
        return names


def supervisor(state_dir: Path) -> dict | None:
    """The supervisor process recorded for this state folder ({"pid": ...}), if alive."""
    import os

    path = Path(state_dir) / SUPERVISOR_FILE
    try:
        info = json.loads(path.read_text())
        os.kill(info["pid"], 0)
        # a killed supervisor not yet reaped by its new parent is a zombie: not alive
        state = Path(f"/proc/{info['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return None if state == "Z" else info
