"""Training throughput comparisons, each side a real `chexflow train` run (images/s from its
metrics.json, warm-up steps excluded, total = measured sum over ranks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from chexflow.bench.core import Result, Side, compare, compare_each, interleave
from chexflow.envs import trainer_python, with_chexflow_importable
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


def train_images_per_sec(work: Path, data: Path | None, *, model: str, size: int, batch: int,
                         steps: int, workers: int = 1, synthetic: bool = False,
                         extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> float:
    """One fresh `chexflow train` run (1 epoch of `steps` steps); its total images/s.
    `env`: the run's environment (default: this process's)."""
    out = Path(tempfile.mkdtemp(prefix="train-", dir=work))
    cmd = train_command(out, data, model=model, size=size, batch=batch, steps=steps,
                        workers=workers, synthetic=synthetic, extra=extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    ips = _images_per_sec(proc, cmd, proc.stderr, out)
    shutil.rmtree(out, ignore_errors=True)
    return ips


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


def horovod_option_sides(mpi: bool) -> dict[str, tuple[str, ...]]:
    """Each Horovod option the options comparison tries, as `chexflow train` arguments."""
    sides = {
        "--fp16-allreduce": ("--fp16-allreduce",),
        "--backward-passes-per-step 2": ("--backward-passes-per-step", "2"),
        "--fusion-threshold-mb 16": ("--fusion-threshold-mb", "16"),
        "--cycle-time-ms 5": ("--cycle-time-ms", "5"),
        "--cycle-time-ms 50": ("--cycle-time-ms", "50"),
    }
    if mpi:
        sides = {"--controller mpi": ("--controller", "mpi"), **sides}
    return sides


def horovod_options(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
                    repeats: int, workers: int = 2) -> list[Result]:
    """Each Horovod option against the defaults (gloo, no compression, one backward pass per
    step, Horovod's fusion buffer, the default cycle), all interleaved in one loop:
    ratio option / defaults, goal >= 1 (the option is not slower)."""
    kw = dict(model=model, size=size, batch=batch, steps=steps, workers=workers)
    options = horovod_option_sides(mpi=shutil.which("mpirun") is not None)
    base = Side("defaults", lambda: train_images_per_sec(
        work, data, extra=("--threads", "1"), **kw))
    sides = [Side(name, lambda a=args: train_images_per_sec(
        work, data, extra=("--threads", "1", *a), **kw)) for name, args in options.items()]
    interleave(f"horovod options {model}", [base, *sides], repeats)
    notes = {"image_size": size, "batch_per_worker": batch, "steps": steps, "workers": workers,
             "threads_per_worker": 1}
    return [Result(f"horovod option {s.name}", "images/s", s.name, base.name, s.samples,
                   base.samples, 1.0, dict(notes), figure_name="ratio option/defaults")
            for s in sides]
