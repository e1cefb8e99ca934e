"""Reading the results of `chexflow train` and `chexflow evaluate` (no TensorFlow needed).

For pipeline components and Katib/benchmark code: `read_metrics(train_out)` returns
metrics.json, `read_auroc(evaluate_out)` returns auroc.json, both as dicts.
"""

from __future__ import annotations

import json
from pathlib import Path

from chexflow.errors import ChexflowError


class ResultsMissing(ChexflowError):
    """An expected result file is not there."""


def _read(path: Path, made_by: str) -> dict:
    if not path.is_file():
        raise ResultsMissing(f"{path}: not found; it is written by `{made_by}`")
    return json.loads(path.read_text())


def read_metrics(train_out: Path) -> dict:
    """metrics.json of a training run (keys: model, workers, images_per_sec, val_auroc, ...)."""
    return _read(Path(train_out) / "metrics.json", "chexflow train --out DIR")


def read_auroc(evaluate_out: Path) -> dict:
    """auroc.json of an evaluation (keys: per_class, mean, ci_low, ci_high, skipped_classes)."""
    return _read(Path(evaluate_out) / "auroc.json", "chexflow evaluate --out DIR")
