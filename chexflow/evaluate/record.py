"""The model's run record (run.json, written by `chexflow train` beside best_model.keras)
against the data to evaluate: the model must have been trained on the data's class names, in
the data's order, and at its image size. Without TensorFlow."""

from __future__ import annotations

import json
from pathlib import Path

from chexflow.data.manifest import DatasetError, Manifest, load_manifest
from chexflow.errors import ChexflowError
from chexflow.train.rundir import RUN_FILE, model_info


class ModelMismatch(ChexflowError, ValueError):
    """The model was trained on other classes or another image size than the data has."""


def run_record(model: Path) -> tuple[Path, dict] | None:
    """(path, content) of the run.json of a model file or run folder; None without one."""
    model = Path(model)
    path = (model if model.is_dir() else model.parent) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelMismatch(f"--model {model}: its run record {path} is unreadable ({e})") from e


def trained_classes(record: dict) -> list[str] | None:
    """The record's classes; a run recorded before they were kept: its data's manifest's."""
    if record.get("classes"):
        return list(record["classes"])
    if record.get("data"):
        try:
            return list(load_manifest(Path(record["data"])).classes)
        except DatasetError:
            return None
    return None


def model_file(model: Path) -> Path:
    """The .keras file of --model (a file, or a run folder holding best_model.keras)."""
    model = Path(model)
    return model / "best_model.keras" if model.is_dir() else model


def check_model_fits(model: Path, manifest: Manifest) -> None:
    """Refuse, in one line, a model whose run record (or, for a model file without one, the
    classes and image size stored in the file: rundir.MODEL_INFO) names another image size or other
    classes, or the same in another order, than DATA/manifest.json. A model with neither, from
    an older chexflow, is checked by shape only. The classes are not remapped: a model is
    evaluated in the order it was trained in, on data preprocessed in that order."""
    found = run_record(model)
    if found is not None:
        source, record = f"run record {found[0]}", found[1]
    else:
        record = model_info(model_file(model))
        if record is None:
            return
        source = f"the classes and size stored in {model_file(model)}"
    data = f"{manifest.root}/manifest.json"
    size = record.get("image_size")
    if size is not None and size != manifest.image_size:
        raise ModelMismatch(
            f"--model {model} takes {size} px images ({source}); {data} has "
            f"{manifest.image_size} px images: preprocess with --image-size {size}"
        )
    classes = trained_classes(record)
    if classes is None or classes == list(manifest.classes):
        return
    theirs = list(manifest.classes)
    if len(classes) != len(theirs):
        detail = f"{len(classes)} classes there, {len(theirs)} in {data}"
    else:
        i = next(i for i, (a, b) in enumerate(zip(classes, theirs, strict=True)) if a != b)
        order = " (the same names in another order)" if sorted(classes) == sorted(theirs) else ""
        detail = f"class {i + 1} is {classes[i]!r} there and {theirs[i]!r} in {data}{order}"
    raise ModelMismatch(
        f"--model {model} was trained on other classes than the data's ({source}: "
        f"{detail}); evaluate it on data preprocessed from the same dataset format"
    )

