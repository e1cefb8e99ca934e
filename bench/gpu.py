"""`chexflow bench --gpu`: ResNet-50 and DenseNet-121 at 224 px on one GPU, AMP and XLA on and
off, synthetic and real data, a batch-size sweep; printed like tf_cnn_benchmarks."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from chexflow.envs import trainer_python
from chexflow.errors import ChexflowError


def gpu_count() -> int:
    """GPUs TensorFlow sees in the trainer environment."""
    proc = subprocess.run(
        [str(trainer_python()), "-c",
         "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"],
        capture_output=True, text=True, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )
    lines = proc.stdout.strip().splitlines()
    return int(lines[-1]) if proc.returncode == 0 and lines else 0


def require_gpu() -> int:
    n = gpu_count()
    if n == 0:
        raise ChexflowError(
            "--gpu: TensorFlow in the trainer environment sees no GPU on this machine. Run it "
            "on a GPU node with the trainer image, or a trainer environment built with "
            "TF_PACKAGE='tensorflow[and-cuda]==2.15.1' images/install-trainer.sh .venv-trainer"
        )
    return n


def sweep(work: Path, data: Path, quick: bool) -> list[dict]:
    """Every combination, each a real `chexflow train` run of one epoch; returns their rows."""
    models = ("resnet50", "densenet121")
    batches = (64,) if quick else (32, 64, 128, 256)
    steps = 20 if quick else 100
    rows = []
    for model, amp, xla, synthetic, batch in itertools.product(
        models, (False, True), (False, True), (True, False), batches
    ):
        out = work / f"{model}-b{batch}-amp{int(amp)}-xla{int(xla)}-syn{int(synthetic)}"
        cmd = [sys.executable, "-m", "chexflow.cli", "train", "--model", model, "--workers", "1",
               "--epochs", "1", "--steps-per-epoch", str(steps), "--warmup-steps", "10",
               "--batch-size", str(batch), "--image-size", "224", "--weights", "none",
               "--validation-steps", "1", "--out", str(out)]
        cmd += ["--amp"] * amp + ["--xla"] * xla
        cmd += ["--synthetic-data"] if synthetic else ["--data", str(data)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        row = {"model": model, "batch": batch, "amp": amp, "xla": xla, "synthetic": synthetic}
        if proc.returncode != 0:
            row["error"] = proc.stderr.strip().splitlines()[-1:] or ["failed"]
        else:
            m = json.loads((out / "metrics.json").read_text())
            row.update({k: m[k] for k in ("images_per_sec", "jitter", "step_time_ms")})
        rows.append(row)
        print(tf_cnn_line(row), flush=True)
    return rows


def tf_cnn_line(row: dict) -> str:
    head = (f"{row['model']:<12} batch {row['batch']:>4} amp={int(row['amp'])} "
            f"xla={int(row['xla'])} {'synthetic' if row['synthetic'] else 'real     '}")
    if "error" in row:
        return f"{head}  FAILED: {row['error'][0]}"
    return (f"{head}  total images/sec: {row['images_per_sec']:.2f} "
            f"+/- {row['jitter']:.2f} (jitter)  step {row['step_time_ms']:.1f} ms")
