"""Reports the KFP UI renders: a run report (training + evaluation) and the scaling study
(images/s and scaling efficiency vs workers, as a PNG chart, HTML and Markdown)."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.{digits}g}"
    return "n/a" if value is None else str(value)


def _img(path: str | Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img alt="{html.escape(Path(path).name)}" src="data:image/png;base64,{data}">'


def _table(rows: list[list[Any]], head: list[str]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def _md_table(rows: list[list[Any]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


STYLE = ("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}img{max-width:900px}"
         "</style>")


def train_rows(m: dict[str, Any]) -> list[list[Any]]:
    keys = ("model", "workers", "image_size", "batch_size_per_worker", "epochs",
            "images_per_sec", "images_per_sec_std", "jitter", "step_time_ms", "val_auroc",
            "val_loss", "wall_seconds")
    return [[k, m.get(k)] for k in keys if k in m]


def run_report(train: dict[str, Any], auroc: dict[str, Any], roc_png: str | None,
               title: str) -> tuple[str, str]:
    """(HTML, Markdown) of one training + evaluation run."""
    per_class = auroc.get("per_class") or {}
    rows = []
    for name, v in per_class.items():
        v = v if isinstance(v, dict) else {"auroc": v}
        rows.append([name, v.get("auroc"), v.get("ci_low"), v.get("ci_high"), v.get("positives")])
    head = ["pathology", "AUROC", "CI low", "CI high", "positives"]
    mean = auroc.get("mean")
    doc = [f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{STYLE}"
           f"</head><body><h1>{html.escape(title)}</h1>",
           f"<p>Mean test AUROC: <b>{_fmt(mean)}</b> (95% CI {_fmt(auroc.get('ci_low'))} - "
           f"{_fmt(auroc.get('ci_high'))})</p>",
           "<h2>Training</h2>", _table(train_rows(train), ["metric", "value"]),
           "<h2>Test AUROC per pathology</h2>", _table(rows, head)]
    if roc_png and Path(roc_png).exists():
        doc += ["<h2>ROC curves</h2>", _img(roc_png)]
    doc.append("</body></html>")
    md = "\n\n".join([
        f"# {title}",
        f"Mean test AUROC: **{_fmt(mean)}** (95% CI {_fmt(auroc.get('ci_low'))} - "
        f"{_fmt(auroc.get('ci_high'))})",
        "## Training", _md_table(train_rows(train), ["metric", "value"]),
        "## Test AUROC per pathology", _md_table(rows, head),
    ])
    return "\n".join(doc), md + "\n"


def scaling_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker count: total images/s, per-worker spread, speed-up and scaling efficiency
    (throughput / (workers x single-worker throughput); the smallest run is the baseline)."""
    runs = sorted(runs, key=lambda m: m["workers"])
    base = runs[0]
    base_per_worker = base["images_per_sec"] / base["workers"]
    table = []
    for m in runs:
        ips = m["images_per_sec"]
        table.append({
            "workers": m["workers"],
            "images_per_sec": ips,
            "images_per_sec_std": m.get("images_per_sec_std"),
            "images_per_sec_per_worker": m.get("images_per_sec_per_worker"),
            "ideal_images_per_sec": base_per_worker * m["workers"],
            "speedup": ips / base["images_per_sec"],
            "efficiency": ips / (base_per_worker * m["workers"]),
            "step_time_ms": m.get("step_time_ms"),
        })
    return table


def scaling_chart(table: list[dict[str, Any]], png: str | Path, title: str) -> None:
    """Images/s (measured vs ideal linear) and scaling efficiency vs workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = [r["workers"] for r in table]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    err = [r["images_per_sec_std"] or 0 for r in table]
    ax1.errorbar(w, [r["images_per_sec"] for r in table], yerr=err, marker="o", capsize=3,
                 label="measured")
    ax1.plot(w, [r["ideal_images_per_sec"] for r in table], "--", color="grey", label="linear")
    ax1.set(xlabel="workers", ylabel="images/s (all workers)", title="Throughput", xticks=w)
    ax1.legend()
    ax2.bar([str(x) for x in w], [100 * r["efficiency"] for r in table], color="tab:green")
    ax2.axhline(100, color="grey", linestyle="--")
    ax2.set(xlabel="workers", ylabel="scaling efficiency (%)", title="Scaling efficiency",
            ylim=(0, max(110, 100 * max(r["efficiency"] for r in table) + 10)))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def scaling_report(table: list[dict[str, Any]], png: str | Path, title: str) -> tuple[str, str]:
    head = ["workers", "images/s", "+/-", "ideal images/s", "speed-up", "efficiency %",
            "step ms"]
    rows = [[r["workers"], r["images_per_sec"], r["images_per_sec_std"],
             r["ideal_images_per_sec"], r["speedup"], 100 * r["efficiency"], r["step_time_ms"]]
            for r in table]
    doc = (f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{STYLE}"
           f"</head><body><h1>{html.escape(title)}</h1>{_img(png)}{_table(rows, head)}"
           "<p>Efficiency = images/s / (workers x the smallest run's images/s per worker). "
           "Totals are summed over workers' measured rates (warm-up steps excluded).</p>"
           "</body></html>")
    md = f"# {title}\n\n{_md_table(rows, head)}\n"
    return doc, md
