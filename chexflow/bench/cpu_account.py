"""Where a machine's CPU went while a benchmark phase ran: the share of all cores busy, and the
CPU seconds of this process and of each program among its descendants (a local cluster's
kube-apiserver, etcd, controllers), so a latency can be told apart from a saturated machine."""

from __future__ import annotations

import time
from collections import defaultdict

import psutil


def _descendants() -> dict[tuple[int, float], tuple[str, float]]:
    """(pid, create time) -> (program name, user + system CPU seconds) of this process's
    descendants; those that end while being read are left out."""
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                found[(proc.pid, proc.create_time())] = (proc.name(), cpu.user + cpu.system)
        except psutil.Error:
            continue
    return found


class CpuAccount:
    """A context: on exit, `result` holds the phase's wall seconds, the cores, the share of
    their time busy (all processes, from /proc/stat), this process's CPU seconds (the bench's
    own client) and its descendants' by program name. A descendant that ended within the phase
    counts only where it was seen at the start; one started within it counts from 0."""

    def __enter__(self) -> CpuAccount:
        self._wall = time.monotonic()
        self._machine = psutil.cpu_times()
        self._own = sum(psutil.Process().cpu_times()[:2])
        self._children = _descendants()
        self.result: dict = {}
        return self

    def __exit__(self, *_exc) -> None:
        wall = time.monotonic() - self._wall
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        busy_before = (sum(self._machine) - self._machine.idle
                       - getattr(self._machine, "iowait", 0.0))
        total = sum(machine) - sum(self._machine)
        programs: dict[str, float] = defaultdict(float)
        for key, (name, cpu) in _descendants().items():
            programs[name] += cpu - self._children.get(key, (name, 0.0))[1]
        self.result = {
            "wall_s": round(wall, 1),
            "cores": psutil.cpu_count(),
            "machine_busy": round((busy - busy_before) / total, 3) if total > 0 else None,
            "bench_client_cpu_s": round(sum(psutil.Process().cpu_times()[:2]) - self._own, 1),
            "programs_cpu_s": {name: round(s, 1) for name, s in
                               sorted(programs.items(), key=lambda kv: -kv[1]) if s >= 0.05},
        }
