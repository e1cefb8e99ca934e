"""A single-node Slurm on this machine (munged + slurmctld + slurmd), for tests and demos.

Everything lives under one folder (config, state, spool, logs, munge key and socket); the
daemons run as root on free ports and are stopped by `stop()`. Clients talk to it through
`SLURM_CONF` (see `env()`). GPU slots (`gpus`) are Slurm GRES backed by /dev/null stand-ins,
so `--gpus-per-node` is scheduled and accounted for as on a GPU node; no GPU is used.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from chexflow.ports import free_port
from chexflow.slurm.jobs import SlurmError

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing_requirements() -> str | None:
    """Why a single-node Slurm cannot start here, or None."""
    missing = [d for d in (*DAEMONS, "sbatch", "squeue", "scontrol") if shutil.which(d) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a single-node slurmd must run as root"
    return None


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie waiting to be reaped counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


class LocalSlurm:
    """Start with `start()` (or use as a context manager); `env()` is what clients need."""

    def __init__(self, root: Path, cpus: int | None = None, gpus: int = 0,
                 partition: str = "local"):
        self.root = Path(root).resolve()
        self.cpus = cpus or os.cpu_count() or 1
        self.gpus = gpus
        self.partition = partition
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge", "dev"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        ctld_port = free_port()
        slurmd_port = free_port([ctld_port])
        gres = ""
        if self.gpus:
            for i in range(self.gpus):
                dev = r / "dev" / f"nvidia{i}"
                if not dev.exists():
                    dev.symlink_to("/dev/null")
            (r / "gres.conf").write_text(
                f"NodeName={self.host} Name=gpu File={r}/dev/nvidia[0-{self.gpus - 1}]\n"
            )
            gres = f" Gres=gpu:{self.gpus}"
        self.conf.write_text("\n".join([
            "# A single-node Slurm written by chexflow's tests (tests/support/slurm.py)",
            "ClusterName=chexflow-local",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            # no cgroups in a container: track processes by /proc, no task binding
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            "MinJobAge=3600",
            "SchedulerParameters=sched_interval=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            *(["GresTypes=gpu"] if self.gpus else []),
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus}{gres} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start(self, timeout: float = 60) -> LocalSlurm:
        why = missing_requirements()
        if why:
            raise SlurmError(f"cannot start a single-node Slurm: {why}")
        self._write_config()
        r = self.root
        env = {**os.environ, **self.env()}
        commands = [
            ["munged", "--force", f"--key-file={r}/munge/munge.key",
             f"--socket={self.munge_socket}", f"--pid-file={r}/munge/munged.pid",
             f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"],
            ["slurmctld", "-f", str(self.conf), "-i"],
            ["slurmd", "-f", str(self.conf)],
        ]
        for argv in commands:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                self.stop()
                raise SlurmError(
                    f"{argv[0]} did not start ({proc.stderr.strip()}); logs in {r}/log"
                )
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            proc = subprocess.run(
                ["sinfo", "--noheader", "--Node", "--format", "%T"],
                capture_output=True, text=True, env=env,
            )
            state = proc.stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.5)
        self.stop()
        raise SlurmError(f"single-node Slurm not ready after {timeout:g} s (state {state!r}); "
                         f"logs in {r}/log")

    def _pids(self) -> list[tuple[str, int]]:
        files = [("slurmd", self.root / "slurmd.pid"), ("slurmctld", self.root / "slurmctld.pid"),
                 ("munged", self.root / "munge" / "munged.pid")]
        pids = []
        for name, f in files:
            try:
                pids.append((name, int(f.read_text().split()[0])))
            except (FileNotFoundError, ValueError, IndexError):
                continue
        return pids

    def stop(self, timeout: float = 10) -> None:
        """Cancel this cluster's jobs, then stop the daemons it started (by their pid files)."""
        env = {**os.environ, **self.env()}
        if self.conf.exists() and shutil.which("scancel"):
            queued = subprocess.run(["squeue", "--noheader", "--format", "%i"],
                                    capture_output=True, text=True, env=env).stdout.split()
            if queued:
                subprocess.run(["scancel", *queued], capture_output=True, env=env)
                time.sleep(1)
        for _name, pid in self._pids():
            if not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
