"""Reading the results of `chexflow evaluate` (no TensorFlow needed): `read_auroc(out)`."""

from __future__ import annotations

from pathlib import Path

from chexflow.results import ResultsMissing, read_json_result

__all__ = ["ResultsMissing", "read_auroc"]


def read_auroc(evaluate_out: Path) -> dict:
    """auroc.json of an evaluation (keys: per_class, mean, ci_low, ci_high, skipped_classes)."""
    return read_json_result(Path(evaluate_out) / "auroc.json", "chexflow evaluate --out DIR")
