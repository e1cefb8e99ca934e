"""Inference throughput: `chexflow predict`'s loop (image files through training's load_greyscale
in threads, then the model) against `chexflow evaluate`'s (the preprocessed TFRecords, then the
model), in images/s over the same images with the same model and batch size. Each run is a
process of its own in the trainer environment; loading the model and one warm-up batch are left
out of its time, as they are the same on both sides.

    python -m chexflow.bench.inference predict|evaluate MODEL DATA IMAGES SPLIT BATCH   (one run)
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

from chexflow.bench.core import Result, Side, compare
from chexflow.envs import trainer_python

MODEL, SPLIT = "densenet121", "train"
GOAL = 0.9  # predict keeps up with evaluate: decoding files costs at most a tenth


def split_files(data: Path, images: Path, split: str) -> list[Path]:
    """The image files of a split of `chexflow preprocess` output (its splits.csv)."""
    with open(data / "splits.csv", newline="") as f:
        return [images / row["image_index"] for row in csv.DictReader(f)
                if row["split"] == split]


def write_model(path: Path, size: int, classes: list[str]) -> Path:
    """An untrained model as `chexflow train` writes one (throughput does not depend on its
    weights), with its classes and size stored in the file."""
    from chexflow.train.models import build_model
    from chexflow.train.rundir import embed_model_info

    if not path.exists():
        build_model(MODEL, size, len(classes), flip=False).save(path)
        embed_model_info(path, classes, size)
    return path


def one_run(side: str, model_path: Path, data: Path, images: Path, split: str,
            batch: int) -> float:
    """Images/s of one side's loop over the split."""
    import numpy as np

    from chexflow.data.manifest import load_manifest
    from chexflow.evaluate.predict import load_checked, predict_split
    from chexflow.explain.model import output_names
    from chexflow.explain.predict import predict_images

    manifest = load_manifest(data)
    model = load_checked(model_path, manifest)
    model(np.zeros((batch, *model.input_shape[1:]), np.uint8), training=False)  # warm-up
    start = time.perf_counter()
    if side == "evaluate":
        count = len(predict_split(None, manifest, split, batch, model)["probs"])
    else:
        classes = output_names(model_path, int(model.output_shape[-1]))
        count = len(predict_images(model, classes, split_files(data, images, split), batch)
                    .paths)
    return count / (time.perf_counter() - start)


def run(work: Path, data: Path, images: Path, size: int, batch: int, repeats: int) -> Result:
    from chexflow.data.manifest import load_manifest

    work.mkdir(parents=True, exist_ok=True)
    model = write_model(work / f"{MODEL}-{size}px.keras", size,
                        list(load_manifest(data).classes))
    count = len(split_files(data, images, SPLIT))

    def side(name: str):
        def timed() -> float:
            proc = subprocess.run(
                [str(trainer_python()), "-m", __name__, name, str(model), str(data),
                 str(images), SPLIT, str(batch)],
                check=True, capture_output=True, text=True)
            return float(proc.stdout.split()[-1])
        return timed

    return compare(
        f"inference {MODEL}", "images/s",
        Side("chexflow predict (image files)", side("predict")),
        Side("chexflow evaluate (TFRecords)", side("evaluate")),
        repeats=repeats, goal=GOAL,
        notes={"model": MODEL, "image_size": size, "batch_size": batch, "images": count,
               "split": SPLIT, "source": "generated PNGs (chexflow data synth)",
               "timed": "the prediction loop; model load and one warm-up batch excluded"},
    )


if __name__ == "__main__":
    mode, model_arg, data_arg, images_arg, split_arg, batch_arg = sys.argv[1:7]
    print(one_run(mode, Path(model_arg), Path(data_arg), Path(images_arg), split_arg,
                  int(batch_arg)))
