"""A sweep's results: table (stdout, CSV, HTML), results.json, optimal.json, objective.png.

The same writers serve a local sweep (its state) and a cluster's Experiment (its Trials).
optimal.json is what the tune-then-train pipeline reads:
`{"trial": NAME, "parameters": {name: value}, "metrics": {name: value}}` (metrics after their
metricStrategy), plus the experiment's final condition. `load_results` reads results.json back.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.katib.experiment.model import Experiment
from chexflow.katib.local.metrics import (
    metric_values,
    objective_value,
    optimal_trial,
    trial_observation,
)
from chexflow.katib.local.state import TrialRecord
from chexflow.kube import finished_condition

RESULTS_FILE = "results.json"


def rows(exp: Experiment, trials: list[TrialRecord]) -> list[dict[str, Any]]:
    out = []
    for t in trials:
        row: dict[str, Any] = {"trial": t.name, "status": t.status}
        row.update({p.name: p.typed(t.parameters[p.name]) for p in exp.parameters})
        values = metric_values(exp.objective, t)
        row.update({m: values.get(m) for m in exp.objective.metric_names})
        row["restarts"] = t.restarts
        row["message"] = t.message
        out.append(row)
    return out


def optimal_entry(exp: Experiment, rec: TrialRecord) -> dict[str, Any]:
    """optimal.json's body for this trial."""
    return {
        "trial": rec.name,
        "parameters": {p.name: p.typed(rec.parameters[p.name]) for p in exp.parameters},
        "metrics": metric_values(exp.objective, rec),
    }


def trial_line(exp: Experiment, rec: TrialRecord) -> str:
    """One line for a trial that ended: status, assignment, metrics, and why it did not
    succeed."""
    params = " ".join(f"{k}={v}" for k, v in rec.parameters.items())
    shown = " ".join(f"{k}={v:.6g}" for k, v in metric_values(exp.objective, rec).items())
    line = f"trial {rec.name} {rec.status}: {params}" + (f" -> {shown}" if shown else "")
    if rec.status in ("Failed", "MetricsUnavailable", "EarlyStopped", "Killed") and rec.message:
        line += f" ({rec.message})"
    return line


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def table_text(table: list[dict[str, Any]]) -> str:
    if not table:
        return "(no trials)"
    cols = [c for c in table[0] if c != "message"]
    cells = [[_fmt(r[c]) for c in cols] for r in table]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def plot_objective(exp: Experiment, trials: list[TrialRecord], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    obj = exp.objective
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"Succeeded": "tab:blue", "EarlyStopped": "tab:orange"}
    best, best_line = None, []
    for status, color in colors.items():
        pts = [(t.index + 1, objective_value(exp, t)) for t in trials if t.status == status]
        if pts:
            ax.scatter(*zip(*pts, strict=True), c=color, label=status, zorder=3)
    for t in trials:
        v = objective_value(exp, t)
        if v is not None and (best is None or obj.better(v, best)):
            best = v
        best_line.append((t.index + 1, best))
    xs = [x for x, y in best_line if y is not None]
    if xs:
        ax.step(xs, [y for _, y in best_line if y is not None], where="post", c="tab:green",
                label=f"best so far ({obj.type})")
    failed = [t.index + 1 for t in trials
              if t.status in ("Failed", "MetricsUnavailable", "Killed")]
    if failed:
        for x in failed:
            ax.axvline(x, c="tab:red", alpha=0.25, lw=1)
        ax.plot([], [], c="tab:red", alpha=0.4, label="failed / no metrics / killed")
    if obj.goal is not None:
        ax.axhline(obj.goal, ls="--", c="grey", label=f"goal {obj.goal:g}")
    ax.set_xlabel("trial (creation order)")
    ax.set_ylabel(f"{obj.metric} ({obj.strategies.get(obj.metric)})")
    ax.set_title(f"{exp.name}: {exp.algorithm}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(exp: Experiment, directory: Path, trials: list[TrialRecord],
                  conditions: list[dict], best: dict[str, Any] | None = None,
                  where: str = "run locally") -> dict[str, Any]:
    """Write results.{json,csv,html}, optimal.json and objective.png into `directory`.
    `best`: the optimal trial as the controller chose it (a cluster's currentOptimalTrial);
    None: chosen from `trials` as Katib does."""
    table = rows(exp, trials)
    if best is None and (rec := optimal_trial(exp, trials)) is not None:
        best = optimal_entry(exp, rec)
    cond = finished_condition(conditions, "Experiment")
    summary = {
        "experiment": exp.name,
        "algorithm": exp.algorithm,
        "where": where,
        "objective": {"type": exp.objective.type, "metric": exp.objective.metric,
                      "goal": exp.objective.goal, "strategies": exp.objective.strategies},
        "condition": cond,
        "conditions": conditions,
        "counts": {s: sum(t.status == s for t in trials) for s in
                   ("Succeeded", "Failed", "MetricsUnavailable", "EarlyStopped", "Killed",
                    "Running", "Created")},
        "optimal": best,
        "trials": [{**r, "observation": trial_observation(t), "metric_logs": t.logs,
                    "started": t.started, "finished": t.finished}
                   for r, t in zip(table, trials, strict=True)],
    }
    (directory / RESULTS_FILE).write_text(json.dumps(summary, indent=1, default=str))
    with open(directory / "results.csv", "w", newline="") as f:
        if table:
            w = csv.DictWriter(f, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)
    if best is not None:
        opt = {**best, "experiment": exp.name,
               "condition": (cond or {}).get("reason")}
        (directory / "optimal.json").write_text(json.dumps(opt, indent=1))
    plot_objective(exp, trials, directory / "objective.png")
    (directory / "results.html").write_text(_html(exp, table, best, cond, where))
    return summary


def load_results(directory: Path) -> dict[str, Any]:
    """results.json of a sweep (local or cluster) as `write_results` wrote it."""
    path = Path(directory) / RESULTS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ChexflowError(f"{path}: no such file (the sweep wrote no results)") from e
    except json.JSONDecodeError as e:
        raise ChexflowError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("trials"), list):
        raise ChexflowError(f"{path}: expected an object with a 'trials' list")
    return data


def _html(exp: Experiment, table: list[dict], best: dict | None, cond: dict | None,
          where: str) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in (table[0] if table else []))
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(_fmt(v))}</td>" for v in r.values()) + "</tr>" for r in table
    )
    status = f"{cond['type']}: {cond['reason']} ({cond['message']})" if cond else "running"
    opt = esc(json.dumps(best, indent=1)) if best else "none yet"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(exp.name)}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style></head><body>"
        f"<h1>Katib experiment {esc(exp.name)} ({esc(exp.algorithm)}, {esc(where)})</h1>"
        f"<p>{esc(status)}</p><h2>Optimal trial</h2><pre>{opt}</pre>"
        "<img src='objective.png' alt='objective per trial'>"
        f"<h2>Trials</h2><table><tr>{head}</tr>{body}</table></body></html>"
    )
