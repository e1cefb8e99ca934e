"""`chexflow slurm render` and `chexflow slurm submit`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from chexflow.train.options import TrainOptions, add_train_arguments


def register(sub: argparse._SubParsersAction) -> None:
    slurm = sub.add_parser(
        "slurm", help="run the Horovod training job on a Slurm cluster (bare metal or Apptainer)"
    )
    slurm_sub = slurm.add_subparsers(dest="slurm_command", required=True, metavar="SUBCOMMAND")

    r = slurm_sub.add_parser(
        "render",
        help="write an sbatch script: srun/mpirun, one Horovod task per GPU",
        description="Write RUN/job.sbatch. Training writes RUN/train/ (metrics.json); Slurm's "
        "log goes to RUN/slurm-JOBID.out.",
    )
    r.add_argument("--out", type=Path, required=True, help="run folder on the shared filesystem")
    r.add_argument("--script", type=Path, help="where to write the script (default RUN/job.sbatch)")
    r.add_argument("--overwrite", action="store_true", help="replace an existing script")
    g = r.add_argument_group("training (python -m chexflow.train.worker)")
    g.add_argument(
        "--data", type=Path, required=True, help="folder written by `chexflow preprocess`"
    )
    add_train_arguments(g, launcher=False, skip=("data", "out"))
    g.add_argument(
        "--worker-arg", action="append", default=[], metavar="ARG",
        help="one more worker option, verbatim (repeat: --worker-arg=--amp --worker-arg=--xla)",
    )
    s = r.add_argument_group("Slurm")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=1, help="0 for CPU-only nodes")
    s.add_argument(
        "--tasks-per-node", type=int, help="default: one per GPU (needed only with 0 GPUs)"
    )
    s.add_argument("--cpus-per-task", type=int)
    s.add_argument("--time", default="01:00:00", help="time limit, [days-]hh:mm:ss")
    s.add_argument("--job-name", default="chexflow-train")
    s.add_argument("--partition")
    s.add_argument("--account")
    s.add_argument(
        "--launcher", choices=("srun", "mpirun"), default="srun",
        help="srun starts the ranks through PMIx; mpirun uses Open MPI's Slurm support",
    )
    s.add_argument("--mpi", default="pmix", help="srun --mpi plugin (pmix, pmi2)")
    s.add_argument(
        "--container", type=Path,
        help="Apptainer image (.sif, from images/trainer/apptainer.def): apptainer exec --nv",
    )
    s.add_argument(
        "--bind", action="append", default=[], help="extra apptainer bind (SRC[:DST]); repeat"
    )
    s.add_argument(
        "--python", help="trainer interpreter on the nodes, without --container "
        "(default: this machine's trainer environment)",
    )
    s.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="environment for every task, e.g. NCCL_DEBUG=INFO; repeat",
    )
    r.set_defaults(func=run_render)

    sb = slurm_sub.add_parser(
        "submit", help="sbatch a rendered script, wait, report its state and training metrics"
    )
    sb.add_argument("script", type=Path, help="a script written by `chexflow slurm render`")
    sb.add_argument("--no-wait", action="store_true", help="submit and return the job id")
    sb.add_argument("--poll", type=float, default=5.0, help="seconds between squeue polls")
    sb.add_argument("--timeout", type=float, help="stop waiting after this many seconds")
    sb.add_argument(
        "--sbatch-arg", action="append", default=[], metavar="ARG",
        help="extra sbatch option, e.g. --sbatch-arg=--qos=high; repeat",
    )
    sb.set_defaults(func=run_submit)


def _env_pairs(items: list[str]) -> dict[str, str]:
    from chexflow.slurm.script import SlurmScriptError

    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SlurmScriptError(f"--env {item!r}: expected NAME=VALUE")
        env[key] = value
    return env


def run_render(args: argparse.Namespace) -> int:
    from chexflow.folders import os_cause, writable_folders
    from chexflow.slurm.script import SlurmJob, SlurmScriptError, TrainingRun, render

    manifest = args.data / "manifest.json"
    if not manifest.is_file():
        raise SlurmScriptError(
            f"--data {args.data}: no manifest.json there; expected a folder written by "
            "`chexflow preprocess`"
        )
    if args.container is None:
        if args.python:
            python = args.python
        else:
            from chexflow.envs import trainer_python

            python = str(trainer_python())
    else:
        python = "python"
        if args.python:
            raise SlurmScriptError("--python applies without --container only")
    run = TrainingRun(TrainOptions.from_namespace(args, data=args.data.resolve(), out=None),
                      extra_args=args.worker_arg)
    job = SlurmJob(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, tasks_per_node=args.tasks_per_node,
        cpus_per_task=args.cpus_per_task, time=args.time, job_name=args.job_name,
        partition=args.partition, account=args.account, launcher=args.launcher, mpi=args.mpi,
        container=args.container.resolve() if args.container else None, binds=args.bind,
        python=python, env=_env_pairs(args.env),
    )
    text = render(run, job, args.out)
    script = args.script or args.out / "job.sbatch"
    if script.is_dir():
        raise SlurmScriptError(f"--script {script}: a folder; expected the script's file name")
    if script.exists() and not args.overwrite:
        raise SlurmScriptError(f"{script} exists; pass --overwrite to replace it")
    writable_folders((args.out, "--out"),
                     (script.parent, "--script's folder" if args.script else "--out"))
    try:
        script.write_text(text)
        script.chmod(0o755)
    except OSError as e:
        raise SlurmScriptError(f"{script}: cannot write it ({os_cause(e)})") from None
    ranks = job.nodes * job.ntasks_per_node
    print(f"slurm: wrote {script} ({ranks} Horovod ranks, {job.launcher}"
          + (f", apptainer {job.container}" if job.container else "") + ")")
    print(f"slurm: submit it with `chexflow slurm submit {script}`")
    return 0


def run_submit(args: argparse.Namespace) -> int:
    from chexflow.folders import writable_folder
    from chexflow.slurm import jobs
    from chexflow.slurm.script import LOG_TAG, METRICS_TAG, read_tag

    script: Path = args.script
    if not script.is_file():
        raise jobs.SlurmError(f"{script}: no such script (write one with `chexflow slurm render`)")
    text = script.read_text()
    metrics_path = read_tag(text, METRICS_TAG)
    log_pattern = read_tag(text, LOG_TAG)
    # the job's record goes beside the script: checked before the job is queued
    writable_folder(script.parent, "the script's folder")
    job_id = jobs.submit(script, args.sbatch_arg)
    log = Path(log_pattern.replace("%j", job_id)) if log_pattern else None
    print(f"slurm: submitted {script} as job {job_id}" + (f"; log {log}" if log else ""),
          flush=True)
    record_path = script.parent / f"slurm-{job_id}.json"
    record: dict = {"job_id": job_id, "script": str(script.resolve()), "log": str(log or "")}
    if args.no_wait:
        _write(record_path, {**record, "state": jobs.queued_state(job_id) or "SUBMITTED"})
        return 0

    status = jobs.wait(job_id, args.poll, args.timeout, _progress(job_id))
    print(
        f"slurm: job {job_id} {status.state} (exit {status.exit_code}, ran {status.elapsed}"
        + (f" on {status.nodes}" if status.nodes else "") + ")",
        flush=True,
    )
    record.update(status.as_dict())
    if status.state != "COMPLETED":
        _write(record_path, record)
        raise jobs.SlurmError(
            f"job {job_id} ({script}) ended {status.state}, exit code {status.exit_code}"
            + (f", reason {status.reason}" if status.reason not in ("", "None") else "")
            + (f"; log {log}:\n{_tail(log)}" if log else "")
        )
    if not metrics_path:
        _write(record_path, record)
        print(f"slurm: {script} names no metrics file; job record {record_path}")
        return 0
    metrics_file = Path(metrics_path)
    if not metrics_file.is_file():
        _write(record_path, record)
        raise jobs.SlurmError(
            f"job {job_id} COMPLETED but wrote no {metrics_file}"
            + (f"; log {log}:\n{_tail(log)}" if log else "")
        )
    metrics = json.loads(metrics_file.read_text())
    record["metrics_path"] = str(metrics_file)
    record["metrics"] = metrics
    _write(record_path, record)
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            print(f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}")
    print(f"slurm: metrics {metrics_file}; job record {record_path}")
    return 0


def _progress(job_id: str):
    """A tqdm line showing the job's state and how long we have waited."""
    from tqdm import tqdm

    bar = tqdm(total=None, desc=f"job {job_id} SUBMITTED", file=sys.stderr,
               bar_format="{desc} [{elapsed}]", mininterval=1.0)

    def update(state: str, waited: float) -> None:
        bar.set_description_str(f"job {job_id} {state}", refresh=False)
        bar.update(1)
        if state == "FINISHED":
            bar.close()

    return update


def _tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.is_file():
        return f"({path} not found)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2))

