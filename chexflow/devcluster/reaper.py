"""Stops a cluster when the process that started it dies (even by SIGKILL).

PR_SET_PDEATHSIG ends the control plane's processes with their parent, but the real node also
leaves pods, containerd shims, mounts, cgroups and a bridge, and with Katib kube-proxy's
iptables rules and its claim on the machine, which only a cleanup removes:

    python -m chexflow.devcluster.reaper STATE_DIR PARENT_PID

polls PARENT_PID; when it is gone while STATE_DIR/cluster.json still exists, it stops the
cluster recorded there. It exits by itself once the cluster is stopped normally.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def watch(state_dir: Path, parent: int, poll: float = 1.0) -> None:
    from chexflow.devcluster.controlplane import STATE_FILE, LocalCluster

    while (state_dir / STATE_FILE).exists():
        if not _alive(parent):
            LocalCluster.attach(state_dir).stop()
            return
        time.sleep(poll)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), int(sys.argv[2]))
