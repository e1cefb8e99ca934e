"""Stops a cluster when the process that started it dies (even by SIGKILL), and with
`--supervise` restarts its components that exit (chexflow.devcluster.supervise).

PR_SET_PDEATHSIG ends the control plane's processes with their parent, but the real node also
leaves pods, containerd shims, mounts, cgroups and a bridge, and with Katib kube-proxy's
iptables rules and its claim on the machine, which only a cleanup removes:

    python -m chexflow.devcluster.reaper STATE_DIR PARENT_PID [--supervise] [--until-ready]

polls PARENT_PID (0: none, a detached cluster); when it is gone while STATE_DIR/cluster.json
still exists, it stops the cluster recorded there. With `--until-ready` it watches PARENT_PID
only until the cluster is ready (a detached `chexflow cluster up`, which may be killed while it
starts the components, and whose cluster then outlives it). It exits by itself once the cluster
is stopped normally.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def watch(state_dir: Path, parent: int, poll: float = 1.0, supervise: bool = False,
          until_ready: bool = False) -> None:
    from chexflow.devcluster import supervise as sv
    from chexflow.devcluster.controlplane import STATE_FILE, LocalCluster, process_alive

    if supervise:
        (state_dir / sv.SUPERVISOR_FILE).write_text(json.dumps({"pid": os.getpid(),
                                                                "parent": parent}))
    while (state_dir / STATE_FILE).exists():
        try:
            cluster = LocalCluster.attach(state_dir)
        except Exception:  # noqa: BLE001 - cluster.json removed by a stop meanwhile
            time.sleep(poll)
            continue
        if parent and until_ready and cluster.ready:
            parent = 0  # started: the cluster outlives the command that started it
            if not supervise:
                return
        if parent and not process_alive(parent):
            cluster.stop()
            return
        for name in sv.restart_dead(cluster) if supervise and cluster.ready else []:
            print(f"{time.strftime('%H:%M:%S')} restarted {name} "
                  f"(restart {cluster.processes[name]['restarts']})", flush=True)
        time.sleep(poll)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), int(sys.argv[2]), supervise="--supervise" in sys.argv[3:],
          until_ready="--until-ready" in sys.argv[3:])
