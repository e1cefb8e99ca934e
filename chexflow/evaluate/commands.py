"""`chexflow evaluate`: per-class AUROC with bootstrap CIs, ROC plot and report for a split."""

from __future__ import annotations

import argparse
from pathlib import Path

from chexflow.data.records import SPLITS  # not .split: numpy and PIL on every start
from chexflow.limits import MAX_BOOTSTRAP


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="AUROC per pathology with bootstrap 95%% CI, ROC curves and an HTML report",
    )
    p.add_argument("--data", type=Path, required=True, help="folder written by chexflow preprocess")
    p.add_argument(
        "--model", type=Path, required=True, help="best_model.keras, or a chexflow train --out"
    )
    p.add_argument("--split", choices=SPLITS, default="test")
    p.add_argument("--out", type=Path, required=True, help="folder for auroc.json, roc.png, ...")
    p.add_argument(
        "--bootstrap", type=int, default=10_000,
        help=f"resamples for the 95%% CI, at most {MAX_BOOTSTRAP} (0: no CI)"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation")
    p.set_defaults(func=run_evaluate, trainer=True)


def run_evaluate(args: argparse.Namespace) -> int:
    from chexflow.evaluate.report import ci_words, mean_scope
    from chexflow.evaluate.run import OUTPUTS, evaluate

    summary = evaluate(
        args.data, args.model, args.split, args.out, args.bootstrap, args.batch_size,
        args.seed, args.overwrite,
    )
    mean = summary["mean"]
    print(f"mean_auroc={mean:.4f} ({ci_words(summary)})" if mean is not None
          else "mean_auroc=nan (no class has both label values)")
    scope = mean_scope(summary)
    if scope:
        print(f"evaluate: the mean is{scope}: their labels in the {args.split} split are all "
              "one value, so they have no AUROC (nanmean)")
    print(f"evaluate: wrote {args.out}/{', '.join(OUTPUTS)}")
    return 0
