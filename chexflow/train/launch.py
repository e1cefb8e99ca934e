"""The local launcher: checks, then `horovodrun -np N -H HOSTS --gloo python -m ...worker`.

The worker module is the same one an MPIJob's `mpirun` starts; this runs the command line the
jobs package builds (chexflow.jobs.local.horovodrun_command) in the trainer environment. Pure
Python: no TensorFlow here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.train.options import TrainOptions

ERROR_FILE_ENV = "CHEXFLOW_ERROR_FILE"


class LaunchError(ChexflowError):
    """The workers could not be started, or one of them failed."""


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """`host1:2,host2:4` -> [(host1, 2), (host2, 4)] (a host without :N has one slot)."""
    out = []
    for item in filter(None, (h.strip() for h in hosts.split(","))):
        name, _, slots = item.partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0":
            raise LaunchError(f"--hosts {hosts!r}: {item!r} is not HOST or HOST:SLOTS")
        out.append((name, int(slots or 1)))
    if not out:
        raise LaunchError(f"--hosts {hosts!r}: no hosts")
    return out


def local_slots() -> int:
    """Slots on this machine: its GPUs if it has any, else its CPU cores."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            gpus = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            n = sum(1 for line in gpus.stdout.splitlines() if line.startswith("GPU "))
            if n:
                return n
        except (OSError, subprocess.SubprocessError):
            pass
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def resolve_hosts(workers: int, hosts: str | None) -> str:
    """The -H value, after checking there are enough slots for `workers` processes."""
    if workers < 1:
        raise LaunchError(f"--workers {workers}: must be at least 1")
    if hosts is None:
        slots = local_slots()
        if workers > slots:
            raise LaunchError(
                f"--workers {workers}: this machine has only {slots} slots (GPUs, or CPU cores "
                f"without GPUs); lower --workers or pass --hosts with more machines"
            )
        return f"localhost:{workers}"
    total = sum(n for _, n in parse_hosts(hosts))
    if workers > total:
        raise LaunchError(
            f"--workers {workers}: --hosts {hosts} offers only {total} slots; lower --workers "
            f"or add slots (HOST:SLOTS)"
        )
    return hosts


def run_local(workers: int, hosts: str | None, options: TrainOptions) -> int:
    """Start the workers with horovodrun and wait; a worker's own error becomes ours."""
    from chexflow.envs import REPO_ROOT, trainer_python
    from chexflow.jobs.local import horovodrun_command

    cmd = horovodrun_command(options.worker_command(str(trainer_python())), workers,
                             resolve_hosts(workers, hosts))
    with tempfile.TemporaryDirectory(prefix="chexflow-train-") as tmp:
        error_file = Path(tmp) / "error.txt"
        env = {
            **os.environ,
            ERROR_FILE_ENV: str(error_file),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            ),
        }
        print("launch: " + " ".join(cmd), flush=True)
        sys.stdout.flush()
        rc = subprocess.run(cmd, env=env).returncode
        if rc != 0:
            if error_file.exists():
                raise LaunchError(error_file.read_text().strip())
            raise LaunchError(
                f"horovodrun exited {rc}: a training worker failed (its output is above)"
            )
    return 0
