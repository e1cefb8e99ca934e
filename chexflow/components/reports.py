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
         ".headline{font-size:1.15em;background:#f3f6fa;border-left:4px solid #3b6ea5;"
         "padding:.6em 1em}.provenance{font-weight:bold}</style>")


def run_report(train: dict[str, Any], auroc: dict[str, Any], roc_png: str | None,
               title: str) -> tuple[str, str]:
    """(HTML, Markdown) of one training + evaluation run: chexflow.evaluate.report's page
    with the training curves of `train` (the trainer's metrics.json)."""
    from chexflow.evaluate.plots import history_png
    from chexflow.evaluate.report import (
        CHEXNET_SOURCE,
        ci_words,
        data_provenance,
        fmt_ci,
        fmt_seconds,
        mean_scope,
        parameters,
        render_report,
    )
    from chexflow.pathologies import CHEXNET_AUROC, CHEXNET_MEAN_AUROC

    provenance = data_provenance(auroc["data"]) if auroc.get("data") else "not recorded"
    curves = history_png(train["history"]) if train.get("history") else None
    doc = render_report(auroc, roc_png, title, train, curves, provenance)
    rows = [[name, v.get("auroc"), fmt_ci(v, " - "), CHEXNET_AUROC.get(name), v.get("positives")]
            for name, v in (auroc.get("per_class") or {}).items()]
    md = "\n\n".join([
        f"# {title}",
        f"Mean test AUROC: **{_fmt(auroc.get('mean'))}** ({ci_words(auroc, ' - ')}) on "
        f"{auroc.get('images')} images{mean_scope(auroc)}; CheXNet's published mean: "
        f"{CHEXNET_MEAN_AUROC}. "
        f"Training: {_fmt(train.get('images_per_sec'))} images/s with {train.get('workers')} "
        f"worker(s), wall time {fmt_seconds(train.get('wall_seconds'))}.",
        f"**Data:** {provenance}.",
        "## Test AUROC per pathology",
        _md_table(rows, ["pathology", "AUROC", "95% CI", "CheXNet", "positives"]),
        CHEXNET_SOURCE,
        "## Parameters", _md_table([list(p) for p in parameters(auroc, train)],
                                   ["parameter", "value"]),
    ])
    return doc, md + "\n"


# What every run of a scaling study shares (shown once, as its parameters).
RUN_SETTINGS = ("model", "image_size", "batch_size_per_worker", "epochs", "synthetic_data",
                "amp", "xla", "warmup_steps")


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
            "wall_seconds": m.get("job_wall_seconds") or m.get("wall_seconds"),
            **{k: m.get(k) for k in RUN_SETTINGS},
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
    """(HTML, Markdown): a headline (the largest run's images/s and efficiency, wall time,
    what data the runs read), the chart, the table and the runs' shared parameters."""
    head = ["workers", "images/s", "+/-", "ideal images/s", "speed-up", "efficiency %",
            "step ms", "wall s"]
    rows = [[r["workers"], r["images_per_sec"], r["images_per_sec_std"],
             r["ideal_images_per_sec"], r["speedup"], 100 * r["efficiency"], r["step_time_ms"],
             r.get("wall_seconds")]
            for r in table]
    last = table[-1]
    data = ("synthetic in-memory tensors (--synthetic-data): the figures measure throughput "
            "only, no accuracy" if last.get("synthetic_data") else
            "the preprocessed TFRecords (real input pipeline)")
    wall = sum(r.get("wall_seconds") or 0 for r in table)
    headline = (f"{last['workers']} workers: <b>{_fmt(last['images_per_sec'])} images/s</b>, "
                f"scaling efficiency <b>{100 * last['efficiency']:.0f}%</b> of "
                f"{table[0]['workers']} worker(s) x {last['workers'] / table[0]['workers']:g}; "
                f"wall time of all runs {wall:.0f} s.")
    settings = [[k, last.get(k)] for k in RUN_SETTINGS if last.get(k) is not None]
    doc = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}"
           f"</title>{STYLE}</head><body><h1>{html.escape(title)}</h1>"
           f"<div class='headline'><p>{headline}</p><p class='provenance' id='provenance'>"
           f"Data: {html.escape(data)}.</p></div>"
           f"{_img(png)}{_table(rows, head)}"
           "<p>Efficiency = images/s / (workers x the smallest run's images/s per worker). "
           "Totals are summed over workers' measured rates (warm-up steps excluded).</p>"
           f"<h2>Parameters</h2>{_table(settings, ['parameter', 'value'])}"
           "</body></html>")
    md = (f"# {title}\n\n{headline.replace('<b>', '**').replace('</b>', '**')}\n\n"
          f"**Data:** {data}.\n\n{_md_table(rows, head)}\n\n## Parameters\n\n"
          f"{_md_table(settings, ['parameter', 'value'])}\n")
    return doc, md
