"""Checks on a training run's inputs and its --out folder, without TensorFlow.

The launcher runs them before starting any worker; rank 0 of the workers runs them again (an
MPIJob starts the workers directly). A non-empty --out must be an earlier run of the same
model, image size and data (it is then resumed); anything else is refused, never overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import zipfile
from pathlib import Path

from chexflow.data import faults
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
# metadata.json Keras writes there. Files of older chexflow versions hold them in a member of
# their own, LEGACY_MODEL_INFO (which keras.models.load_model cannot read past; chexflow's
# models.load_model can).
MODEL_INFO = "chexflow"
KERAS_METADATA = "metadata.json"
LEGACY_MODEL_INFO = "chexflow.json"
# run.json fields that must match for a rerun to resume the same run
RESUME_KEYS = ("model", "image_size", "data", "synthetic_data", "shuffle_labels", "data_split")
# Files a write cut short leaves in a run folder: the temporary files of the atomic writes (the
# best model, run.json, metrics.json, state.json, TensorFlow's `checkpoint` list) and the folders
# TensorFlow saves a checkpoint's shards into before it merges them into ckpt-N.index and .data-*.
PARTIAL_FILES = ("best_model.tmp.keras", "best_model.tmp.keras.info", "run.tmp", "metrics.tmp",
                 "checkpoints/state.tmp", "checkpoints/checkpoint.tmp*", "checkpoints/ckpt-*_temp")


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


def state_file(out: Path) -> Path:
    """The run's state (epochs trained, history, best model): rewritten after every epoch."""
    return Path(out) / "checkpoints" / "state.json"


def read_state(out: Path) -> dict:
    """The run's state ({} before its first epoch). A damaged one is one line naming it: it alone
    records the history and the best model's val_loss (which decides whether a later epoch
    replaces best_model.keras), so the run is not resumed without it."""
    path = state_file(out)
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except faults.FAULTS as e:
        raise RunError(f"{path}: {faults.cause(e)}") from None
    except ValueError as e:
        raise RunError(f"{path}: not valid JSON ({e}); {_state_advice(out)}") from None
    epoch = state.get("epoch") if isinstance(state, dict) else None
    if not isinstance(epoch, int) or epoch < 0:
        raise RunError(f"{path}: no epoch number (\"epoch\": N) in it; {_state_advice(out)}")
    return state


def _state_advice(out: Path) -> str:
    return (f"it records the epochs trained and the best model's val_loss, which the checkpoints "
            f"do not hold; restore it from a copy, or train into a new --out (nothing in {out} "
            f"was changed)")


def checkpoint_prefix(out: Path, epoch: int) -> Path:
    """ckpt-EPOCH: the checkpoint (model + optimizer) saved after that epoch."""
    return Path(out) / "checkpoints" / f"ckpt-{epoch}"


def checkpoint_missing(prefix: Path) -> str | None:
    """Which file of a checkpoint is missing (its index or its data), or None."""
    if not Path(f"{prefix}.index").is_file():
        return f"{prefix}.index: missing"
    if not any(prefix.parent.glob(f"{prefix.name}.data-*")):
        return f"{prefix}.data-00000-of-00001: missing"
    return None


def saved_epochs(out: Path, last: int) -> list[int]:
    """The epochs to resume after, newest first: `last` (the epoch state.json records, whether or
    not its checkpoint is there), then each earlier one with a checkpoint index in the folder."""
    found = {int(p.name[5:-6]) for p in (Path(out) / "checkpoints").glob("ckpt-*.index")
             if p.name[5:-6].isdigit()}
    return [last, *sorted((e for e in found if 0 < e < last), reverse=True)]


def resumable_epoch(out: Path) -> int | None:
    """The epoch a rerun resumes after: the newest of saved_epochs whose checkpoint files are
    all there (whether they read whole only TensorFlow can tell); None when none is."""
    try:
        state = read_state(out)
    except RunError:
        return None
    if not state.get("epoch"):
        return None
    return next((e for e in saved_epochs(out, state["epoch"])
                 if checkpoint_missing(checkpoint_prefix(out, e)) is None), None)


def remove_partial(out: Path, *also: str) -> list[Path]:
    """Remove the PARTIAL_FILES of a run folder (and the glob patterns `also`, relative to it):
    the remains of writes cut short by a fault or a kill. Returns what was removed."""
    out = Path(out)
    found = [p for pattern in (*PARTIAL_FILES, *also) for p in out.glob(pattern)]
    for path in found:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return found


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
        meta[MODEL_INFO] = {"classes": classes, "image_size": image_size}
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
            return json.loads(zf.read(KERAS_METADATA)).get(MODEL_INFO)
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
    earlier = _read_run_file(run_file)
    read_state(out)  # a damaged one is named now, before any worker starts
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


def _read_run_file(path: Path) -> dict:
    """run.json, which identifies the run --out holds (its model, image size, data)."""
    advice = "it identifies the run this --out holds; restore it from a copy, or train into a " \
             "new --out"
    try:
        record = json.loads(path.read_text())
    except faults.FAULTS as e:
        raise RunError(f"{path}: {faults.cause(e)}") from None
    except ValueError as e:
        raise RunError(f"{path}: not valid JSON ({e}); {advice}") from None
    if not isinstance(record, dict):
        raise RunError(f"{path}: not a JSON object; {advice}")
    return record


def check_all(args: argparse.Namespace, workers: int) -> Manifest | None:
    check_options(args)
    manifest = check_data(args, workers)
    check_out(args)
    return manifest
