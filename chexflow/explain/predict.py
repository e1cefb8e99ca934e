"""`chexflow predict`: per-class probabilities of image files as one CSV (trainer environment).

Every input gets one row, in the order given (a folder's images sorted): the image's path, one
probability per class, and an error column saying why an image could not be read (its
probabilities then empty). The CSV is written beside --out and renamed onto it when complete.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from chexflow.errors import ChexflowError
from chexflow.explain.inputs import batches, collect
from chexflow.limits import check_range

PROBABILITY_FORMAT = "{:.8g}"


class PredictError(ChexflowError, ValueError):
    """Bad predict options."""


@dataclass
class Predictions:
    paths: list[Path]
    classes: list[str]
    probs: np.ndarray  # [images, classes], NaN where an image could not be read
    errors: list[str]  # "" where it could

    @property
    def failed(self) -> int:
        return sum(1 for e in self.errors if e)


def check_out(out: Path, overwrite: bool) -> None:
    if out.is_dir():
        raise PredictError(f"--out {out}: is a folder; name the CSV file to write")
    if out.exists() and not overwrite:
        raise PredictError(f"--out {out}: exists; pass --overwrite to replace it or choose "
                           "another file")


def predict_images(model, classes: list[str], paths: list[Path],
                   batch_size: int) -> Predictions:
    """The model's probabilities for every path, batched; unreadable images get NaN and why."""
    size = int(model.input_shape[1])
    probs = np.full((len(paths), len(classes)), np.nan, np.float32)
    errors = [""] * len(paths)
    with tqdm(total=len(paths), desc="predict", unit="img") as bar:
        for rows, images, failed in batches(paths, size, batch_size):
            for i, why in failed.items():
                errors[i] = why
            if rows:
                probs[rows] = model(images, training=False).numpy()
            bar.update(len(rows) + len(failed))
    for i in np.flatnonzero(~np.isfinite(probs).all(axis=1)):
        errors[i] = errors[i] or "the model gives NaN or infinite probabilities (it diverged)"
    return Predictions(paths, classes, probs, errors)


def write_csv(result: Predictions, out: Path) -> None:
    """The CSV, written to a file beside OUT and renamed onto it when complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.chexflow-tmp")
    try:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image", *result.classes, "error"])
            for path, row, error in zip(result.paths, result.probs, result.errors,
                                        strict=True):
                values = [] if error else [PROBABILITY_FORMAT.format(float(p)) for p in row]
                writer.writerow([str(path), *(values or [""] * len(row)), error])
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise PredictError(f"--out {out}: cannot write it ({e.strerror or e})") from None


def predict(model_path: Path, inputs: list[Path], out: Path, batch_size: int = 64,
            overwrite: bool = False) -> Predictions:
    from chexflow.explain.model import load

    check_range("--batch-size", batch_size, 1)
    check_out(out, overwrite)
    paths = collect(inputs)
    model, classes = load(model_path)
    result = predict_images(model, classes, paths, batch_size)
    write_csv(result, out)
    return result
