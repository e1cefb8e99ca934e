"""Preprocessing: `chexflow preprocess` vs a plain one-process PIL-to-TFRecord loop, and the
PNG-decode limit. Each side is a whole command in the trainer environment, timed end to end.

    python -m chexflow.bench.preprocessing plain|decode CSV IMAGES OUT SIZE   (one side)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chexflow.bench.core import Result, Side, compare
from chexflow.envs import trainer_python


def plain_loop(csv_path: Path, images: Path, out: Path, size: int) -> int:
    """The baseline a user would write: one process, PIL decode, resize, tf.train.Example."""
    import csv

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    n = 0
    with open(csv_path) as f, tf.io.TFRecordWriter(str(out)) as writer:
        rows = csv.reader(f)
        next(rows)
        for row in rows:
            img = Image.open(images / row[0]).convert("L").resize((size, size))
            px = np.asarray(img, dtype=np.uint8)
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[px.tobytes()])),
                "image_index": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[row[0].encode()])
                ),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
            n += 1
    return n


def decode_only(csv_path: Path, images: Path) -> int:
    """The limit: PNG decoding alone, one process."""
    import csv

    from PIL import Image

    n = 0
    with open(csv_path) as f:
        rows = csv.reader(f)
        next(rows)
        for row in rows:
            Image.open(images / row[0]).load()
            n += 1
    return n


def _timed(cmd: list[str], images: int) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return images / (time.perf_counter() - start)


def run(work: Path, images: int, source_px: int, size: int, workers: int, repeats: int) -> Result:
    work.mkdir(parents=True, exist_ok=True)
    raw = work / "raw"
    if not (raw / "Data_Entry_2017.csv").exists():
        subprocess.run([sys.executable, "-m", "chexflow.cli", "data", "synth", "--out", str(raw),
                        "--images", str(images), "--size", str(source_px)],
                       check=True, capture_output=True)
    csv_path, image_dir = raw / "Data_Entry_2017.csv", raw / "images"
    py = str(trainer_python())

    def chexflow_side() -> float:
        out = Path(tempfile.mkdtemp(prefix="pre-", dir=work))
        return _timed([sys.executable, "-m", "chexflow.cli", "preprocess", "--csv", str(csv_path),
                       "--images", str(image_dir), "--out", str(out), "--image-size", str(size),
                       "--workers", str(workers)], images)

    def plain_side() -> float:
        out = Path(tempfile.mkdtemp(prefix="plain-", dir=work)) / "plain.tfrecord"
        return _timed([py, "-m", __name__, "plain", str(csv_path), str(image_dir), str(out),
                       str(size)], images)

    result = compare(
        "preprocessing", "images/s",
        Side(f"chexflow preprocess ({workers} workers)", chexflow_side),
        Side("plain PIL loop (1 process)", plain_side),
        repeats=repeats, goal=1.8,
        notes={"images": images, "source_px": source_px, "image_size": size, "workers": workers},
    )
    decode = [_timed([py, "-m", __name__, "decode", str(csv_path), str(image_dir), "-", "0"],
                     images) for _ in range(repeats)]
    limit = sorted(decode)[len(decode) // 2] * workers
    result.notes.update(
        png_decode_images_per_sec=sorted(decode)[len(decode) // 2],
        limit_images_per_sec=limit,
        fraction_of_limit=result.median_a / limit,
    )
    return result


if __name__ == "__main__":
    mode, csv_arg, images_arg, out_arg, size_arg = sys.argv[1:6]
    if mode == "plain":
        plain_loop(Path(csv_arg), Path(images_arg), Path(out_arg), int(size_arg))
    else:
        decode_only(Path(csv_arg), Path(images_arg))
