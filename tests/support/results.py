"""The result files of training and evaluation as the tests read them (chexflow.results'
reader: a missing file names the command that writes it)."""

from __future__ import annotations

from pathlib import Path

from chexflow.results import read_json_result


def read_metrics(train_out: Path) -> dict:
    """metrics.json of `chexflow train --out DIR`: model, workers, image_size,
    batch_size_per_worker, epochs, images_per_sec (total = sum over workers),
    images_per_sec_per_worker, images_per_sec_mean/std, jitter, step_time_ms, val_auroc,
    val_loss (of best_model.keras), wall_seconds, synthetic_data, history (per epoch), ..."""
    return read_json_result(Path(train_out) / "metrics.json", "chexflow train --out DIR")


def read_auroc(evaluate_out: Path) -> dict:
    """auroc.json of an evaluation (keys: per_class, mean, ci_low, ci_high, skipped_classes)."""
    return read_json_result(Path(evaluate_out) / "auroc.json", "chexflow evaluate --out DIR")
