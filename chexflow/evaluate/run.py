"""The evaluate step: predict a split, AUROC + bootstrap CI, ROC PNG, report.html, npz."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chexflow.auroc import auroc_summary
from chexflow.data.manifest import Manifest, load_manifest, verify_shards
from chexflow.errors import ChexflowError
from chexflow.evaluate.plots import plot_roc
from chexflow.evaluate.record import check_model_fits
from chexflow.evaluate.report import write_report
from chexflow.limits import MAX_SEED, check_range
from chexflow.runlock import locked_folder

OUTPUTS = ("auroc.json", "roc.png", "report.html", "predictions.npz")


class EvaluateError(ChexflowError, ValueError):
    """Bad evaluate options."""


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise EvaluateError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    existing = [n for n in OUTPUTS if (out / n).exists()]
    if existing and not overwrite:
        raise EvaluateError(
            f"--out {out}: already holds {', '.join(existing)}; pass --overwrite to replace "
            f"them or choose another folder"
        )


def evaluate(
    data: Path, model: Path, split: str, out: Path, bootstrap: int = 10_000,
    batch_size: int = 64, seed: int = 0, overwrite: bool = False,
) -> dict:
    check_range("--bootstrap", bootstrap, 0)
    check_range("--batch-size", batch_size, 1)
    check_range("--seed", seed, 0, MAX_SEED)
    manifest = load_manifest(data)
    verify_shards(manifest, split)
    check_model_fits(model, manifest)
    with locked_folder(Path(out), "evaluate"):
        return _evaluate(manifest, data, model, split, Path(out), bootstrap, batch_size, seed,
                         overwrite)


def _evaluate(manifest: Manifest, data: Path, model: Path, split: str, out: Path,
              bootstrap: int, batch_size: int, seed: int, overwrite: bool) -> dict:
    _prepare_out(out, overwrite)
    from chexflow.evaluate.predict import predict_split

    pred = predict_split(model, manifest, split, batch_size)
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
    write_report(summary, out / "roc.png", out / "report.html",
                 f"chexflow evaluation: {split} split, {Path(model).name}")
    return summary
