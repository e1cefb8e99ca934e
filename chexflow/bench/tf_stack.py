"""The trainer on TensorFlow 2.20 (tf-keras, patched Horovod, Python 3.12) against the TF 2.15.1
trainer it replaced: the same `chexflow train` on the same model, data and workers, images/s.

The TF 2.15 side is an environment of its own (`.venv-tf2.15`, Python 3.11, numpy < 2), made on
first use by images/install-trainer.sh with images/requirements-tf2.15.txt, and used only here:
`CHEXFLOW_TRAINER_PYTHON` points `chexflow train` at it (the source tree is on its PYTHONPATH),
and TF_USE_LEGACY_KERAS=0 keeps TF 2.15 on its own Keras 2.15, as the old trainer ran.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from chexflow.bench.core import Result, Side, compare
from chexflow.bench.training import train_images_per_sec
from chexflow.envs import REPO_ROOT, TRAINER_ENV_VAR, trainer_python

BASELINE_VENV = REPO_ROOT / ".venv-tf2.15"
BASELINE_TF = "tensorflow-cpu==2.15.1"


def baseline_python(given: Path | None) -> Path:
    """The TF 2.15 trainer's python: `given`, or .venv-tf2.15 (created the first time)."""
    if given is not None:
        return given
    python = BASELINE_VENV / "bin" / "python"
    if not python.exists():
        print(f">> creating the TF 2.15 baseline environment {BASELINE_VENV} (Horovod builds: "
              "minutes, once)", flush=True)
        env = {**os.environ, "TF_PACKAGE": BASELINE_TF, "KERAS_PACKAGE": "",
               "CHEXFLOW_PYTHON_VERSIONS": "3.11",
               "TRAINER_REQUIREMENTS": str(REPO_ROOT / "images/requirements-tf2.15.txt")}
        subprocess.run([str(REPO_ROOT / "images/install-trainer.sh"), str(BASELINE_VENV),
                        "--no-project"], env=env, check=True)
    return python


def _env(python: Path, legacy_keras: str) -> dict[str, str]:
    return {**os.environ, TRAINER_ENV_VAR: str(python), "TF_USE_LEGACY_KERAS": legacy_keras}


def _version(python: Path, legacy_keras: str) -> str:
    proc = subprocess.run([str(python), "-c", "import tensorflow as tf, sys; "
                           "print(tf.__version__, 'python', sys.version.split()[0])"],
                          capture_output=True, text=True,
                          env={**_env(python, legacy_keras), "TF_CPP_MIN_LOG_LEVEL": "3"})
    return proc.stdout.strip() or proc.stderr.strip()[-200:]


def run(work: Path, data: Path, model: str, size: int, batch: int, steps: int, repeats: int,
        baseline: Path | None = None, workers: int = 2) -> Result:
    """2-worker `chexflow train` on each stack, interleaved; ratio new/old, goal >= 0.95."""
    work.mkdir(parents=True, exist_ok=True)
    new, old = trainer_python(), baseline_python(baseline)
    kw = dict(model=model, size=size, batch=batch, steps=steps, workers=workers)
    return compare(
        f"trainer on TF 2.20 vs TF 2.15 ({model}, {workers} workers)", "images/s",
        Side(f"TF {_version(new, '1')}",
             lambda: train_images_per_sec(work, data, env=_env(new, "1"), **kw)),
        Side(f"TF {_version(old, '0')}",
             lambda: train_images_per_sec(work, data, env=_env(old, "0"), **kw)),
        repeats=repeats, goal=0.95,
        notes={"image_size": size, "batch_per_worker": batch, "steps": steps, "workers": workers,
               "new_python": str(new), "baseline_python": str(old)},
    )
