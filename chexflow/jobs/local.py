"""The local backend: a job is a subprocess in its environment; N Horovod ranks run under
`horovodrun` on localhost (MPI tensor operations where OpenMPI and Horovod's MPI build are here,
else gloo: chexflow.jobs.allreduce). Output is streamed with a `[job]` prefix, the exit status is
checked, the time limit is honoured and the whole process group is ended on interruption."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

from chexflow.envs import (
    REPO_ROOT,
    in_trainer_env,
    trainer_python,
    with_chexflow_importable,
)
from chexflow.jobs.allreduce import Allreduce, local_allreduce
from chexflow.jobs.result import JobResult
from chexflow.jobs.spec import JobFailed, JobSpec, JobTimeout
from chexflow.processes import die_with_parent, end_reaper, start_reaper

TAIL_LINES = 60
KILL_GRACE_SECONDS = 10
# marks every process of one local horovodrun launch, for its reaper (`reaped`)
REAP_ENV = "CHEXFLOW_HOROVODRUN"


def environment_python(environment: str) -> Path:
    """The interpreter of the "trainer" or "control" environment."""
    if environment == "trainer":
        return trainer_python()
    if not in_trainer_env():
        return Path(sys.executable)
    return REPO_ROOT / ".venv" / "bin" / "python"


def resolve_command(spec: JobSpec) -> list[str]:
    """argv with `python`/`chexflow` bound to the job's environment."""
    python = environment_python(spec.environment)
    head, rest = spec.command[0], list(spec.command[1:])
    if head in ("python", "python3"):
        return [str(python), *rest]
    if head == "chexflow":
        return [str(python), "-m", "chexflow.cli", *rest]
    return [head, *rest]


def horovodrun_command(program: list[str], processes: int, hosts: str | None = None,
                       horovodrun: list[str] | None = None,
                       controller: str = "gloo") -> list[str]:
    """`horovodrun -np N -H HOSTS --gloo PROGRAM...`: N ranks over gloo, or mpirun with
    controller "mpi" (HOSTS default localhost:N); horovodrun is the trainer environment's
    without its build checks (quick_horovodrun) unless given as an argv."""
    return [*(horovodrun or quick_horovodrun()), "-np", str(processes),
            "-H", hosts or f"localhost:{processes}", f"--{controller}", *program]


def quick_horovodrun() -> list[str]:
    """horovodrun of the trainer environment without its TensorFlow-importing build checks
    (chexflow.jobs.horovodrun; chexflow must be importable there)."""
    return [str(trainer_python()), "-m", "chexflow.jobs.horovodrun"]


@contextlib.contextmanager
def reaped(env: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """`env` with a mark that a reaper process looks for: when this block ends, or this process
    dies however it dies, every process still carrying the mark is stopped. `horovodrun --mpi`
    becomes `sh -c "mpirun ..."`, and only the shell would get the SIGTERM of die_with_parent:
    mpirun and its ranks would train on."""
    marker = uuid.uuid4().hex
    reaper = start_reaper(REAP_ENV, marker)
    try:
        yield {**env, REAP_ENV: marker}
    finally:
        end_reaper(reaper)


def horovod_allreduce(spec: JobSpec) -> Allreduce | None:
    """The allreduce of a job's Horovod ranks (the launch default); None for one process."""
    if not spec.horovod or spec.processes == 1:
        return None
    return local_allreduce(None, trainer_python(), gpus=spec.gpus_per_worker)


def local_argv(spec: JobSpec, allreduce: Allreduce | None = None) -> list[str]:
    """The full argv: the command itself, or horovodrun around it for several ranks."""
    argv = resolve_command(spec)
    allreduce = allreduce or horovod_allreduce(spec)
    if allreduce is None:
        return argv
    return horovodrun_command(argv, spec.processes, controller=allreduce.controller)


def job_environment(spec: JobSpec, allreduce: Allreduce | None = None) -> dict[str, str]:
    """This process's environment and the job's, over the allreduce's defaults."""
    env = with_chexflow_importable({**(allreduce.env if allreduce else {}), **os.environ})
    env["PYTHONUNBUFFERED"] = "1"
    env["CHEXFLOW_JOB_NAME"] = spec.name
    env.update(spec.env)
    return env


class LocalBackend:
    """Runs JobSpecs as local processes."""

    name = "local"

    def __init__(self, stream: TextIO | None = None, log_dir: Path | None = None):
        self.stream = stream
        self.log_dir = Path(log_dir) if log_dir else None

    def run(self, spec: JobSpec) -> JobResult:
        allreduce = horovod_allreduce(spec)
        argv = local_argv(spec, allreduce)
        out = self.stream or sys.stdout
        log_file = None
        log_path = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{spec.name}.log"
            log_file = open(log_path, "w")  # noqa: SIM115 - closed in finally
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        if allreduce and allreduce.note:
            print(f"[{spec.name}] {allreduce.note}", file=out, flush=True)
        env = job_environment(spec, allreduce)
        shown = [f"{k}={env[k]}" for k in (allreduce.env if allreduce else {})]
        print(f"[{spec.name}] $ {' '.join([*shown, *argv])}", file=out, flush=True)
        start = time.monotonic()
        with reaped(env) if allreduce else contextlib.nullcontext(env) as env:
            code = self._wait(spec, argv, env, out, log_file, tail, start)
        wall = time.monotonic() - start
        if code != 0:
            raise JobFailed(
                f"job {spec.name}: exited with status {code} after {wall:.0f}s",
                "\n".join(tail),
                exit_code=code,
            )
        return JobResult(
            name=spec.name,
            backend=self.name,
            succeeded=True,
            wall_seconds=wall,
            log_tail="\n".join(tail),
            log_path=str(log_path) if log_path else None,
        )

    def _wait(self, spec: JobSpec, argv: list[str], env: dict[str, str], out: TextIO,
              log_file, tail: collections.deque[str], start: float) -> int:
        """Run the job's process group to its end, its lines passed on; its exit status."""
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            env=env,
            cwd=spec.working_dir,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # a killed caller leaves no job running
        )
        reader = threading.Thread(
            target=_pump, args=(proc, spec.name, out, log_file, tail), daemon=True
        )
        reader.start()
        try:
            code = proc.wait(timeout=spec.timeout_seconds)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            reader.join(timeout=5)
            elapsed = time.monotonic() - start
            raise JobTimeout(
                f"job {spec.name}: timed out after {elapsed:.0f}s "
                f"(limit {spec.timeout_seconds}s); its processes were ended",
                "\n".join(tail),
            ) from None
        except BaseException:
            _end_group(proc)
            raise
        finally:
            reader.join(timeout=5)
            if log_file:
                log_file.close()
        return code


def _pump(proc: subprocess.Popen, name: str, out: TextIO, log_file, tail) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        print(f"[{name}] {line}", file=out, flush=True)
        if log_file:
            log_file.write(line + "\n")


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after a grace period."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
