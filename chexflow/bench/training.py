"""Training throughput comparisons, each side a real `chexflow train` run (images/s from its
metrics.json, warm-up steps excluded, total = measured sum over ranks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chexflow.bench.core import Result, Side, compare, compare_each, interleave
from chexflow.envs import trainer_python, with_chexflow_importable
from chexflow.jobs.allreduce import MPI_CPU_ENV
from chexflow.train.options import TrainOptions

# input pipeline: a ratio above this means the synthetic side did more (or other) work than
# the real one, so it bounds nothing
SUSPECT_ABOVE = 1.03


def train_command(out: Path, data: Path | None, *, model: str, size: int, batch: int,
                  steps: int, workers: int = 1, synthetic: bool = False,
                  extra: tuple[str, ...] = ()) -> list[str]:
    """`chexflow train` for one epoch of `steps` steps, from scratch, into `out`."""
    options = TrainOptions(
        data=None if synthetic else data, model=model, epochs=1, steps_per_epoch=steps,
        batch_size=batch, image_size=size, weights="none", out=out, validation_steps=1,
        synthetic_data=synthetic,
    )
    return [sys.executable, "-m", "chexflow.cli", "train", "--workers", str(workers),
            *options.to_argv(), *extra]


def _images_per_sec(proc: subprocess.CompletedProcess | subprocess.Popen, cmd: list[str],
                    stderr: str, out: Path) -> float:
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    return float(json.loads((out / "metrics.json").read_text())["images_per_sec"])


def train_metrics(work: Path, data: Path | None, *, model: str, size: int, batch: int,
                  steps: int, workers: int = 1, synthetic: bool = False,
                  extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict:
    """One fresh `chexflow train` run (1 epoch of `steps` steps); its metrics.json.
    `env`: the run's environment (default: this process's)."""
    out = Path(tempfile.mkdtemp(prefix="train-", dir=work))
    cmd = train_command(out, data, model=model, size=size, batch=batch, steps=steps,
                        workers=workers, synthetic=synthetic, extra=extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    _images_per_sec(proc, cmd, proc.stderr, out)  # raises with the run's error if it failed
    metrics = json.loads((out / "metrics.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return metrics


def train_images_per_sec(work: Path, data: Path | None, **kw) -> float:
    """One fresh `chexflow train` run (train_metrics' arguments); its total images/s."""
    return float(train_metrics(work, data, **kw)["images_per_sec"])


def concurrent_images_per_sec(work: Path, data: Path | None, runs: int, **kw) -> float:
    """`runs` independent one-worker `chexflow train` runs started together; their summed
    images/s (what the cores give without Horovod)."""
    outs = [Path(tempfile.mkdtemp(prefix="train-", dir=work)) for _ in range(runs)]
    cmds = [train_command(out, data, workers=1, **kw) for out in outs]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for cmd in cmds]
    errors = [p.communicate()[1] for p in procs]
    total = sum(_images_per_sec(p, cmd, err, out)
                for p, cmd, err, out in zip(procs, cmds, errors, outs, strict=True))
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    return total


def input_pipeline(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
                   repeats: int) -> Result:
    """TFRecords (the real input pipeline) vs the same stages fed from memory: goal >= 0.97,
    and a ratio above 1.03 flags the synthetic baseline as suspect."""
    kw = dict(model=model, size=size, batch=batch, steps=steps)
    result = compare(
        f"input pipeline {model}", "images/s",
        Side("TFRecords", lambda: train_images_per_sec(work, data, **kw)),
        Side("synthetic", lambda: train_images_per_sec(work, None, synthetic=True, **kw)),
        repeats=repeats, goal=0.97, suspect_above=SUSPECT_ABOVE,
        notes={"image_size": size, "batch_per_worker": batch, "steps": steps},
    )
    result.notes["input_alone"] = input_alone(data, batch, repeats)
    return result


def input_alone(data: Path, batch: int, repeats: int) -> dict:
    """CPU and wall ms per batch of each side's input without a model
    (chexflow.train.input_cost, in the trainer environment, the threads a worker gets)."""
    cmd = [str(trainer_python()), "-m", "chexflow.train.input_cost", str(data), "--batch-size",
           str(batch), "--repeats", str(max(3, repeats)), "--threads", str(os.cpu_count() or 1)]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=with_chexflow_importable(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def scaling(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
            repeats: int, workers: int = 2) -> list[Result]:
    """N Horovod workers, one thread each, against (1) one worker run alone x N and (2) N
    independent one-worker runs at the same time (contention for cores and memory without
    Horovod): efficiency = total(N) / baseline, goal >= 0.90 each."""
    kw = dict(model=model, size=size, batch=batch, steps=steps, extra=("--threads", "1"))
    alone = Side(f"1 worker alone x {workers}",
                 lambda: workers * train_images_per_sec(work, data, workers=1, **kw))
    results = compare_each(
        [f"horovod scaling {model} vs one worker alone",
         f"horovod scaling {model} vs {workers} independent workers"],
        "images/s",
        Side(f"{workers} workers (total)",
             lambda: train_images_per_sec(work, data, workers=workers, **kw)),
        [alone, Side(f"{workers} independent workers at once (total)",
                     lambda: concurrent_images_per_sec(work, data, workers, **kw))],
        repeats=repeats, goal=0.90, figure_name="scaling efficiency",
        notes={"image_size": size, "batch_per_worker": batch, "steps": steps,
               "threads_per_worker": 1, "workers": workers},
    )
    for r in results:
        r.notes["one_worker_images_per_sec"] = [s / workers for s in alone.samples]
    return results


@dataclass(frozen=True)
class Setting:
    """One Horovod setting of the options comparison: `chexflow train` arguments, environment
    variables, and whether it gives the same numbers as gloo (float16 gradients do not)."""

    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    same_results: bool = True


MPI_OPS = {"HOROVOD_CPU_OPERATIONS": "MPI"}


def horovod_option_sides(mpi: bool) -> dict[str, Setting]:
    """The settings the options comparison tries, gloo (the former default) first; with OpenMPI,
    MPI tensor operations (`horovodrun --mpi`, OpenMPI's shared-memory btl between ranks of one
    host), busy-polling and yielding the core while it waits (the default now: each named
    here, so that the comparison does not follow the default)."""
    gloo = ("--controller", "gloo")
    sides = {"gloo": Setting(gloo)}
    if mpi:
        sides |= {
            "mpi": Setting(("--controller", "mpi"),
                           {**MPI_OPS, "OMPI_MCA_mpi_yield_when_idle": "0"}),
            "mpi, yield when idle": Setting(
                ("--controller", "mpi"), {**MPI_OPS, "OMPI_MCA_mpi_yield_when_idle": "1"}),
        }
    sides |= {
        "gloo --fp16-allreduce": Setting((*gloo, "--fp16-allreduce"), same_results=False),
        "gloo --fusion-threshold-mb 16": Setting((*gloo, "--fusion-threshold-mb", "16")),
        "gloo --cycle-time-ms 50": Setting((*gloo, "--cycle-time-ms", "50")),
    }
    return sides


def best_setting(results: list[Result], sides: dict[str, Setting]) -> str:
    """The setting with the highest median images/s among those giving gloo's numbers."""
    medians = {r.a: r.median_a for r in results if r.a in sides}
    return max((n for n in medians if sides[n].same_results), key=medians.__getitem__)


def horovod_options(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
                    repeats: int, workers: int = 2) -> list[Result]:
    """Each Horovod setting as an N-worker run, and N independent one-worker runs at once, all
    interleaved in one loop: each setting against gloo (ratio, goal >= 1: not slower) and
    against the independent workers (scaling efficiency, goal >= 0.90)."""
    kw = dict(model=model, size=size, batch=batch, steps=steps)
    settings = horovod_option_sides(mpi=shutil.which("mpirun") is not None)
    sides = [Side(name, lambda s=s: train_images_per_sec(
        work, data, workers=workers, extra=("--threads", "1", *s.args),
        env={**os.environ, **s.env}, **kw)) for name, s in settings.items()]
    independent = Side(f"{workers} independent workers at once (total)",
                       lambda: concurrent_images_per_sec(work, data, workers,
                                                         extra=("--threads", "1"), **kw))
    interleave(f"horovod options {model}", [*sides, independent], repeats)
    notes = {"image_size": size, "batch_per_worker": batch, "steps": steps, "workers": workers,
             "threads_per_worker": 1}
    gloo = sides[0]
    vs_gloo = [Result(f"horovod option {s.name}", "images/s", s.name, gloo.name, s.samples,
                      gloo.samples, 1.0, dict(notes), figure_name="ratio setting/gloo")
               for s in sides[1:]]
    scaling = [Result(f"horovod scaling {model} {s.name} vs {workers} independent workers",
                      "images/s", s.name, independent.name, s.samples, independent.samples,
                      0.90, dict(notes), figure_name="scaling efficiency") for s in sides]
    return vs_gloo + scaling


# OpenMPI's collective component `tuned` picks an allreduce algorithm by message size and
# ranks unless told one (coll_tuned_use_dynamic_rules); these name it.
def _mpi_allreduce_algorithm(number: int) -> dict[str, str]:
    return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
            "OMPI_MCA_coll_tuned_allreduce_algorithm": str(number)}


def allreduce_lever_sides() -> dict[str, Setting]:
    """The default CPU allreduce (MPI tensor operations, yielding; one grouped allreduce of a
    step's gradients), then each lever on top of it, one at a time: OpenMPI's allreduce
    algorithm named (each rank reduces half the buffer in ring and Rabenseifner's, all of it in
    recursive doubling), no fusion buffer (each gradient reduced in place: no copies in and
    out, one MPI call per tensor), a shorter Horovod cycle (negotiation wakes every 5 ms, not
    25), OpenMPI's shared-memory transport without its single-copy (CMA) path, and MPI
    initialised without thread support (Horovod asks for MPI_THREAD_MULTIPLE unless
    HOROVOD_MPI_THREADS_DISABLE=1; only its background thread calls MPI)."""
    mpi = ("--controller", "mpi")
    env = dict(MPI_CPU_ENV)
    return {
        "default (MPI, yield when idle)": Setting(mpi, env),
        "allreduce algorithm ring": Setting(mpi, {**env, **_mpi_allreduce_algorithm(4)}),
        "allreduce algorithm rabenseifner": Setting(mpi, {**env, **_mpi_allreduce_algorithm(6)}),
        "allreduce algorithm recursive doubling": Setting(
            mpi, {**env, **_mpi_allreduce_algorithm(3)}),
        "--fusion-threshold-mb 0 (no fusion buffer)": Setting((*mpi, "--fusion-threshold-mb", "0"),
                                                             env),
        "--cycle-time-ms 5": Setting((*mpi, "--cycle-time-ms", "5"), env),
        "shared memory without single copy": Setting(
            mpi, {**env, "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}),
        "MPI without thread support": Setting(mpi, {**env, "HOROVOD_MPI_THREADS_DISABLE": "1"}),
    }


def allreduce_levers(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
                     repeats: int, workers: int = 2) -> list[Result]:
    """Each lever against the default (ratio, met at >= 1; it pays only beyond the spread) and
    every setting against N independent one-worker runs at once (scaling efficiency, goal >=
    0.90), all interleaved in one loop. Each run's epoch loss is kept: a lever that pays must
    give the default's losses (rtol 1e-5), as the default gives gloo's
    (tests/test_train_horovod_options.py)."""
    kw = dict(model=model, size=size, batch=batch, steps=steps)
    settings = allreduce_lever_sides()
    losses: dict[str, list[float]] = {name: [] for name in settings}

    def run(name: str, setting: Setting) -> float:
        metrics = train_metrics(work, data, workers=workers,
                                extra=("--threads", "1", *setting.args),
                                env={**os.environ, **setting.env}, **kw)
        losses[name] += [h["loss"] for h in metrics["history"]]
        return float(metrics["images_per_sec"])

    sides = [Side(name, lambda n=name, s=s: run(n, s)) for name, s in settings.items()]
    independent = Side(f"{workers} independent workers at once (total)",
                       lambda: concurrent_images_per_sec(work, data, workers,
                                                         extra=("--threads", "1"), **kw))
    interleave(f"allreduce levers {model}", [*sides, independent], repeats)
    default = sides[0]
    notes = {"image_size": size, "batch_per_worker": batch, "steps": steps, "workers": workers,
             "threads_per_worker": 1}

    def lever_notes(side: Side) -> dict:
        setting = settings[side.name]
        same = bool(np.allclose(losses[side.name], losses[default.name][:len(losses[side.name])],
                                rtol=1e-5, atol=0))
        return {**notes, "args": list(setting.args), "env": setting.env,
                "losses": losses[side.name], "same_losses_as_default": same}

    vs_default = [Result(f"allreduce lever {s.name}", "images/s", s.name, default.name,
                         s.samples, default.samples, 1.0, lever_notes(s),
                         figure_name="ratio lever/default") for s in sides[1:]]
    scaling = [Result(f"allreduce scaling {model} {s.name} vs {workers} independent workers",
                      "images/s", s.name, independent.name, s.samples, independent.samples,
                      0.90, lever_notes(s), figure_name="scaling efficiency") for s in sides]
    return vs_default + scaling
