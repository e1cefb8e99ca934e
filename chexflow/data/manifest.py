"""Reading the output of `chexflow preprocess` (manifest.json and its TFRecord shards) for
training and evaluation, without TensorFlow.

The checks run before any Horovod process starts, so bad input fails in a second with a
message naming the file: a missing manifest or shard, a manifest written for another image
size, a truncated or corrupt shard (TFRecord framing), a shard whose record count differs
from the manifest, a shard whose first record disagrees with the manifest's image_size or
classes.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from chexflow.data.example import example_features
from chexflow.data.split import SPLITS
from chexflow.errors import ChexflowError


class DatasetError(ChexflowError, ValueError):
    """The preprocessed data cannot be used for training or evaluation; the message names
    the file."""


@dataclass(frozen=True)
class Shard:
    path: Path
    images: int


@dataclass(frozen=True)
class Manifest:
    """The parts of manifest.json the trainer and evaluator need."""

    root: Path
    classes: tuple[str, ...]
    image_size: int
    splits: dict[str, list[Shard]]
    label_counts: dict[str, dict[str, int]]

    def images(self, split: str) -> int:
        return sum(s.images for s in self.splits[split])


def load_manifest(data_dir: Path, image_size: int | None = None) -> Manifest:
    """Read DATA/manifest.json; with image_size, insist that the data was made at that size."""
    path = Path(data_dir) / "manifest.json"
    if not path.is_file():
        raise DatasetError(
            f"--data {data_dir}: no manifest.json there; run `chexflow preprocess --out "
            f"{data_dir}` first"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON ({e})") from e
    for key in ("classes", "image_size", "splits"):
        if key not in raw:
            raise DatasetError(f"{path}: field {key!r} missing; is this a chexflow manifest?")
    if raw.get("plan_only"):
        raise DatasetError(f"{path}: written by `preprocess --plan-only`: it has no TFRecords")
    if raw.get("channels", 1) != 1 or raw.get("encoding", "raw-uint8") != "raw-uint8":
        raise DatasetError(
            f"{path}: channels={raw.get('channels')} encoding={raw.get('encoding')!r}; "
            f"expected channels=1, encoding 'raw-uint8'"
        )
    size = int(raw["image_size"])
    if image_size is not None and size != image_size:
        raise DatasetError(
            f"{path}: image_size is {size} px but --image-size is {image_size}; run "
            f"`chexflow preprocess --image-size {image_size}` or pass --image-size {size}"
        )
    splits, counts = {}, {}
    for split in SPLITS:
        entry = raw["splits"].get(split)
        if entry is None:
            raise DatasetError(f"{path}: splits.{split} missing")
        splits[split] = [
            Shard(Path(data_dir) / s["path"], int(s["images"])) for s in entry.get("shards", [])
        ]
        counts[split] = dict(entry.get("labels", {}))
    return Manifest(Path(data_dir), tuple(raw["classes"]), size, splits, counts)


def split_identity(data_dir: Path) -> str | None:
    """A digest of which image of which patient DATA puts in which split (from its splits.csv,
    whatever the rows' order): data preprocessed again with another split gets another one.
    None when there is no readable splits.csv (data from an older chexflow)."""
    path = Path(data_dir) / "splits.csv"
    try:
        with open(path, newline="") as f:
            rows = sorted(f"{r['split']},{r['patient_id']},{r['image_index']}"
                          for r in csv.DictReader(f))
    except (OSError, KeyError, UnicodeError, csv.Error):
        return None
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def first_record(path: Path) -> bytes:
    """The data of a TFRecord file's first record (after count_records found its framing)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(12)[:8])
        return f.read(length)


def check_first_record(manifest: Manifest, shard: Shard) -> None:
    """A shard's first record holds an image of the manifest's image_size (as pixels: height,
    width, and height x width bytes) and one label and mask value per class."""
    source = f"{manifest.root}/manifest.json"
    try:
        features = example_features(first_record(shard.path))
    except ValueError as e:
        raise DatasetError(f"{shard.path}: its first record is {e}") from None
    missing = [k for k in ("image", "labels", "mask") if not features.get(k)]
    if missing:
        raise DatasetError(f"{shard.path}: its first record has no {missing[0]!r} feature; not "
                           f"written by chexflow preprocess")
    size = manifest.image_size
    height, width = (features.get(k, [None])[0] for k in ("height", "width"))
    pixels = len(features["image"][0])
    if (height, width) != (size, size) or pixels != size * size:
        held = f"{height}x{width} px images" if height and width and pixels == height * width \
            else f"an image of {pixels} bytes"
        raise DatasetError(
            f"{source}: image_size is {size}, but {shard.path} holds {held} (its first record); "
            f"the manifest does not describe these shards: preprocess again"
        )
    for key in ("labels", "mask"):
        if len(features[key]) != len(manifest.classes):
            raise DatasetError(
                f"{source}: classes lists {len(manifest.classes)}, but the first record of "
                f"{shard.path} holds {len(features[key])} {key}; the manifest does not describe "
                f"these shards: preprocess again"
            )


def count_records(path: Path) -> int:
    """Records in one TFRecord file, walking its framing (length, crc, data, crc).

    Raises DatasetError for a file that is truncated or whose length fields are garbage.
    """
    size = os.path.getsize(path)
    n = 0
    pos = 0
    with open(path, "rb") as f:
        while pos < size:
            header = f.read(12)
            if len(header) < 12:
                raise DatasetError(f"{path}: corrupt TFRecord: truncated header at byte {pos}")
            (length,) = struct.unpack("<Q", header[:8])
            end = pos + 12 + length + 4
            if end > size:
                raise DatasetError(
                    f"{path}: corrupt TFRecord: record {n} at byte {pos} claims {length} bytes, "
                    f"past the end of the {size}-byte file (truncated or not a TFRecord)"
                )
            f.seek(end)
            pos = end
            n += 1
    return n


def verify_shards(manifest: Manifest, split: str, shards: list[Shard] | None = None) -> int:
    """Check that every shard of a split exists and holds the records the manifest says, of its
    image size and classes."""
    shards = manifest.splits[split] if shards is None else shards
    if not shards:
        raise DatasetError(f"{manifest.root}/manifest.json: split {split!r} has no shards")
    total = 0
    for shard in shards:
        if not shard.path.is_file():
            raise DatasetError(
                f"{shard.path}: TFRecord shard listed in {manifest.root}/manifest.json is missing"
            )
        found = count_records(shard.path)
        if found != shard.images:
            raise DatasetError(
                f"{shard.path}: {found} records, but manifest.json lists {shard.images}"
            )
        if found:
            check_first_record(manifest, shard)
        total += found
    if total == 0:
        raise DatasetError(
            f"{manifest.root}/manifest.json: split {split!r} has no images; nothing to "
            f"{'train on' if split == 'train' else 'evaluate'}"
        )
    return total
