"""`chexflow predict` (per-class probabilities of PNG, JPEG and DICOM files, as CSV) and
`chexflow explain` (Grad-CAM overlays per class)."""

from __future__ import annotations

import argparse
from pathlib import Path

MODEL_HELP = "best_model.keras, or a chexflow train --out"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="per-class probabilities of PNG, JPEG or DICOM images, one CSV row per image",
        description="Run a trained model on image files (PNG, JPEG, DICOM; folders are searched) "
        "through training's preprocessing. Unreadable images get a row with the reason in the "
        "error column; the exit status is then 1.",
    )
    _model_images_out(p, "INPUT", "the CSV file to write")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.set_defaults(func=run_predict, trainer=True)

    e = sub.add_parser(
        "explain",
        help="Grad-CAM map of each class over each image, as PNG overlays",
        description="Grad-CAM maps (the backbone's last block with at least 4x4 cells, or "
        "--layer) for image files (PNG, JPEG, DICOM; folders are searched): one PNG per image, "
        "maps.npz and explain.json in --out.",
    )
    _model_images_out(e, "IMAGE", "folder for the PNGs and maps.npz")
    e.add_argument("--class", dest="classes", action="append", metavar="NAME",
                   help="a class to map (repeat it; default: every class)")
    e.add_argument("--layer", help="the backbone layer whose feature maps Grad-CAM weighs")
    e.add_argument("--batch-size", type=int, default=32, help="maps computed at once")
    e.add_argument("--overwrite", action="store_true", help="replace an earlier explanation")
    e.set_defaults(func=run_explain, trainer=True)


def _model_images_out(p: argparse.ArgumentParser, images: str, out_help: str) -> None:
    """MODEL, the images (files or folders) and --out: what predict and explain both take."""
    p.add_argument("model", type=Path, metavar="MODEL", help=MODEL_HELP)
    p.add_argument("inputs", type=Path, nargs="+", metavar=images,
                   help="image files, or folders of them")
    p.add_argument("--out", type=Path, required=True, help=out_help)


def run_predict(args: argparse.Namespace) -> int:
    from chexflow.explain.predict import predict

    result = predict(args.model, args.inputs, args.out, args.batch_size, args.overwrite)
    for error in filter(None, result.errors):
        print(f"predict: {error}")
    print(f"predict: wrote {args.out}: {len(result.paths)} rows, {len(result.classes)} "
          f"classes, {result.failed} unreadable")
    return 1 if result.failed else 0


def run_explain(args: argparse.Namespace) -> int:
    from chexflow.explain.explain import explain

    index = explain(args.model, args.inputs, args.out, args.classes, args.layer,
                    args.batch_size, args.overwrite)
    print(f"explain: wrote {len(index['images'])} PNG(s), maps.npz and explain.json in "
          f"{args.out} (layer {index['layer']}, {'x'.join(map(str, index['cells']))} cells)")
    return 0
