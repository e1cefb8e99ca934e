"""`chexflow preprocess`: validate rows, split by patient, write sharded TFRecords + manifest."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

import chexflow
from chexflow.data import faults
from chexflow.data.chexpert import CHEXPERT_CLASSES, read_chexpert
from chexflow.data.nih import read_nih
from chexflow.data.output import StagedOutput, previous_outputs, staging_dir
from chexflow.data.records import DataError, Record, Rejection, write_rejections
from chexflow.data.split import (
    NIH_LIST_FILES,
    SPLITS,
    sex_conflicts,
    split_by_lists,
    split_random,
)
from chexflow.data.tfrecords import ShardResult, write_shards
from chexflow.pathologies import PATHOLOGIES

MANIFEST_VERSION = 1
# Ranges of the numeric options: (flag, lowest, highest).
LIMITS = {
    "image_size": ("--image-size", 8, 4096),
    "workers": ("--workers", 1, 256),
    "images_per_shard": ("--images-per-shard", 1, 1_000_000),
    "seed": ("--seed", 0, 2**32 - 1),
}


@dataclass
class PreprocessConfig:
    format: str  # nih | chexpert
    csv: Path
    images: Path
    out: Path
    fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)
    split_lists: Path | None = None
    image_size: int = 224
    uncertain: str = "ones"
    seed: int = 0
    workers: int = 1
    images_per_shard: int = 1024
    plan_only: bool = False
    overwrite: bool = False


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with faults.reported(path), open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_options(cfg: PreprocessConfig) -> None:
    """Every numeric option within its range, checked before anything is read or written."""
    for name, (flag, low, high) in LIMITS.items():
        value = getattr(cfg, name)
        if not low <= value <= high:
            raise DataError(f"{flag} {value}: expected a whole number from {low} to {high}")


def read_records(cfg: PreprocessConfig) -> tuple[list[Record], list[Rejection], tuple[str, ...]]:
    if not cfg.csv.exists():
        raise DataError(f"--csv {cfg.csv}: file not found")
    if not cfg.plan_only and not cfg.images.is_dir():
        raise DataError(f"--images {cfg.images}: not a directory")
    if cfg.format == "nih":
        return (*read_nih(cfg.csv, cfg.images), PATHOLOGIES)
    if cfg.format == "chexpert":
        return (*read_chexpert(cfg.csv, cfg.images, cfg.uncertain), CHEXPERT_CLASSES)
    raise DataError(f"--format {cfg.format!r}: expected nih or chexpert")


def plan_shards(split: str, records: list[Record], per_shard: int):
    """Cut a split into shards of at most per_shard images: (relative path, records)."""
    n = max(1, math.ceil(len(records) / per_shard)) if records else 0
    for k in range(n):
        chunk = records[k::n]
        yield f"{split}/{split}-{k:05d}-of-{n:05d}.tfrecord", chunk


def run_shards(
    cfg: PreprocessConfig, root: Path, tasks: list[tuple[str, list[Record]]]
) -> list[ShardResult]:
    """Write all shards under root with a progress bar; cfg.workers processes decode images."""
    total = sum(len(recs) for _, recs in tasks)
    shards = [(str(root / rel), recs) for rel, recs in tasks]
    with tqdm(total=total, desc="preprocess", unit="img") as bar:
        return write_shards(shards, cfg.image_size, cfg.workers, str(cfg.csv), bar)


def split_summary(records: list[Record], classes: tuple[str, ...]) -> dict:
    counts = Counter()
    for r in records:
        for c, y, m in zip(classes, r.labels, r.mask, strict=True):
            if y and m:
                counts[c] += 1
    return {
        "images": len(records),
        "patients": len({r.patient_id for r in records}),
        "labels": {c: counts[c] for c in classes},
        "no_positive_label": sum(1 for r in records if not any(r.labels)),
    }


def first_reason(rejections: list[Rejection]) -> str:
    r = rejections[0]
    return f"e.g. {r.source_file} line {r.source_row}: {r.reason}"


def check_kept(splits: dict[str, list[Record]], rejections: list[Rejection], when: str) -> None:
    """A run that keeps no image, or leaves a split empty, is an error (exit 2), not a result."""
    if not any(splits.values()):  # rows were read, so there are rejections
        raise DataError(
            f"no image was accepted {when}: all {len(rejections)} were rejected, "
            f"{first_reason(rejections)}"
        )
    empty = [s for s in SPLITS if not splits[s]]
    if empty:
        kept = ", ".join(f"{s} {len(splits[s])}" for s in SPLITS)
        raise DataError(
            f"the {empty[0]} split is empty {when} ({kept} images); a split by patient needs "
            f"more images and patients, other --split fractions or another --seed"
            + (f"; {len(rejections)} rejected, {first_reason(rejections)}" if rejections else "")
        )


def preprocess(cfg: PreprocessConfig) -> dict:
    """Run the whole step; return the manifest (also written to OUT/manifest.json).

    Everything is written into a staging folder and swapped into cfg.out only when the run
    succeeded (chexflow.data.output); a failed run leaves cfg.out as it was.
    """
    check_options(cfg)
    if not staging_dir(cfg.out).exists():  # else an interrupted run is finished first (locked)
        previous_outputs(cfg.out, cfg.overwrite)  # refused before a lock file is made in OUT
    with StagedOutput(cfg.out, "preprocess") as stage:
        replaces = previous_outputs(cfg.out, cfg.overwrite)
        manifest = write_outputs(cfg, stage.dir)
        stage.commit(replaces)
    return manifest


def write_outputs(cfg: PreprocessConfig, root: Path) -> dict:
    """Read, validate, split and write shards, splits.csv, rejected.csv and manifest.json
    under root; return the manifest."""
    started = time.time()
    records, rejections, classes = read_records(cfg)
    csv_rows = len(records) + len(rejections)
    splits, split_info, unlisted = split_records(cfg, records, rejections)
    rejections += unlisted
    check_kept(splits, rejections, f"from {csv_rows} rows of {cfg.csv}")
    written = Shards()
    if not cfg.plan_only:
        written = write_split_shards(cfg, root, splits)
        rejections += written.rejections
        rejected_images = {r.image for r in rejections}
        splits = {s: [r for r in recs if r.image_index not in rejected_images]
                  for s, recs in splits.items()}
        check_kept(splits, rejections, "after reading the images")
    write_splits_csv(root / "splits.csv", splits)
    rejections.sort(
        key=lambda r: (str(r.source_file), int(r.source_row) if str(r.source_row).isdigit() else 0)
    )
    with faults.reported(root / "rejected.csv"):
        write_rejections(root / "rejected.csv", rejections)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "chexflow_version": chexflow.__version__,
        "format": cfg.format,
        "classes": list(classes),
        "image_size": cfg.image_size,
        "channels": 1,
        "encoding": "raw-uint8",
        "uncertain_policy": cfg.uncertain if cfg.format == "chexpert" else None,
        "plan_only": cfg.plan_only,
        "inputs": {"csv": {"path": str(cfg.csv), "sha256": sha256_file(cfg.csv)}},
        "split": split_info,
        "splits": {s: split_entry(splits[s], classes, written, s) for s in SPLITS},
        "csv_rows": csv_rows,
        "accepted": sum(len(splits[s]) for s in SPLITS),
        "rejected": len(rejections),
        "converted_images": dict(written.converted),
        "warnings": sex_conflicts([r for s in SPLITS for r in splits[s]]),
        "seconds": round(time.time() - started, 2),
        "patient_overlap": patient_overlap(splits),
    }
    with faults.reported(root / "manifest.json"):
        (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def split_records(cfg: PreprocessConfig, records: list[Record], rejections: list[Rejection]
                  ) -> tuple[dict[str, list[Record]], dict, list[Rejection]]:
    """The splits, how they were made (the manifest's "split"), and the rows the NIH lists
    leave out (rejections of their own)."""
    if not cfg.split_lists:
        splits = split_random(records, cfg.fractions, cfg.seed)
        return splits, {"method": "random-by-patient", "fractions": cfg.fractions,
                        "seed": cfg.seed}, []
    known = {r.image_index for r in records} | {r.image for r in rejections}
    splits, unlisted = split_by_lists(records, known, cfg.split_lists, cfg.fractions, cfg.seed)
    for r in unlisted:
        r.source_file = str(cfg.csv)
    return splits, {
        "method": "nih-lists",
        "lists": {n: sha256_file(cfg.split_lists / n) for n in NIH_LIST_FILES},
        "train_val_fractions": cfg.fractions[:2],
        "seed": cfg.seed,
    }, unlisted


@dataclass
class Shards:
    """What writing the shards gave: each split's shard files, the images rejected while
    reading them, the conversions made, and each split's (image, sha256) pairs."""

    files: dict[str, list[dict]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    rejections: list[Rejection] = field(default_factory=list)
    converted: Counter = field(default_factory=Counter)
    image_hashes: dict[str, list] = field(default_factory=lambda: {s: [] for s in SPLITS})


def write_split_shards(cfg: PreprocessConfig, root: Path,
                       splits: dict[str, list[Record]]) -> Shards:
    """Every split's TFRecord shards under root/SPLIT/."""
    with faults.reported(root):
        for s in SPLITS:
            (root / s).mkdir()
    tasks = [t for s in SPLITS for t in plan_shards(s, splits[s], cfg.images_per_shard)]
    out = Shards()
    for result in run_shards(cfg, root, tasks):
        rel = Path(result.path).relative_to(root).as_posix()
        split = rel.split("/")[0]
        out.files[split].append({"path": rel, "images": len(result.written)})
        out.rejections += result.rejections
        out.converted.update(result.converted)
        out.image_hashes[split] += result.image_hashes
    for s in SPLITS:
        out.files[s].sort(key=lambda d: d["path"])
    return out


def write_splits_csv(path: Path, splits: dict[str, list[Record]]) -> None:
    with faults.reported(path), open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image_index", "patient_id", "split", "source_row"])
        for s in SPLITS:
            for r in splits[s]:
                writer.writerow([r.image_index, r.patient_id, s, r.source_row])


def split_entry(records: list[Record], classes: tuple[str, ...], written: Shards,
                split: str) -> dict:
    """The manifest's entry of one split: its counts, shards and the hash of its images."""
    entry = split_summary(records, classes)
    entry["shards"] = written.files[split]
    if written.image_hashes[split]:
        joined = "\n".join(f"{n} {h}" for n, h in sorted(written.image_hashes[split]))
        entry["images_sha256"] = hashlib.sha256(joined.encode()).hexdigest()
    return entry


def patient_overlap(splits: dict[str, list[Record]]) -> int:
    """Patients found in two splits (0: the split is by patient)."""
    patients = [{r.patient_id for r in splits[s]} for s in SPLITS]
    return sum(len(a & b) for i, a in enumerate(patients) for b in patients[i + 1:])
