"""Side-by-side comparisons: two sides run interleaved and repeated in one invocation.

A side is a callable returning one figure (higher is better, e.g. images/s). The result holds
every sample, the medians, the spread and the ratio of medians (side A / side B) against a goal.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm


@dataclass
class Side:
    name: str
    run: Callable[[], float]
    samples: list[float] = field(default_factory=list)


@dataclass
class Result:
    """One comparison's outcome. Its figure is the ratio median(A) / median(B), which must be
    at least `goal`; with `goal_is_max` the figure is median(A) - median(B) (e.g. seconds of
    overhead) and must be at most `goal`."""

    name: str
    unit: str
    a: str
    b: str
    samples_a: list[float]
    samples_b: list[float]
    goal: float
    notes: dict = field(default_factory=dict)
    goal_is_max: bool = False
    figure_name: str = "ratio A/B"

    @property
    def median_a(self) -> float:
        return statistics.median(self.samples_a)

    @property
    def median_b(self) -> float:
        return statistics.median(self.samples_b)

    @property
    def ratio(self) -> float:
        return self.median_a / self.median_b if self.median_b else float("nan")

    @property
    def figure(self) -> float:
        return self.median_a - self.median_b if self.goal_is_max else self.ratio

    @property
    def met(self) -> bool:
        return self.figure <= self.goal if self.goal_is_max else self.figure >= self.goal

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            median_a=self.median_a, median_b=self.median_b, ratio=self.ratio,
            figure=self.figure, met=self.met,
            spread_a=spread(self.samples_a), spread_b=spread(self.samples_b),
        )
        return d


def spread(samples: list[float]) -> float:
    """Half the range, as a ± around the median."""
    return (max(samples) - min(samples)) / 2 if samples else 0.0


def compare(name: str, unit: str, a: Side, b: Side, repeats: int, goal: float,
            notes: dict | None = None, **result_options) -> Result:
    """Run a and b alternately `repeats` times each (ABAB.. then BABA.. order flips each round)."""
    with tqdm(total=2 * repeats, desc=name, unit="run", leave=False) as bar:
        for i in range(repeats):
            for side in (a, b) if i % 2 == 0 else (b, a):
                side.samples.append(float(side.run()))
                bar.update()
    return Result(name, unit, a.name, b.name, a.samples, b.samples, goal, notes or {},
                  **result_options)


def machine() -> dict:
    import os

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def markdown(results: list[Result], host: dict) -> str:
    lines = [
        f"Measured on {host['cpus']} CPUs, {host['platform']}, {host['when']}.",
        "",
        "| comparison | A | B | median A | median B | unit | figure | value | goal | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.a} | {r.b} | {r.median_a:.4g} ± {spread(r.samples_a):.2g} | "
            f"{r.median_b:.4g} ± {spread(r.samples_b):.2g} | {r.unit} | {r.figure_name} | "
            f"{r.figure:.3f} | {'≤' if r.goal_is_max else '≥'} {r.goal:g} | "
            f"{'yes' if r.met else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[Result], path: Path) -> None:
    """One panel per comparison: every sample of both sides, medians as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3.4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        ax.bar([0, 1], [r.median_a, r.median_b], color=["#4c72b0", "#dd8452"], alpha=0.6)
        for x, samples in ((0, r.samples_a), (1, r.samples_b)):
            ax.scatter([x] * len(samples), samples, color="k", s=10, zorder=3)
        ax.set_xticks([0, 1], [r.a, r.b], fontsize=7)
        ax.set_ylabel(r.unit, fontsize=8)
        ax.set_title(f"{r.name}\n{r.figure_name} {r.figure:.3f} (goal {r.goal:g})", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(results: list[Result], out: Path, extra: dict | None = None) -> dict:
    """bench.json, bench.md and bench.png in `out`; returns the JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    host = machine()
    doc = {"machine": host, "results": [r.as_dict() for r in results], **(extra or {})}
    (out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "bench.md").write_text(markdown(results, host))
    if results:
        plot(results, out / "bench.png")
    return doc
