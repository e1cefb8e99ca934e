"""Reading the results of `chexflow evaluate` (no TensorFlow needed): `read_auroc(out)`.

The training side is chexflow.train.results.read_metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

from chexflow.errors import ChexflowError


class ResultsMissing(ChexflowError):
    """An expected result file is not there."""


def read_json_result(path: Path, made_by: str) -> dict:
    if not path.is_file():
        raise ResultsMissing(f"{path}: not found; it is written by `{made_by}`")
    return json.loads(path.read_text())


def read_auroc(evaluate_out: Path) -> dict:
    """auroc.json of an evaluation (keys: per_class, mean, ci_low, ci_high, skipped_classes)."""
    return read_json_result(Path(evaluate_out) / "auroc.json", "chexflow evaluate --out DIR")
