"""Orchestration overhead: training launched through `chexflow run` (kfp.local + the local job
launcher) vs the same worker module started directly with horovodrun, both with the local
launch's default allreduce. The figure is the ratio of measured training throughput (goal >=
0.98); the fixed start-up cost of each path, in seconds of wall time, is recorded beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chexflow.bench.core import Result, Side, compare
from chexflow.envs import trainer_python, with_chexflow_importable
from chexflow.jobs.allreduce import local_allreduce
from chexflow.jobs.local import horovodrun_command
from chexflow.train.options import TrainOptions


def run(work: Path, model: str, size: int, batch: int, steps: int, workers: int,
        repeats: int) -> Result:
    work.mkdir(parents=True, exist_ok=True)
    walls: dict[str, list[float]] = {"chexflow run": [], "horovodrun": []}
    common = {"model": model, "image_size": size, "batch_size": batch, "steps_per_epoch": steps,
              "epochs": 1, "synthetic_data": True}

    def through_pipeline() -> float:
        out = Path(tempfile.mkdtemp(prefix="pipeline-", dir=work))
        cmd = [sys.executable, "-m", "chexflow.cli", "run", "scaling-study", "--out", str(out),
               "--worker-counts", str(workers)]
        cmd += [f"--param={k}={json.dumps(v)}" for k, v in common.items()]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        walls["chexflow run"].append(time.perf_counter() - start)
        (metrics,) = out.glob(f"scaling-study-*/work/*/train-w{workers}/metrics.json")
        return json.loads(metrics.read_text())["images_per_sec"]

    allreduce = local_allreduce(None, trainer_python())

    def direct() -> float:
        out = Path(tempfile.mkdtemp(prefix="direct-", dir=work))
        options = TrainOptions(out=out, model=model, image_size=size, batch_size=batch,
                               steps_per_epoch=steps, epochs=1, synthetic_data=True)
        cmd = horovodrun_command(options.worker_command(str(trainer_python())), workers,
                                 controller=allreduce.controller)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True,
                       env=with_chexflow_importable({**allreduce.env, **os.environ}))
        walls["horovodrun"].append(time.perf_counter() - start)
        return json.loads((out / "metrics.json").read_text())["images_per_sec"]

    result = compare(
        "orchestration overhead", "images/s",
        Side("chexflow run (kfp.local)", through_pipeline),
        Side("horovodrun directly", direct),
        repeats=repeats, goal=0.98,
        notes={"model": model, "image_size": size, "steps": steps, "workers": workers},
    )
    result.notes["wall_seconds"] = walls
    return result
