"""The Katib Experiment model (kubeflow.org/v1beta1) after parsing: parameters, objective,
metrics collector, trial template, and the value strings Katib substitutes into trials.

Everything here is data; `spec.py` builds it from YAML (defaults and validation), the
suggesters, the early stopping rule and the runners read it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_VERSION = "kubeflow.org/v1beta1"
# Katib's default metrics filter: `name=value` (file-metricscollector DefaultFilter).
DEFAULT_METRICS_FORMAT = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
TRIAL_PARAM_RE = re.compile(r"\$\{trialParameters\.([^}]+)\}")
# Katib's metrics collector defaults (common_types.go).
DEFAULT_FILE_PATH = "/var/log/katib/metrics.log"
DEFAULT_TFEVENT_DIR = "/var/log/katib/tfevent/"


@dataclass
class Parameter:
    name: str
    type: str
    min: float | None = None
    max: float | None = None
    step: float | None = None
    values: list[str] = field(default_factory=list)
    distribution: str = "uniform"

    @property
    def numeric(self) -> bool:
        return self.type in ("int", "double")

    @property
    def low(self) -> float:
        """The smallest value a trial can get (int: the first integer at or above min)."""
        return float(math.ceil(self.min - 1e-9)) if self.type == "int" else self.min

    @property
    def high(self) -> float:
        """The largest value a trial can get (int: the last integer at or below max)."""
        return float(math.floor(self.max + 1e-9)) if self.type == "int" else self.max

    @property
    def fixed(self) -> bool:
        """One value only (min == max, or a one-element list): no library samples it."""
        return self.low == self.high if self.numeric else len(self.values) == 1

    def grid(self) -> list[Any]:
        """Katib's grid combinations for this parameter (min..max by step, or the list)."""
        if not self.numeric:
            return list(self.values)
        if self.type == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        n = int(math.floor((self.high - self.low) / self.step + 1e-9))
        return [self.snap(self.low + i * self.step) for i in range(n + 1)]

    def snap(self, value: Any) -> Any:
        """A value of this parameter's type, on its step grid and within its bounds."""
        if not self.numeric:
            return str(value)
        lo, hi, v = self.low, self.high, float(value)
        if self.step:
            top = lo + math.floor((hi - lo) / self.step + 1e-9) * self.step
            v = min(max(lo + round((v - lo) / self.step) * self.step, lo), top)
        v = min(max(v, lo), hi)
        if self.type == "int":
            return int(round(v))
        return float(f"{v:.12g}")

    def typed(self, value: Any) -> Any:
        """The value as a number where the parameter is numeric (discrete lists included)."""
        if self.type == "categorical":
            return str(value)
        if self.type == "discrete":
            v = float(value)
            return int(v) if v == int(v) and "." not in str(value) else v
        return self.snap(value)


def format_value(p: Parameter, value: Any) -> str:
    """The string Katib substitutes for `${trialParameters.X}`."""
    v = p.snap(value)
    return repr(v) if isinstance(v, float) else str(v)


@dataclass
class Objective:
    type: str
    metric: str
    goal: float | None
    additional: list[str]
    strategies: dict[str, str]

    @property
    def maximize(self) -> bool:
        return self.type == "maximize"

    @property
    def metric_names(self) -> list[str]:
        return [self.metric, *self.additional]

    def better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b

    def goal_reached(self, value: float) -> bool:
        if self.goal is None:
            return False
        return value >= self.goal if self.maximize else value <= self.goal


@dataclass
class Collector:
    """spec.metricsCollectorSpec after Katib's defaults."""

    kind: str = "StdOut"
    path: str | None = None  # source.fileSystemPath.path (File, TensorFlowEvent)
    file_format: str | None = None  # source.fileSystemPath.format: TEXT or JSON (File)
    filters: list[str] = field(default_factory=list)  # source.filter.metricsFormat

    @property
    def formats(self) -> list[str]:
        return self.filters or [DEFAULT_METRICS_FORMAT]


@dataclass
class ConfigMapTemplate:
    """spec.trialTemplate.configMap's template as a file of the repository holds it."""

    name: str
    namespace: str
    key: str  # templatePath
    file: Path
    config_map: dict  # the ConfigMap document of `file`
    trial_spec: dict  # data[key], parsed

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name} ({self.key})"


@dataclass
class Experiment:
    name: str
    namespace: str
    objective: Objective
    algorithm: str
    algorithm_settings: dict[str, str]
    early_stopping: str | None
    early_stopping_settings: dict[str, str]
    parallel_trial_count: int
    max_trial_count: int | None
    max_failed_trial_count: int | None
    parameters: list[Parameter]
    trial_template: dict
    collector: Collector
    raw: dict
    source: str = ""
    # a ConfigMap template read from the repository, and the files looked in for it
    config_map: ConfigMapTemplate | None = None
    template_files: list[Path] = field(default_factory=list)

    @property
    def trial_parameters(self) -> list[dict]:
        return list(self.trial_template.get("trialParameters") or [])

    @property
    def trial_spec(self) -> dict:
        """The trialSpec, or the template of its ConfigMap when read ({} when not)."""
        if "trialSpec" in self.trial_template or self.config_map is None:
            return self.trial_template.get("trialSpec") or {}
        return self.config_map.trial_spec

    def parameter(self, name: str) -> Parameter:
        return next(p for p in self.parameters if p.name == name)

    def fingerprint(self) -> str:
        """A hash of the effective spec: a state folder belongs to one spec."""
        text = json.dumps(self.raw, sort_keys=True, default=str)
        if self.config_map is not None:  # the template Katib reads from the ConfigMap
            text += json.dumps(self.config_map.trial_spec, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
