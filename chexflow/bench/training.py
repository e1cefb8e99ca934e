"""Training throughput comparisons, each side a real `chexflow train` run (images/s from its
metrics.json, warm-up steps excluded, total = measured sum over ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from chexflow.bench.core import Result, Side, compare
from chexflow.train.options import TrainOptions


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


def train_images_per_sec(work: Path, data: Path | None, *, model: str, size: int, batch: int,
                         steps: int, workers: int = 1, synthetic: bool = False,
                         extra: tuple[str, ...] = ()) -> float:
    """One fresh `chexflow train` run (1 epoch of `steps` steps); its total images/s."""
    out = Path(tempfile.mkdtemp(prefix="train-", dir=work))
    cmd = train_command(out, data, model=model, size=size, batch=batch, steps=steps,
                        workers=workers, synthetic=synthetic, extra=extra)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return float(json.loads((out / "metrics.json").read_text())["images_per_sec"])


def input_pipeline(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
                   repeats: int) -> Result:
    """TFRecords (the real input pipeline) vs in-memory synthetic tensors: goal >= 0.97."""
    kw = dict(model=model, size=size, batch=batch, steps=steps)
    return compare(
        f"input pipeline {model}", "images/s",
        Side("TFRecords", lambda: train_images_per_sec(work, data, **kw)),
        Side("synthetic", lambda: train_images_per_sec(work, None, synthetic=True, **kw)),
        repeats=repeats, goal=0.97, notes={"image_size": size, "batch_per_worker": batch,
                                           "steps": steps},
    )


def scaling(work: Path, data: Path, model: str, size: int, batch: int, steps: int,
            repeats: int) -> Result:
    """2 workers vs 1, one thread each: efficiency = total(2) / (2 x total(1)), goal >= 0.90."""
    kw = dict(model=model, size=size, batch=batch, steps=steps, extra=("--threads", "1"))
    result = compare(
        f"horovod scaling {model}", "images/s",
        Side("2 workers (total)", lambda: train_images_per_sec(work, data, workers=2, **kw)),
        Side("1 worker x 2", lambda: 2 * train_images_per_sec(work, data, workers=1, **kw)),
        repeats=repeats, goal=0.90, figure_name="scaling efficiency",
        notes={"image_size": size, "batch_per_worker": batch, "steps": steps,
               "threads_per_worker": 1},
    )
    result.notes["one_worker_images_per_sec"] = [s / 2 for s in result.samples_b]
    return result
