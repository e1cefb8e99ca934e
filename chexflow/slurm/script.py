"""Rendering the sbatch script for a Horovod training run (one Slurm task = one Horovod rank)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from chexflow import __version__
from chexflow.errors import ChexflowError
from chexflow.jobs.allreduce import cpu_env
from chexflow.train.options import TrainOptions

LAUNCHERS = ("srun", "mpirun")
# Header lines `chexflow slurm submit` reads back from a rendered script.
METRICS_TAG = "# chexflow-metrics: "
LOG_TAG = "# chexflow-log: "
_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SlurmScriptError(ChexflowError):
    """Options that do not make a runnable sbatch script."""


@dataclass
class TrainingRun:
    """What to train: the worker's options (their `out` is set by render) and extra options
    passed verbatim."""

    options: TrainOptions
    extra_args: list[str] = field(default_factory=list)

    def worker_command(self, python: str, out: Path) -> list[str]:
        """`PYTHON -m chexflow.train.worker OPTIONS --out OUT EXTRA_ARGS`."""
        options = dataclasses.replace(self.options, out=out)
        return options.worker_command(python) + list(self.extra_args)


@dataclass
class SlurmJob:
    """Where and how Slurm runs it."""

    nodes: int = 1
    gpus_per_node: int = 1
    tasks_per_node: int | None = None  # default: one per GPU (1 on a CPU-only node)
    cpus_per_task: int | None = None
    time: str = "01:00:00"
    job_name: str = "chexflow-train"
    partition: str | None = None
    account: str | None = None
    launcher: str = "srun"
    mpi: str = "pmix"
    container: Path | None = None
    binds: list[str] = field(default_factory=list)
    python: str = "python"  # outside a container: the trainer environment's interpreter
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ntasks_per_node(self) -> int:
        return self.tasks_per_node or max(self.gpus_per_node, 1)

    def check(self) -> None:
        for name in ("nodes", "tasks_per_node", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SlurmScriptError(f"--{name.replace('_', '-')} {value}: must be at least 1")
        if self.gpus_per_node < 0:
            raise SlurmScriptError(f"--gpus-per-node {self.gpus_per_node}: must be 0 or more")
        if self.gpus_per_node and self.tasks_per_node and self.tasks_per_node != self.gpus_per_node:
            raise SlurmScriptError(
                f"--tasks-per-node {self.tasks_per_node} with --gpus-per-node "
                f"{self.gpus_per_node}: Horovod runs one task per GPU (leave --tasks-per-node out)"
            )
        if not _TIME.match(self.time):
            raise SlurmScriptError(
                f"--time {self.time!r}: expected Slurm's [days-]hours:minutes:seconds or minutes"
            )
        if self.launcher not in LAUNCHERS:
            raise SlurmScriptError(f"--launcher {self.launcher!r}: expected one of {LAUNCHERS}")
        for key in self.env:
            if not _ENV_NAME.match(key):
                raise SlurmScriptError(f"--env {key}=...: {key!r} is not a variable name")


def render(run: TrainingRun, job: SlurmJob, run_dir: Path) -> str:
    """The sbatch script. Paths are made absolute: the job starts on another node."""
    job.check()
    run_dir = run_dir.resolve()
    train_out = run_dir / "train"
    log = run_dir / "slurm-%j.out"
    ranks = job.nodes * job.ntasks_per_node
    q = shlex.quote
    # CPU-only nodes: MPI tensor operations, yielding while idle (chexflow.jobs.allreduce);
    # GPU ranks keep NCCL. The user's --env wins.
    env = {**cpu_env(job.gpus_per_node), **job.env}

    sbatch = {
        "job-name": job.job_name,
        "nodes": job.nodes,
        "ntasks-per-node": job.ntasks_per_node,
        "gpus-per-node": job.gpus_per_node or None,
        "cpus-per-task": job.cpus_per_task,
        "time": job.time,
        "partition": job.partition,
        "account": job.account,
        "output": log,
    }
    lines = [
        "#!/bin/bash",
        f"# chexflow Horovod training on Slurm: {ranks} ranks = {job.nodes} node(s) x "
        f"{job.ntasks_per_node} task(s), one task per GPU"
        + (f", inside {job.container}" if job.container else "") + ".",
        f"# Rendered by `chexflow slurm render` (chexflow {__version__}).",
        "# Run it with `chexflow slurm submit THIS_FILE` (or plain sbatch).",
        f"{METRICS_TAG}{train_out / 'metrics.json'}",
        f"{LOG_TAG}{log}",
        *(f"#SBATCH --{k}={v}" for k, v in sbatch.items() if v is not None),
        "",
        "set -euo pipefail",
        "export PYTHONUNBUFFERED=1",
        *(f"export {k}={q(v)}" for k, v in sorted(env.items())),
    ]
    command: list[str] = []
    if job.launcher == "srun":
        # srun starts every rank itself and wires MPI up through PMIx: no ssh, no hostfile.
        command += ["srun", f"--mpi={job.mpi}", "--kill-on-bad-exit=1"]
    else:
        # mpirun inside the allocation: Open MPI reads the node list from Slurm.
        lines += [
            'if [ "$(id -u)" = 0 ]; then',
            "  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
            "fi",
        ]
        exported = ["PYTHONUNBUFFERED", *sorted(env)]
        command += ["mpirun", "-np", "${SLURM_NTASKS}", "--bind-to", "none", "--map-by", "slot"]
        for name in exported:
            command += ["-x", name]
    if job.container:
        data = run.options.data
        binds = ",".join(dict.fromkeys(
            [*([str(data.resolve())] if data else []), str(run_dir), *job.binds]))
        command += ["apptainer", "exec", "--nv", "--bind", binds, str(job.container)]
    command += run.worker_command("python" if job.container else job.python, train_out)

    def word(w: str) -> str:
        return w if w == "${SLURM_NTASKS}" else q(w)

    lines += [
        f"mkdir -p {q(str(train_out))}",
        'echo "chexflow: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}:'
        ' ${SLURM_NTASKS} Horovod ranks"',
        " \\\n    ".join(_wrap([word(w) for w in command])),
        "",
    ]
    return "\n".join(lines)


def _wrap(words: list[str], width: int = 88) -> list[str]:
    """Group words into continuation lines of about `width` characters, at option boundaries."""
    out: list[str] = []
    line = ""
    for w in words:
        starts_option = w.startswith("-") and line
        if line and (len(line) + 1 + len(w) > width) and (starts_option or len(line) > width):
            out.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    if line:
        out.append(line)
    return out


def read_tag(script: str, tag: str) -> str | None:
    """The value of a `# chexflow-...: VALUE` header line of a rendered script."""
    for line in script.splitlines():
        if line.startswith(tag):
            return line[len(tag):].strip()
    return None
