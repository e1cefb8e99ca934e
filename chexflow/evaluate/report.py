"""report.html: per-class AUROC (95% CI) next to the CheXNet paper's figures, and the ROC plot."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from chexflow.pathologies import CHEXNET_AUROC, CHEXNET_MEAN_AUROC


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _ci(d: dict) -> str:
    return "" if d.get("ci_low") is None else f"{d['ci_low']:.3f} – {d['ci_high']:.3f}"


def write_report(summary: dict, roc_png: Path, path: Path, title: str) -> Path:
    """A self-contained HTML page (the ROC PNG is embedded)."""
    rows = []
    for cls, d in summary["per_class"].items():
        paper = CHEXNET_AUROC.get(cls)
        delta = "" if d["auroc"] is None or paper is None else f"{d['auroc'] - paper:+.3f}"
        rows.append(
            f"<tr><td>{html.escape(cls)}</td><td>{_fmt(d['auroc'])}</td><td>{_ci(d)}</td>"
            f"<td>{_fmt(paper)}</td><td>{delta}</td>"
            f"<td>{d['positives']}</td><td>{d['negatives']}</td></tr>"
        )
    mean_delta = "" if summary["mean"] is None else f"{summary['mean'] - CHEXNET_MEAN_AUROC:+.3f}"
    rows.append(
        f"<tr class='mean'><td>Mean (nanmean)</td><td>{_fmt(summary['mean'])}</td>"
        f"<td>{_ci(summary)}</td><td>{CHEXNET_MEAN_AUROC:.3f}</td><td>{mean_delta}</td>"
        f"<td></td><td></td></tr>"
    )
    skipped = ", ".join(summary["skipped_classes"]) or "none"
    png = base64.b64encode(Path(roc_png).read_bytes()).decode()
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
tr.mean {{ font-weight: bold; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{summary['images']} images. AUROC per pathology (scikit-learn), 95% CI from
{summary['bootstrap']['resamples']} bootstrap resamples of the images (2.5/97.5 percentiles,
CheXNet protocol). Classes without both label values (no AUROC): {html.escape(skipped)}.
CheXNet: Rajpurkar et al. 2017, arXiv 1711.05225, Table 2 (NIH ChestX-ray14 test set).</p>
<table>
<tr><th>Pathology</th><th>AUROC</th><th>95% CI</th><th>CheXNet</th><th>Δ</th>
<th>Positives</th><th>Negatives</th></tr>
{chr(10).join(rows)}
</table>
<h2>ROC curves</h2>
<img alt="ROC curves per class" src="data:image/png;base64,{png}">
</body></html>
"""
    Path(path).write_text(page)
    return Path(path)
