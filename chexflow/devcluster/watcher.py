"""The watcher of a local cluster (supervisor.start_watcher starts it, detached):

    python -m chexflow.devcluster.watcher STATE_DIR PARENT_PID [--supervise] [--until-ready]

polls PARENT_PID (0: none, a detached cluster); when it is gone while STATE_DIR/cluster.json
still exists, it stops the cluster recorded there, the add-ons' cleanup included (the real
node's pods, mounts, cgroups and bridge; kube-proxy's rules and its claim on the machine), which
PR_SET_PDEATHSIG alone would leave behind. With `--until-ready` it watches PARENT_PID only until
the cluster is ready (a detached `chexflow cluster up`, which may be killed while it starts the
components, and whose cluster then outlives it). With `--supervise` it restarts the components
that exit once the cluster is ready (Supervisor.restart_dead) and records itself in
supervisor.json. It exits by itself once the cluster is stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.supervisor import STATE_FILE, WATCHER_FILE, process_alive


def watch(state_dir: Path, parent: int, poll: float = 1.0, supervise: bool = False,
          until_ready: bool = False) -> None:
    if supervise:
        (state_dir / WATCHER_FILE).write_text(json.dumps({"pid": os.getpid(), "parent": parent}))
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
        for name in cluster.supervisor.restart_dead() if supervise and cluster.ready else []:
            print(f"{time.strftime('%H:%M:%S')} restarted {name} "
                  f"(restart {cluster.processes[name]['restarts']})", flush=True)
        time.sleep(poll)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), int(sys.argv[2]), supervise="--supervise" in sys.argv[3:],
          until_ready="--until-ready" in sys.argv[3:])
