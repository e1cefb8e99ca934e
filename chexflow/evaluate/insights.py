"""What `chexflow evaluate` writes beside the AUROC (trainer environment): calibration.json and
reliability.png (chexflow.evaluate.calibration: ECE per class, and the 90%-specificity
threshold chosen on the validation split), and the Grad-CAM grid of the report, cam.png, with
its maps in cam.npz: for each class, the evaluated image it gave the highest probability."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chexflow.data.manifest import Manifest
from chexflow.evaluate.calibration import CALIBRATION_FILE, THRESHOLD_SPLIT, calibration_summary
from chexflow.evaluate.insight_plots import cam_grid_figure, reliability_figure, save

RELIABILITY_PNG, CAM_PNG, CAM_NPZ = "reliability.png", "cam.png", "cam.npz"
INSIGHT_OUTPUTS = (CALIBRATION_FILE, RELIABILITY_PNG, CAM_PNG, CAM_NPZ)


def _arrays(pred: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return pred["labels"], pred["probs"], pred["mask"]


def threshold_predictions(model, manifest: Manifest, split: str, pred: dict,
                          batch_size: int) -> dict | None:
    """The predictions of the split thresholds are chosen on (those of `split` when it is that
    split); None when the data have no such split or it is empty."""
    from chexflow.evaluate.predict import predict_split

    if split == THRESHOLD_SPLIT:
        return pred
    if sum(s.images for s in manifest.splits.get(THRESHOLD_SPLIT) or []) == 0:
        return None
    return predict_split(None, manifest, THRESHOLD_SPLIT, batch_size, model)


def write_calibration(classes, split: str, pred: dict, chosen_on: dict | None,
                      out: Path) -> dict:
    """calibration.json and reliability.png in OUT."""
    summary = calibration_summary(classes, split, _arrays(pred),
                                  None if chosen_on is None else _arrays(chosen_on))
    (out / CALIBRATION_FILE).write_text(json.dumps(summary, indent=2))
    save(reliability_figure(summary), out / RELIABILITY_PNG)
    return summary


def split_images(manifest: Manifest, split: str, wanted: set[str],
                 batch_size: int) -> dict[str, np.ndarray]:
    """The pixels (H, W, 1 uint8, as the model takes them) of the images of `split` named in
    `wanted`, read from its TFRecords."""
    from chexflow.train import data

    ds, _ = data.eval_dataset(manifest, split, batch_size)
    found: dict[str, np.ndarray] = {}
    for x, _, _, keys in ds:
        for image, key in zip(x.numpy(), keys.numpy().astype(str), strict=True):
            if key in wanted:
                found[key] = image
    return found


def write_cam_grid(model, manifest: Manifest, split: str, pred: dict, out: Path,
                   batch_size: int) -> None:
    """cam.npz and cam.png in OUT: each class's map on its highest-probability image."""
    from chexflow.evaluate.gradcam import GradCam

    classes = list(manifest.classes)
    top = pred["probs"].argmax(axis=0)
    names = [str(pred["image_index"][i]) for i in top]
    pixels = split_images(manifest, split, set(names), batch_size)
    images = np.stack([pixels[n] for n in names])
    cam = GradCam(model)
    maps, probs = cam(images, np.arange(len(classes)))
    rows = np.arange(len(classes))
    known = pred["mask"][top, rows] > 0
    labels = np.where(known, pred["labels"][top, rows], np.nan)
    np.savez_compressed(out / CAM_NPZ, classes=np.array(classes), image_index=np.array(names),
                        probs=probs[rows, rows], labels=labels, maps=maps.astype(np.float16),
                        layer=np.array(cam.layer), cells=np.array(cam.cells))
    save(cam_grid_figure(classes, images, maps, probs[rows, rows], labels, names),
         out / CAM_PNG, dpi=90)


def write_insights(model, manifest: Manifest, split: str, pred: dict, out: Path,
                   batch_size: int) -> dict:
    """Calibration, operating points and the Grad-CAM grid of an evaluation into OUT; returns
    calibration.json's content."""
    chosen_on = threshold_predictions(model, manifest, split, pred, batch_size)
    summary = write_calibration(manifest.classes, split, pred, chosen_on, out)
    if len(pred["probs"]):
        write_cam_grid(model, manifest, split, pred, out, batch_size)
    return summary
