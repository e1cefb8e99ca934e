"""The evaluate step: predict a split, AUROC + bootstrap CI, ROC PNG, report.html, npz.

The outputs are written into a staging folder and swapped into --out only when all of them are
(chexflow.data.output.StagedOutput, as preprocess does): a failed evaluation, e.g. of a model
that predicts NaN, leaves an earlier evaluation in --out as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chexflow.auroc import auroc_summary
from chexflow.data.manifest import Manifest, load_manifest, verify_shards
from chexflow.data.output import StagedOutput
from chexflow.errors import ChexflowError
from chexflow.evaluate.insights import INSIGHT_OUTPUTS
from chexflow.evaluate.options import check_options
from chexflow.evaluate.plots import plot_roc
from chexflow.evaluate.record import check_model_fits
from chexflow.evaluate.report import write_report

OUTPUTS = ("auroc.json", "roc.png", "report.html", "predictions.npz", *INSIGHT_OUTPUTS)


class EvaluateError(ChexflowError, ValueError):
    """Bad evaluate options."""


def _previous_outputs(out: Path, overwrite: bool) -> list[str]:
    """The files of an earlier evaluation in OUT that this one replaces (with --overwrite)."""
    if out.exists() and not out.is_dir():
        raise EvaluateError(f"--out {out}: exists and is not a folder")
    existing = [n for n in OUTPUTS if (out / n).exists()]
    if existing and not overwrite:
        raise EvaluateError(
            f"--out {out}: already holds {', '.join(existing)}; pass --overwrite to replace "
            f"them or choose another folder"
        )
    return existing


def check_finite(probs: np.ndarray, model: Path, split: str) -> None:
    """Refuse the predictions of a model that outputs NaN or infinity (a diverged model)."""
    bad = ~np.isfinite(probs).all(axis=-1) if probs.size else np.zeros(0, bool)
    if bad.any():
        raise EvaluateError(
            f"--model {model}: predicts NaN or infinite probabilities for {int(bad.sum())} of "
            f"{len(bad)} images of the {split} split (its training diverged); no AUROC computed, "
            f"--out left as it was"
        )


def evaluate(
    data: Path, model: Path, split: str, out: Path, bootstrap: int = 10_000,
    batch_size: int = 64, seed: int = 0, overwrite: bool = False,
) -> dict:
    check_options(bootstrap, batch_size, seed)
    manifest = load_manifest(data)
    verify_shards(manifest, split)
    check_model_fits(model, manifest)
    out = Path(out)
    _previous_outputs(out, overwrite)
    with StagedOutput(out, "evaluate") as stage:
        replaces = _previous_outputs(out, overwrite)  # again, now that OUT is locked
        summary = _evaluate(manifest, data, model, split, stage.dir, bootstrap, batch_size, seed)
        stage.commit(replaces)
    return summary


def _evaluate(manifest: Manifest, data: Path, model: Path, split: str, out: Path,
              bootstrap: int, batch_size: int, seed: int) -> dict:
    from chexflow.evaluate.insights import write_insights
    from chexflow.evaluate.predict import load_checked, predict_split

    net = load_checked(model, manifest)
    pred = predict_split(model, manifest, split, batch_size, net)
    check_finite(pred["probs"], model, split)
    np.savez_compressed(
        out / "predictions.npz", classes=np.array(manifest.classes), **pred
    )
    summary = auroc_summary(
        manifest.classes, pred["labels"], pred["probs"], pred["mask"], bootstrap, seed,
        progress=True,
    )
    summary.update({"split": split, "model": str(model), "data": str(data)})
    (out / "auroc.json").write_text(json.dumps(summary, indent=2))
    plot_roc(manifest.classes, pred["labels"], pred["probs"], pred["mask"], summary,
             out / "roc.png")
    write_insights(net, manifest, split, pred, out, batch_size)
    write_report(summary, out / "roc.png", out / "report.html",
                 f"chexflow evaluation: {split} split, {Path(model).name}")
    return summary
