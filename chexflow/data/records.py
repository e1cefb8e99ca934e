"""The row every dataset reader produces, the rejections it reports, and the TFRecord schema."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from chexflow.errors import ChexflowError

REJECTED_FIELDS = ("source_file", "source_row", "image", "reason")
# the splits preprocess writes, by patient
SPLITS = ("train", "val", "test")

# The TFRecord schema: one tf.train.Example per image, features image, height, width, labels,
# mask, image_index and patient_id. image: raw uint8 greyscale pixels, height*width bytes
# (decoded once at preprocessing time so training spends no time in PNG decoding); labels/mask:
# float lists of len(classes) where mask 0 marks a label to ignore (CheXpert's U-Ignore);
# image_index, patient_id: bytes.


class DataError(ChexflowError, ValueError):
    """Input that cannot be used at all; the message names the file, row or field."""


@dataclass
class Record:
    """One image of a dataset, with its labels in the dataset's class order."""

    image_index: str  # file name as the CSV gives it (NIH) or the CSV's relative path (CheXpert)
    path: Path  # where the image file is
    patient_id: str
    labels: list[float]  # 1.0 / 0.0 per class
    mask: list[float]  # 1.0 when the label is known, 0.0 to ignore it
    source_row: int  # 1-based line number in the CSV, header = line 1
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class Rejection:
    """A row or image that was not used, and why."""

    source_file: str
    source_row: int | str
    image: str
    reason: str


def write_rejections(path: Path, rejections: list[Rejection]) -> None:
    """Write rejected.csv: one line per rejected row or image, with the reason."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REJECTED_FIELDS)
        for r in rejections:
            writer.writerow([r.source_file, r.source_row, r.image, r.reason])
