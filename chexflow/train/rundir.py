"""Checks on a training run's inputs and its --out folder, without TensorFlow.

The launcher runs them before starting any worker; rank 0 of the workers runs them again (an
MPIJob starts the workers directly). A non-empty --out must be an earlier run of the same
model, image size and data (it is then resumed); anything else is refused, never overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import zipfile
from pathlib import Path

from chexflow.data.manifest import Manifest, load_manifest, split_identity, verify_shards
from chexflow.errors import ChexflowError
from chexflow.limits import (
    MAX_COUNT,
    MAX_CYCLE_MS,
    MAX_FUSION_MB,
    MAX_IMAGE_SIZE,
    MAX_LR,
    MAX_SEED,
    MAX_WEIGHT_DECAY,
    check_range,
)
from chexflow.runlock import LOCK_FILE
from chexflow.train.options import MODELS

RUN_FILE = "run.json"
# The classes of a model's outputs, in order, and its image size travel inside best_model.keras
# (a zip file), so that they go with the model when it is copied alone: under this key of the
# metadata.json Keras writes there. Files written before 2026-11-25 hold them in a member of
# their own, LEGACY_MODEL_INFO (which keras.models.load_model cannot read past; chexflow's
# models.load_model can).
MODEL_INFO = "metadata.json:chexflow"
KERAS_METADATA = "metadata.json"
LEGACY_MODEL_INFO = "chexflow.json"
# run.json fields that must match for a rerun to resume the same run
RESUME_KEYS = ("model", "image_size", "data", "synthetic_data", "shuffle_labels", "data_split")


class RunError(ChexflowError, ValueError):
    """Bad training options or an --out that holds something else."""


def run_identity(args: argparse.Namespace) -> dict:
    return {
        "model": args.model,
        "image_size": args.image_size,
        "data": str(Path(args.data).resolve()) if args.data else None,
        "synthetic_data": bool(args.synthetic_data),
        "shuffle_labels": bool(args.shuffle_labels),
        # which images are in which split: data preprocessed again in the same folder differs
        "data_split": split_identity(Path(args.data)) if args.data else None,
    }


def _copy_zip(src: Path, dst: Path, change) -> None:
    """dst: src's members in src's order, each member's bytes through change(name, data);
    a member for which it returns None is left out."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for member in zin.infolist():
            data = change(member.filename, zin.read(member.filename))
            if data is not None:
                zout.writestr(member, data)


def embed_model_info(model: Path, classes: list[str], image_size: int) -> None:
    """Add the MODEL_INFO to a .keras file Keras has just written: its metadata.json is rewritten,
    every member kept in Keras' order (tf-keras 2.20 on Python 3.12.1 fails to read a .keras
    file with a member of chexflow's own: OutOfRangeError in zipfile's seek)."""

    def add_info(name: str, data: bytes) -> bytes:
        if name != KERAS_METADATA:
            return data
        meta = json.loads(data)
        meta["chexflow"] = {"classes": classes, "image_size": image_size}
        return json.dumps(meta).encode()

    tmp = model.with_name(model.name + ".info")
    _copy_zip(model, tmp, add_info)
    tmp.replace(model)


def model_info(model: Path) -> dict | None:
    """The MODEL_INFO stored in a .keras file (or in its older member); None for a file without
    it (or not a zip)."""
    try:
        with zipfile.ZipFile(model) as zf:
            names = zf.namelist()
            if LEGACY_MODEL_INFO in names:
                return json.loads(zf.read(LEGACY_MODEL_INFO))
            return json.loads(zf.read(KERAS_METADATA)).get("chexflow")
    except (OSError, KeyError, ValueError, AttributeError, zipfile.BadZipFile):
        return None


def check_options(args: argparse.Namespace) -> None:
    """Every training option within its range (chexflow.limits), before any worker starts: by
    the launcher, by rank 0, and by the pipelines' train step (before its job, and in
    `chexflow run` before any step). A `data` that another step will make may stand for it."""
    if args.model not in MODELS:
        raise RunError(f"--model {args.model!r}: expected one of {', '.join(MODELS)}")
    for name in ("epochs", "batch_size", "image_size", "steps_per_epoch", "threads",
                 "backward_passes_per_step"):
        check_range(f"--{name.replace('_', '-')}", getattr(args, name), 1, cap=MAX_COUNT)
    check_range("--fusion-threshold-mb", args.fusion_threshold_mb, 0, cap=MAX_FUSION_MB)
    check_range("--cycle-time-ms", args.cycle_time_ms, 0, above=True, cap=MAX_CYCLE_MS)
    if args.image_size < 32:
        raise RunError(f"--image-size {args.image_size}: Keras' models need at least 32 px")
    check_range("--image-size", args.image_size, 32, cap=MAX_IMAGE_SIZE)
    check_range("--validation-steps", args.validation_steps, 1,
                hint=" (leave it out to validate on the whole split)", cap=MAX_COUNT)
    check_range("--lr", args.lr, 0, above=True, cap=MAX_LR)
    check_range("--weight-decay", args.weight_decay, 0, cap=MAX_WEIGHT_DECAY)
    if not 0 <= args.bn_momentum < 1:
        raise RunError(f"--bn-momentum {args.bn_momentum}: expected a number from 0 to below 1")
    check_range("--warmup-steps", args.warmup_steps, 0, cap=MAX_COUNT)
    check_range("--lr-warmup-epochs", args.lr_warmup_epochs, 0)
    check_range("--seed", args.seed, 0, MAX_SEED)
    if args.data is None and not args.synthetic_data:
        raise RunError("--data is required (or --synthetic-data for a throughput run)")
    if args.shuffle_labels and args.synthetic_data:
        raise RunError("--shuffle-labels needs real --data, not --synthetic-data")
    if args.weights not in ("none", "imagenet") and not os.path.exists(args.weights):
        raise RunError(
            f"--weights {args.weights}: no such file (expected none, imagenet, a Keras .h5 "
            f"backbone weights file or a .keras model written by chexflow train)"
        )


def check_data(args: argparse.Namespace, workers: int) -> Manifest | None:
    """Load and verify the manifest and the train/val shards; None for synthetic-only runs."""
    if args.data is None:
        return None
    manifest = load_manifest(args.data, args.image_size)
    verify_shards(manifest, "train")
    if manifest.images("val"):
        verify_shards(manifest, "val")
    if not args.synthetic_data and manifest.images("train") < args.batch_size * workers:
        raise RunError(
            f"{args.data}/manifest.json: {manifest.images('train')} training images, fewer than "
            f"one step of --batch-size {args.batch_size} x {workers} workers"
        )
    return manifest


def check_out(args: argparse.Namespace) -> dict | None:
    """The earlier run in --out to resume (its run.json), or None for a fresh folder."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out}: exists and is not a folder")
    if not out.exists() or not any(p.name != LOCK_FILE for p in out.iterdir()):
        return None
    run_file = out / RUN_FILE
    if not run_file.is_file():
        raise RunError(
            f"--out {out}: not empty and not a chexflow training run (no {RUN_FILE}); choose an "
            f"empty or new folder so nothing there is overwritten"
        )
    earlier = json.loads(run_file.read_text())
    mine = run_identity(args)
    # a run recorded before data_split was kept: its data's split is not known
    diff = [k for k in RESUME_KEYS if earlier.get(k) != mine[k] and k in earlier]
    if diff == ["data_split"]:
        raise RunError(
            f"--out {out}: was trained on another split of --data {args.data} (its splits.csv "
            f"has changed since: preprocessed again?); resuming would mix its train and "
            f"validation patients; use a new --out"
        )
    if diff:
        what = ", ".join(f"{k}: {earlier.get(k)!r} there, {mine[k]!r} now" for k in diff)
        raise RunError(
            f"--out {out}: holds a different run ({what}); use a new --out or the same options "
            f"to resume it"
        )
    return earlier


def check_all(args: argparse.Namespace, workers: int) -> Manifest | None:
    check_options(args)
    manifest = check_data(args, workers)
    check_out(args)
    return manifest
