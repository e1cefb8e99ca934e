"""`chexflow data synth` and `chexflow preprocess`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="generate datasets in the real NIH/CheXpert formats")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    synth = data_sub.add_parser(
        "synth", help="write an NIH- or CheXpert-format dataset with a learnable signal"
    )
    synth.add_argument("--out", type=Path, required=True, help="output folder")
    synth.add_argument("--format", choices=("nih", "chexpert"), default="nih")
    synth.add_argument("--images", type=int, default=400, help="number of images")
    synth.add_argument("--size", type=int, default=64, help="image side in pixels")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument(
        "--min-prevalence",
        type=float,
        default=0.05,
        help="floor on each class's positive rate (0: NIH's exact shape)",
    )
    synth.set_defaults(func=run_synth)

    pre = sub.add_parser(
        "preprocess",
        help="validate, split by patient and write sharded TFRecords with a manifest",
    )
    pre.add_argument("--format", choices=("nih", "chexpert"), default="nih")
    pre.add_argument("--csv", type=Path, required=True, help="Data_Entry_2017.csv or CheXpert CSV")
    pre.add_argument("--images", type=Path, required=True, help="folder the CSV's images are in")
    pre.add_argument("--out", type=Path, required=True)
    group = pre.add_mutually_exclusive_group()
    group.add_argument("--split", default="70/10/20", help="train/val/test image fractions")
    group.add_argument(
        "--split-lists",
        type=Path,
        help="folder with NIH's train_val_list.txt and test_list.txt",
    )
    pre.add_argument("--image-size", type=int, default=224)
    pre.add_argument(
        "--uncertain",
        choices=("ones", "zeros", "ignore"),
        default="ones",
        help="CheXpert uncertain labels: U-Ones, U-Zeros or U-Ignore",
    )
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--workers", type=int, default=2, help="parallel processes")
    pre.add_argument("--images-per-shard", type=int, default=1024)
    pre.add_argument(
        "--plan-only",
        action="store_true",
        help="validate and split the metadata only; read no images",
    )
    pre.add_argument(
        "--overwrite", action="store_true", help="replace chexflow's earlier outputs in --out"
    )
    pre.set_defaults(func=run_preprocess, trainer=lambda a: not a.plan_only)


def run_synth(args: argparse.Namespace) -> int:
    from chexflow.data import faults
    from chexflow.data.synth import synth

    with faults.reported(args.out):
        csv_path = synth(
            args.format, args.out, args.images, args.size, args.seed, args.min_prevalence
        )
    print(f"wrote {args.images} images and {csv_path}")
    return 0


def run_preprocess(args: argparse.Namespace) -> int:
    from chexflow.data import faults
    from chexflow.data.preprocess import PreprocessConfig, preprocess
    from chexflow.data.split import parse_fractions

    cfg = PreprocessConfig(
        format=args.format,
        csv=args.csv,
        images=args.images,
        out=args.out,
        fractions=parse_fractions(args.split or "70/10/20"),
        split_lists=args.split_lists,
        image_size=args.image_size,
        uncertain=args.uncertain,
        seed=args.seed,
        workers=args.workers,
        images_per_shard=args.images_per_shard,
        plan_only=args.plan_only,
        overwrite=args.overwrite,
    )
    with faults.reported(args.out):
        manifest = preprocess(cfg)
    for warning in manifest["warnings"]:
        print(f"chexflow preprocess: warning: {warning}", file=sys.stderr)
    summary = {s: {k: v[k] for k in ("images", "patients")} for s, v in manifest["splits"].items()}
    print(
        json.dumps(
            {"accepted": manifest["accepted"], "rejected": manifest["rejected"], "splits": summary}
        )
    )
    print(f"manifest: {args.out / 'manifest.json'}  rejected rows: {args.out / 'rejected.csv'}")
    return 0
