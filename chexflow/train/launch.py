"""The local launcher: checks, then `horovodrun -np N -H HOSTS --mpi|--gloo python -m ...worker`
(MPI tensor operations by default where OpenMPI and Horovod's MPI build are here: the allreduce
chexflow.jobs.allreduce chooses).

The worker module is the same one an MPIJob's `mpirun` starts; this runs the command line the
jobs package builds (chexflow.jobs.local.horovodrun_command) in the trainer environment. Pure
Python: no TensorFlow here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.processes import die_with_parent
from chexflow.train.options import TrainOptions
from chexflow.train.rundir import resumable_epoch

ERROR_FILE_ENV = "CHEXFLOW_ERROR_FILE"
# horovodrun's lines: a rank's end, any line of a rank, a rank's stderr line (gloo tags a
# rank's lines [R]<stdout>:, mpirun [JOB,R]<stdout>:)
EXIT_LINE = re.compile(r"Process (\d+) exit with status code (-?\d+)\.")
RANK_LINE = re.compile(r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")
RANK_ERR_LINE = re.compile(r"\[(?:\d+,)?(\d+)\]<stderr>:(.*)")
# mpirun's (OpenMPI) report of the first failed rank: killed by a signal, or its exit code
MPI_SIGNAL_LINE = re.compile(r"mpirun noticed that process rank (\d+) .* exited on signal (\d+)")
MPI_PROCESS_LINE = re.compile(r"\s*Process name:\s*\[\[\d+,\d+\],(\d+)\]")
MPI_EXIT_CODE_LINE = re.compile(r"\s*Exit code:\s*(-?\d+)")
# the rule above and below each of OpenMPI's help messages (e.g. mpirun's report of a failed rank)
MPI_HELP_RULE = re.compile(r"-{20,}$")


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


def local_gpus() -> int:
    """The GPUs `nvidia-smi -L` lists (0 without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        gpus = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in gpus.stdout.splitlines() if line.startswith("GPU "))


def local_slots() -> int:
    """Slots on this machine: its GPUs if it has any, else its CPU cores."""
    if n := local_gpus():
        return n
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


def check_controller(controller: str | None) -> None:
    """The MPI controller needs OpenMPI's mpirun on PATH (horovodrun --mpi starts it); the
    default (None) falls back to gloo instead."""
    if controller == "mpi" and not shutil.which("mpirun"):
        raise LaunchError("--controller mpi: no mpirun on PATH; install OpenMPI (Debian: "
                          "openmpi-bin libopenmpi-dev, then rebuild Horovod with "
                          "HOROVOD_WITH_MPI=1) or use --controller gloo")


def train_with_horovodrun(workers: int, hosts: str | None, options: TrainOptions,
              env: dict[str, str] | None = None, controller: str | None = None) -> int:
    """Start the workers with horovodrun and wait: controller gloo or mpi, or by default mpi
    with MPI tensor operations on CPU (gloo, said in one line, where MPI is missing); a value
    of this process's environment or of `env` wins over those defaults. A worker's own error
    becomes ours, and a worker that died otherwise is named in one line. horovodrun gets SIGTERM
    (and ends its workers) when this process dies, however it ends."""
    from chexflow.envs import trainer_python, with_chexflow_importable
    from chexflow.jobs.allreduce import local_allreduce
    from chexflow.jobs.local import horovodrun_command, reaped

    hosts = resolve_hosts(workers, hosts)
    check_controller(controller)
    allreduce = local_allreduce(controller, trainer_python(), gpus=local_gpus())
    if allreduce.note:
        print(f"launch: {allreduce.note}", flush=True)
    cmd = horovodrun_command(options.worker_command(str(trainer_python())), workers, hosts,
                             controller=allreduce.controller)
    with tempfile.TemporaryDirectory(prefix="chexflow-train-") as tmp:
        error_file = Path(tmp) / "error.txt"
        env = with_chexflow_importable({**allreduce.env, **os.environ, **(env or {}),
                                        ERROR_FILE_ENV: str(error_file)})
        shown = [f"{k}={env[k]}" for k in allreduce.env]
        print("launch: " + " ".join([*shown, *cmd]), flush=True)
        sys.stdout.flush()
        with reaped(env) as env:  # mpirun and its ranks too, however this process ends
            rc, log = _run_horovodrun(cmd, env)
        if rc == 0:
            sys.stderr.writelines(log.mpi_help)  # a warning of a run that went well
        else:
            if error_file.exists():
                raise LaunchError(error_file.read_text().strip())
            if not log.failed_rank():  # mpirun's own message is then the only explanation
                sys.stderr.writelines(log.mpi_help)
            raise LaunchError(failure_reason(rc, log) + _resume_hint(options.out))
    return 0


@dataclass
class HorovodrunLog:
    """What a failed run's last line is made from: horovodrun's `Process N exit with status
    code C` lines (or mpirun's report) in order, each rank's last stderr line, horovodrun's own
    last line."""

    exits: list[tuple[int, int]] = field(default_factory=list)
    last_error: dict[int, str] = field(default_factory=dict)
    last_own: str = ""
    mpi_rank: int | None = None  # mpirun's `Process name:` line, before its `Exit code:`
    # OpenMPI's help messages, held back: shown only when no rank's failure explains the end
    mpi_help: list[str] = field(default_factory=list)
    in_mpi_help: bool = False

    def hold(self, line: str) -> bool:
        """Whether `line` is part of one of OpenMPI's help messages (then kept in mpi_help)."""
        rule = MPI_HELP_RULE.match(line.strip()) is not None
        if rule or self.in_mpi_help:
            self.mpi_help.append(line)
            self.in_mpi_help = self.in_mpi_help != rule
            return True
        return False

    def failed_rank(self) -> bool:
        return any(code != 0 for _, code in self.exits)

    def add(self, line: str) -> None:
        if m := EXIT_LINE.match(line):
            self.exits.append((int(m[1]), int(m[2])))
        elif m := MPI_SIGNAL_LINE.match(line):
            self.exits.append((int(m[1]), 128 + int(m[2])))
        elif m := MPI_PROCESS_LINE.match(line):
            self.mpi_rank = int(m[1])
        elif self.mpi_rank is not None and (m := MPI_EXIT_CODE_LINE.match(line)):
            self.exits.append((self.mpi_rank, int(m[1])))
            self.mpi_rank = None
        elif m := RANK_ERR_LINE.match(line):
            if m[2].strip():
                self.last_error[int(m[1])] = m[2].strip()
        elif line.strip() and not RANK_LINE.match(line):
            self.last_own = line.strip()


def failure_reason(rc: int, log: HorovodrunLog) -> str:
    """One line saying which worker failed first and how."""
    failed = [(rank, code) for rank, code in log.exits if code != 0]
    if not failed:
        return f"horovodrun exited {rc}: {log.last_own or 'no message'}"
    rank, code = failed[0]
    if code > 128 or code < 0:
        number = code - 128 if code > 128 else -code
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"worker rank {rank} was killed by {name} (exit status {code}); " \
               f"horovodrun ended the other workers"
    last = log.last_error.get(rank)
    return f"worker rank {rank} exited with status {code}" + (f": {last}" if last else "")


def _resume_hint(out: Path | None) -> str:
    """What a rerun does, where the run folder holds a checkpoint to resume from."""
    epoch = resumable_epoch(Path(out)) if out else None
    return f"; rerun the same command to resume after epoch {epoch}" if epoch else ""


def _run_horovodrun(cmd: list[str], env: dict[str, str]) -> tuple[int, HorovodrunLog]:
    """Run horovodrun, tied to this process; its lines are passed through, except its own
    Python traceback after a worker failed and OpenMPI's help messages (held in the log: the
    last line says what failed instead)."""
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, errors="replace", bufsize=1, preexec_fn=die_with_parent(signal.SIGTERM),
    )
    log = HorovodrunLog()
    lock = threading.Lock()

    def pump(stream, sink) -> None:
        own_traceback = False
        for line in stream:
            with lock:
                log.add(line)
                held = sink is sys.stderr and log.hold(line)
            own_traceback = own_traceback or line.startswith("Traceback (most recent call")
            if not own_traceback and not held:
                sink.write(line)
                sink.flush()

    threads = [threading.Thread(target=pump, args=(proc.stdout, sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, sys.stderr), daemon=True)]
    for t in threads:
        t.start()
    try:
        rc = proc.wait()
    except BaseException:  # e.g. Ctrl-C: horovodrun ends its workers before we go
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    for t in threads:
        t.join()
    return rc, log
