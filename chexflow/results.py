"""Reading a step's JSON result file without TensorFlow; a missing file names the command that
writes it. Training's reader is chexflow.train.results, evaluation's chexflow.evaluate.results."""

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
