"""The training input alone: CPU time per batch of data.train_dataset (TFRecords) and
data.synthetic_dataset (the same stages fed from memory), built as one `chexflow train` worker
builds them (rank 0 of `workers`, the same TensorFlow threads), iterated without a model.

    python -m chexflow.train.input_cost DATA --batch-size 16 --batches 300

prints one JSON object: per side, the median over `--repeats` rounds of CPU and wall
milliseconds per batch (the sides alternate within each round). What `chexflow bench
--only input-pipeline` sets beside its end-to-end ratio: the share of a training step that the
input itself can account for.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

WARMUP_BATCHES = 20  # the shuffle buffer's fill and the first prefetch, not timed


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_batch(dataset, batches: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per batch over `batches` batches after the warm-up ones."""
    batch = iter(dataset)
    for _ in range(WARMUP_BATCHES):
        next(batch)
    cpu, wall = _cpu_seconds(), time.perf_counter()
    for _ in range(batches):
        next(batch)
    return ((_cpu_seconds() - cpu) * 1e3 / batches, (time.perf_counter() - wall) * 1e3 / batches)


def measure(data: Path, batch_size: int, batches: int, repeats: int, threads: int,
            workers: int, seed: int = 1) -> dict:
    import tensorflow as tf

    from chexflow.data.manifest import load_manifest
    from chexflow.train import data as inputs

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    manifest = load_manifest(data)
    classes = len(manifest.classes)
    build = {
        "TFRecords": lambda: inputs.train_dataset(manifest, batch_size, 0, workers, seed),
        "synthetic": lambda: inputs.synthetic_dataset(manifest.image_size, classes, batch_size,
                                                      seed),
    }
    rounds: dict[str, list[tuple[float, float]]] = {side: [] for side in build}
    for i in range(repeats):
        for side in list(build) if i % 2 == 0 else list(build)[::-1]:
            rounds[side].append(per_batch(build[side](), batches))
    return {
        "batch_size": batch_size, "image_size": manifest.image_size, "batches": batches,
        "repeats": repeats, "threads": threads,
        **{side: {"cpu_ms_per_batch": round(statistics.median(c for c, _ in r), 4),
                  "wall_ms_per_batch": round(statistics.median(w for _, w in r), 4)}
           for side, r in rounds.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chexflow.train.input_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path, help="a `chexflow preprocess` output folder")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="the rank's share as with N workers")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.data, args.batch_size, args.batches, args.repeats,
                             args.threads, args.workers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
