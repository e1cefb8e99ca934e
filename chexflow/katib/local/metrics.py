"""Katib's metrics collectors for local trials, metricStrategies and a trial's objective.

- StdOut and File (TEXT): a line is parsed only if it contains one of the metric names; each
  match of each metricsFormat regex gives (group 1 = name, group 2 = value), kept when the name
  is a metric of the experiment and the value parses as a number (Katib's
  file-metricscollector; StdOut is the same parser over the container's output).
- File (JSON): one JSON object per line; a metric is read when its value is a string, as
  Katib's collector does (`{"loss": "0.3"}`; a bare number is skipped).
- TensorFlowEvent: TensorBoard event files under a folder, read with Katib's tag semantics
  (tfevents.py, run in the trainer environment where tensorboard is installed).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.katib.experiment.model import DEFAULT_METRICS_FORMAT, Experiment, Objective
from chexflow.katib.local.state import TrialRecord


class CollectorError(ChexflowError):
    """The metrics collector could not read the trial's metrics (the trial fails, as on Katib)."""


class TextParser:
    def __init__(self, metric_names: list[str], formats: list[str] | None = None):
        self.names = list(metric_names)
        self.regexes = [re.compile(f) for f in (formats or [DEFAULT_METRICS_FORMAT])]

    def parse(self, line: str) -> list[tuple[str, float]]:
        return [(name, v) for name, v, _ in self._matches(line) if v is not None]

    def unparsed(self, line: str) -> list[tuple[str, str]]:
        """The metrics of the line whose value is no number the collector reads, with what
        was printed there: `loss=nan` gives ("loss", "nan") (Katib's default metricsFormat
        matches it with an empty value)."""
        return [(name, shown) for name, v, shown in self._matches(line) if v is None]

    def _matches(self, line: str) -> list[tuple[str, float | None, str]]:
        """(name, value or None when not a finite number, the text printed there) of each
        match of a metric of the experiment."""
        if not any(name in line for name in self.names):
            return []
        found = []
        for rx in self.regexes:
            for m in rx.finditer(line):
                name = m.group(1).strip()
                if name in self.names:
                    shown = re.match(r"[^\s,;]*", line[m.start(2):]).group()
                    found.append((name, _number(m.group(2).strip()), shown))
        return found


def _number(value: str) -> float | None:
    try:
        v = float(value)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def read_metrics_file(path: Path, names: list[str], file_format: str,
                      formats: list[str]) -> dict[str, list[float]]:
    """Katib's File collector over a finished trial's metrics file: {name: [values]}."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError as e:
        raise CollectorError(f"metrics file {path}: failed to open the file (the trial never "
                             "wrote it)") from e
    logs: dict[str, list[float]] = {}
    parser = TextParser(names, formats)
    for n, line in enumerate(text.split("\n"), 1):
        try:
            found = parser.parse(line) if file_format == "TEXT" else parse_json_line(line, names)
        except json.JSONDecodeError as e:
            raise CollectorError(f"metrics file {path} line {n}: failed to parse the json "
                                 f"object ({e.msg})") from e
        for name, v in found:
            logs.setdefault(name, []).append(v)
    return logs


def unparsed_values(path: Path, names: list[str], formats: list[str]) -> dict[str, str]:
    """TextParser.unparsed over a metrics file: the first text printed for each metric that
    gave no number ({} when the file is not there)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    parser, out = TextParser(names, formats), {}
    for line in text.split("\n"):
        for name, shown in parser.unparsed(line):
            out.setdefault(name, shown)
    return out


def parse_json_line(line: str, names: list[str]) -> list[tuple[str, float]]:
    """A JSON-format metrics line: the metrics whose values are numeric strings."""
    if not line:
        return []
    obj = json.loads(line)
    found = []
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else None
        if isinstance(value, str) and (v := _number(value.strip())) is not None:
            found.append((name, v))
    return found


def read_tfevents(directory: Path, names: list[str]) -> dict[str, list[float]]:
    """Katib's TensorFlowEvent collector: every event file under the folder, read by tfevents.py
    in the trainer environment (tensorboard is installed there, as in Katib's collector image)."""
    from chexflow.envs import trainer_python, with_chexflow_importable

    proc = subprocess.run(
        [str(trainer_python()), "-m", "chexflow.katib.local.tfevents", str(directory), *names],
        capture_output=True, text=True, env=with_chexflow_importable(os.environ), timeout=600,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CollectorError(f"TensorFlowEvent collector on {directory}: {tail}")
    return {k: [float(v) for v in vals] for k, vals in json.loads(proc.stdout).items()}


def observation(logs: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Katib's Observation: min, max and latest of each reported metric."""
    return {
        name: {"min": min(values), "max": max(values), "latest": values[-1]}
        for name, values in logs.items()
        if values
    }


def trial_observation(rec: TrialRecord) -> dict[str, dict[str, float]]:
    """The trial's observation: Katib's (a cluster trial), else from its metric logs."""
    return rec.observation if rec.observation is not None else observation(rec.logs)


def metric_values(objective: Objective, rec: TrialRecord) -> dict[str, float]:
    """Each metric's value after its metricStrategy (min | max | latest; latest when the
    strategy's value is unavailable, as Katib's controller reads it)."""
    out = {}
    for name, obs in trial_observation(rec).items():
        value = obs.get(objective.strategies.get(name, "latest"), obs.get("latest"))
        if value is not None:
            out[name] = value
    return out


def objective_value(exp: Experiment, rec: TrialRecord) -> float | None:
    """The trial's objective after its metricStrategy, when it has a usable result."""
    if rec.status not in ("Succeeded", "EarlyStopped"):
        return None
    return metric_values(exp.objective, rec).get(exp.objective.metric)


def optimal_trial(exp: Experiment, trials: list[TrialRecord]) -> TrialRecord | None:
    best, best_value = None, None
    for rec in trials:
        v = objective_value(exp, rec)
        if v is not None and (best_value is None or exp.objective.better(v, best_value)):
            best, best_value = rec, v
    return best
