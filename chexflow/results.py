"""The result files of an evaluation that the pipeline's steps read back, without TensorFlow; a
missing file names the command that writes it."""

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


def read_calibration(evaluate_out: Path) -> dict:
    """calibration.json of an evaluation (keys: split, threshold_split, specificity_target,
    bins, ece_mean, per_class: {ece, reliability, operating_point})."""
    return read_json_result(Path(evaluate_out) / "calibration.json",
                            "chexflow evaluate --out DIR")
