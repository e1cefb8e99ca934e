"""Katib's StdOut metrics collector and metricStrategies, for local trials.

A line is parsed only if it contains one of the metric names; each match of each
metricsFormat regex gives (group 1 = name, group 2 = value), kept when the name is a metric
of the experiment and the value parses as a number (Katib's file-metricscollector).
"""

from __future__ import annotations

import math
import re

from chexflow.katib.spec import DEFAULT_METRICS_FORMAT, Objective


class StdOutCollector:
    def __init__(self, metric_names: list[str], formats: list[str] | None = None):
        self.names = list(metric_names)
        self.regexes = [re.compile(f) for f in (formats or [DEFAULT_METRICS_FORMAT])]

    def parse(self, line: str) -> list[tuple[str, float]]:
        if not any(name in line for name in self.names):
            return []
        found = []
        for rx in self.regexes:
            for m in rx.finditer(line):
                name, value = m.group(1).strip(), m.group(2).strip()
                if name not in self.names:
                    continue
                try:
                    v = float(value)
                except ValueError:
                    continue
                if math.isfinite(v):
                    found.append((name, v))
        return found


def observation(logs: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Katib's Observation: min, max and latest of each reported metric."""
    return {
        name: {"min": min(values), "max": max(values), "latest": values[-1]}
        for name, values in logs.items()
        if values
    }


def metric_values(objective: Objective, logs: dict[str, list[float]]) -> dict[str, float]:
    """Each metric's value after its metricStrategy (min | max | latest)."""
    obs = observation(logs)
    return {name: obs[name][objective.strategies.get(name, "latest")] for name in obs}
