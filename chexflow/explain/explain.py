"""`chexflow explain`: Grad-CAM maps of image files as PNG overlays (trainer environment).

--out gets one PNG per image (the image, then each class's map over it with its probability),
maps.npz (the maps, float16 in 0..1, and the probabilities) and explain.json (which file is
which image, the layer, the classes). Every image must be readable: one that is not ends the
command before anything is written. The folder is staged and swapped in when complete
(chexflow.data.output.StagedOutput, as evaluate's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chexflow.data.output import StagedOutput
from chexflow.errors import ChexflowError
from chexflow.evaluate.insight_plots import explain_figure, save
from chexflow.explain.inputs import collect, load
from chexflow.limits import check_range

INDEX, MAPS = "explain.json", "maps.npz"


class ExplainError(ChexflowError, ValueError):
    """Bad explain options or an unreadable image."""


def previous_outputs(out: Path, overwrite: bool) -> list[str]:
    """The files an earlier `chexflow explain` wrote into OUT (its explain.json lists them),
    which this one replaces with --overwrite."""
    index = out / INDEX
    if not index.is_file():
        return []
    if not overwrite:
        raise ExplainError(f"--out {out}: holds an earlier explanation ({INDEX}); pass "
                           "--overwrite to replace it or choose another folder")
    try:
        return [INDEX, MAPS, *(i["png"] for i in json.loads(index.read_text())["images"])]
    except (ValueError, KeyError, TypeError) as e:
        raise ExplainError(f"{index}: not an index chexflow explain wrote ({e})") from None


def chosen_classes(classes: list[str], wanted: list[str] | None) -> list[int]:
    """The indices of --class names (all classes when none is given)."""
    if not wanted:
        return list(range(len(classes)))
    unknown = [w for w in wanted if w not in classes]
    if unknown:
        raise ExplainError(f"--class {unknown[0]}: not a class of the model (its classes: "
                           f"{', '.join(classes)})")
    return [classes.index(w) for w in wanted]


def png_names(paths: list[Path]) -> list[str]:
    """One PNG name per image: its file name's stem, numbered where two stems are the same."""
    seen: dict[str, int] = {}
    names = []
    for path in paths:
        stem = path.stem or path.name
        seen[stem] = seen.get(stem, 0) + 1
        names.append(f"{stem}.png" if seen[stem] == 1 else f"{stem}-{seen[stem]}.png")
    return names


def read_all(paths: list[Path], size: int) -> np.ndarray:
    """Every image's pixels [n, size, size, 1]; ExplainError naming the first unreadable."""
    images = []
    for path in paths:
        pixels, why = load(path, size)
        if pixels is None:
            raise ExplainError(f"IMAGE {path}: {why}")
        images.append(pixels)
    return np.stack(images)


def explain(model_path: Path, inputs: list[Path], out: Path, wanted: list[str] | None = None,
            layer: str | None = None, batch_size: int = 32, overwrite: bool = False) -> dict:
    """Write the overlays, maps.npz and explain.json into OUT; return explain.json's content."""
    from chexflow.evaluate.gradcam import GradCam
    from chexflow.explain.model import load as load_model

    check_range("--batch-size", batch_size, 1)
    out = Path(out)
    previous_outputs(out, overwrite)
    paths = collect(inputs)
    model, classes = load_model(model_path)
    picked = chosen_classes(classes, wanted)
    images = read_all(paths, int(model.input_shape[1]))
    cam = GradCam(model, layer)
    maps, probs = cam.all_classes(images, batch_size, picked)
    names = [classes[k] for k in picked]
    index = {"model": str(model_path), "layer": cam.layer, "cells": list(cam.cells),
             "classes": names, "images": []}
    with StagedOutput(out, "explain") as stage:
        replaces = previous_outputs(out, overwrite)
        for path, png, image, m, p in zip(paths, png_names(paths), images, maps, probs,
                                          strict=True):
            save(explain_figure(path.name, image, m, p[picked], names), stage.dir / png)
            index["images"].append({"image": str(path), "png": png,
                                    "probs": dict(zip(classes, map(float, p), strict=True))})
        np.savez_compressed(stage.dir / MAPS, images=np.array([str(p) for p in paths]),
                            classes=np.array(names), maps=maps.astype(np.float16),
                            probs=probs, all_classes=np.array(classes))
        (stage.dir / INDEX).write_text(json.dumps(index, indent=2))
        stage.commit(replaces)
    return index
