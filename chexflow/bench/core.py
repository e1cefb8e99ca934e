"""Side-by-side comparisons: two sides run interleaved and repeated in one invocation.

A side is a callable returning one figure (higher is better, e.g. images/s). The result holds
every sample, the medians, the spread and the ratio of medians (side A / side B) against a goal.
A baseline that should bound side A from above (synthetic input against real input) but runs
slower than it is suspect: such a result is flagged and does not count as met.
"""

from __future__ import annotations

import json
import os
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
    suspect_above: float | None = None  # a ratio above it: B does not bound A, B is suspect

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
    def baseline_suspect(self) -> bool:
        """B is meant to bound A from above, yet A ran faster than B by more than allowed."""
        return self.suspect_above is not None and self.ratio > self.suspect_above

    @property
    def met(self) -> bool:
        if self.baseline_suspect:
            return False
        return self.figure <= self.goal if self.goal_is_max else self.figure >= self.goal

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            median_a=self.median_a, median_b=self.median_b, ratio=self.ratio,
            figure=self.figure, met=self.met, baseline_suspect=self.baseline_suspect,
            spread_a=spread(self.samples_a), spread_b=spread(self.samples_b),
        )
        return d


def spread(samples: list[float]) -> float:
    """Half the range, as a ± around the median."""
    return (max(samples) - min(samples)) / 2 if samples else 0.0


def interleave(name: str, sides: list[Side], repeats: int) -> None:
    """Run every side `repeats` times, one of each per round, the order reversed every other
    round (ABC, CBA, ABC...), appending to each side's samples."""
    with tqdm(total=len(sides) * repeats, desc=name, unit="run", leave=False) as bar:
        for i in range(repeats):
            for side in sides if i % 2 == 0 else sides[::-1]:
                side.samples.append(float(side.run()))
                bar.update()


def compare(name: str, unit: str, a: Side, b: Side, repeats: int, goal: float,
            notes: dict | None = None, **result_options) -> Result:
    """Run a and b alternately `repeats` times each (ABAB.. then BABA.. order flips each round)."""
    interleave(name, [a, b], repeats)
    return Result(name, unit, a.name, b.name, a.samples, b.samples, goal, notes or {},
                  **result_options)


def compare_each(names: list[str], unit: str, a: Side, baselines: list[Side], repeats: int,
                 goal: float, notes: dict | None = None, **result_options) -> list[Result]:
    """Side a against each baseline, all interleaved in one loop: one Result per baseline
    (names[i] for baselines[i]), every one holding the same samples of a."""
    interleave(names[0], [a, *baselines], repeats)
    return [Result(n, unit, a.name, b.name, a.samples, b.samples, goal, dict(notes or {}),
                   **result_options) for n, b in zip(names, baselines, strict=True)]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as the kernel reports it (the machine kind when there is none)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "processor": platform.processor() or platform.machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def markdown(results: list[Result], host: dict) -> str:
    load = host.get("load_average")
    lines = [
        f"Measured on {host['cpus']} CPUs ({host.get('cpu_model', host['processor'])}), "
        f"{host['platform']}, {host['when']}"
        + (f", load average {load[0]:g} at the end." if load else "."),
    ]
    if not results:
        return lines[0] + "\n"
    lines += [
        "",
        "| comparison | A | B | median A | median B | unit | figure | value | goal | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.a} | {r.b} | {r.median_a:.4g} ± {spread(r.samples_a):.2g} | "
            f"{r.median_b:.4g} ± {spread(r.samples_b):.2g} | {r.unit} | {r.figure_name} | "
            f"{r.figure:.3f} | {'≤' if r.goal_is_max else '≥'} {r.goal:g} | {verdict(r)} |"
        )
    lines += [f"\n{r.name}: {note}" for r in results for note in result_notes(r, host)]
    return "\n".join(lines) + "\n"


def verdict(r: Result) -> str:
    if r.baseline_suspect:
        return "NO (baseline suspect)"
    return "yes" if r.met else "NO"


def result_notes(r: Result, host: dict) -> list[str]:
    """Lines under the table: the machine beside a scaling figure (CPU model, cores, the
    one-worker rate); beside an input-pipeline figure, what the input alone costs."""
    lines = []
    solo = r.notes.get("one_worker_images_per_sec")
    if solo:
        lines.append(f"{host.get('cpu_model', host['processor'])}, {host['cpus']} cores; one "
                     f"worker alone {statistics.median(solo):.4g} images/s (median of "
                     f"{len(solo)})")
    alone = r.notes.get("input_alone")
    if alone:
        real, synthetic = (alone[s]["cpu_ms_per_batch"] for s in ("TFRecords", "synthetic"))
        step_ms = r.notes["batch_per_worker"] * 1e3 / r.median_b
        lines.append(
            f"the input alone, no model: {real:.3g} ms CPU per batch from TFRecords, "
            f"{synthetic:.3g} from memory (median of {alone['repeats']} x {alone['batches']} "
            f"batches); on the synthetic side's {step_ms:.0f} ms step the difference accounts "
            f"for a ratio of {input_bound(real - synthetic, step_ms):.4f}")
    return lines


def input_bound(extra_cpu_ms: float, step_ms: float) -> float:
    """The ratio a step would reach if the real input's extra CPU per batch came on top of the
    step (the cores being busy with the model), and nothing else differed."""
    return step_ms / (step_ms + max(0.0, extra_cpu_ms))


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


def write_report(results: list[Result], out: Path, extra: dict | None = None,
                 sections: list[str] = ()) -> dict:
    """bench.json, bench.md (the table, then `sections`) and bench.png in `out`; returns the
    JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    host = machine()
    doc = {"machine": host, "results": [r.as_dict() for r in results], **(extra or {})}
    (out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "bench.md").write_text(markdown(results, host) + "".join(sections))
    if results:
        plot(results, out / "bench.png")
    return doc
