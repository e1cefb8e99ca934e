"""`chexflow preprocess`: validate rows, split by patient, write sharded TFRecords + manifest."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

import chexflow
from chexflow.data.chexpert import CHEXPERT_CLASSES, read_chexpert
from chexflow.data.nih import read_nih
from chexflow.data.records import DataError, Record, Rejection, write_rejections
from chexflow.data.split import NIH_LIST_FILES, SPLITS, split_by_lists, split_random
from chexflow.data.tfrecords import ShardResult, write_shards
from chexflow.pathologies import PATHOLOGIES

OUTPUT_FILES = ("manifest.json", "rejected.csv", "splits.csv")
MANIFEST_VERSION = 1


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
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare_output(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty output unless --overwrite; then remove only chexflow's own outputs."""
    if not out.exists():
        out.mkdir(parents=True)
        return
    if not out.is_dir():
        raise DataError(f"--out {out}: exists and is not a directory")
    existing = list(out.iterdir())
    if not existing:
        return
    if not overwrite:
        raise DataError(
            f"--out {out}: not empty ({len(existing)} entries); pass --overwrite to replace "
            f"chexflow's outputs there (manifest.json, rejected.csv, splits.csv, split folders)"
        )
    for entry in existing:
        if entry.name in OUTPUT_FILES:
            entry.unlink()
        elif entry.name in SPLITS and entry.is_dir():
            foreign = [p.name for p in entry.iterdir() if not p.name.endswith(".tfrecord")]
            if foreign:
                raise DataError(
                    f"--overwrite: {entry} holds files chexflow did not write: {foreign[:5]}"
                )
            shutil.rmtree(entry)
        else:
            raise DataError(
                f"--overwrite: {out} holds {entry.name!r}, which chexflow did not write; "
                f"choose an empty --out so nothing of yours is replaced"
            )


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


def plan_shards(split: str, records: list[Record], per_shard: int, out: Path):
    """Cut a split into shards of at most per_shard images: (relative path, records)."""
    n = max(1, math.ceil(len(records) / per_shard)) if records else 0
    for k in range(n):
        chunk = records[k::n]
        yield f"{split}/{split}-{k:05d}-of-{n:05d}.tfrecord", chunk


def run_shards(cfg: PreprocessConfig, tasks: list[tuple[str, list[Record]]]) -> list[ShardResult]:
    """Write all shards with a progress bar; images are decoded by cfg.workers processes."""
    total = sum(len(recs) for _, recs in tasks)
    shards = [(str(cfg.out / rel), recs) for rel, recs in tasks]
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


def preprocess(cfg: PreprocessConfig) -> dict:
    """Run the whole step; return the manifest (also written to OUT/manifest.json)."""
    started = time.time()
    records, rejections, classes = read_records(cfg)
    csv_rows = len(records) + len(rejections)
    prepare_output(cfg.out, cfg.overwrite)
    if cfg.split_lists:
        known = {r.image_index for r in records} | {r.image for r in rejections}
        splits, unlisted = split_by_lists(records, known, cfg.split_lists, cfg.fractions, cfg.seed)
        for r in unlisted:
            r.source_file = str(cfg.csv)
        rejections += unlisted
        split_info = {
            "method": "nih-lists",
            "lists": {n: sha256_file(cfg.split_lists / n) for n in NIH_LIST_FILES},
            "train_val_fractions": cfg.fractions[:2],
            "seed": cfg.seed,
        }
    else:
        splits = split_random(records, cfg.fractions, cfg.seed)
        split_info = {"method": "random-by-patient", "fractions": cfg.fractions, "seed": cfg.seed}

    shards: dict[str, list[dict]] = {s: [] for s in SPLITS}
    converted: Counter = Counter()
    image_hashes: dict[str, list] = {s: [] for s in SPLITS}
    if not cfg.plan_only:
        for s in SPLITS:
            (cfg.out / s).mkdir(exist_ok=True)
        tasks = [
            t for s in SPLITS for t in plan_shards(s, splits[s], cfg.images_per_shard, cfg.out)
        ]
        for result in run_shards(cfg, tasks):
            rel = str(Path(result.path).relative_to(cfg.out))
            split = rel.split("/")[0]
            shards[split].append({"path": rel, "images": len(result.written)})
            rejections += result.rejections
            converted.update(result.converted)
            image_hashes[split] += result.image_hashes
        rejected_images = {r.image for r in rejections}
        splits = {
            s: [r for r in recs if r.image_index not in rejected_images]
            for s, recs in splits.items()
        }
        for s in SPLITS:
            shards[s].sort(key=lambda d: d["path"])

    with open(cfg.out / "splits.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image_index", "patient_id", "split", "source_row"])
        for s in SPLITS:
            for r in splits[s]:
                writer.writerow([r.image_index, r.patient_id, s, r.source_row])
    rejections.sort(
        key=lambda r: (str(r.source_file), int(r.source_row) if str(r.source_row).isdigit() else 0)
    )
    write_rejections(cfg.out / "rejected.csv", rejections)

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
        "splits": {},
        "csv_rows": csv_rows,
        "accepted": sum(len(splits[s]) for s in SPLITS),
        "rejected": len(rejections),
        "converted_images": dict(converted),
        "seconds": round(time.time() - started, 2),
    }
    for s in SPLITS:
        entry = split_summary(splits[s], classes)
        entry["shards"] = shards[s]
        if image_hashes[s]:
            joined = "\n".join(f"{n} {h}" for n, h in sorted(image_hashes[s]))
            entry["images_sha256"] = hashlib.sha256(joined.encode()).hexdigest()
        manifest["splits"][s] = entry
    patients = [{r.patient_id for r in splits[s]} for s in SPLITS]
    manifest["patient_overlap"] = sum(
        len(a & b) for i, a in enumerate(patients) for b in patients[i + 1 :]
    )
    (cfg.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
