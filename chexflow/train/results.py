"""Reading a training run's results without TensorFlow (for components, Katib, benchmarks)."""

from __future__ import annotations

from pathlib import Path

from chexflow.results import ResultsMissing, read_json_result

__all__ = ["ResultsMissing", "read_metrics"]


def read_metrics(train_out: Path) -> dict:
    """metrics.json of `chexflow train --out DIR`: model, workers, image_size,
    batch_size_per_worker, epochs, images_per_sec (total = sum over workers),
    images_per_sec_per_worker, images_per_sec_mean/std, jitter, step_time_ms, val_auroc,
    val_loss (of best_model.keras), wall_seconds, synthetic_data, history (per epoch), ..."""
    return read_json_result(Path(train_out) / "metrics.json", "chexflow train --out DIR")
