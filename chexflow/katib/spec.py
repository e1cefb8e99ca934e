"""Katib Experiment (kubeflow.org/v1beta1) specs: parsing, the webhook's defaults and validation.

`load_experiment(path)` reads a YAML file, applies the defaults Katib's mutating webhook sets
(parallelTrialCount 3, metricStrategies from the objective type, StdOut collector, int step 1,
batch Job success/failure conditions) and checks the rules of Katib's validating webhook and
suggestion services. Every problem is reported with the field path, e.g.
`spec.parameters[1].feasibleSpace.min: ...`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chexflow.errors import ChexflowError

API_VERSION = "kubeflow.org/v1beta1"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40
PARAMETER_TYPES = ("int", "double", "categorical", "discrete")
DISTRIBUTIONS = ("uniform", "logUniform", "normal", "logNormal")
STRATEGIES = ("min", "max", "latest")
RESUME_POLICIES = ("Never", "LongRunning", "FromVolume")
COLLECTORS = ("StdOut", "File", "TensorFlowEvent", "PrometheusMetric", "Custom", "None")
# Katib's StdOut collector regex: `name=value` (FACTS.md).
DEFAULT_METRICS_FORMAT = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
TRIAL_PARAM_RE = re.compile(r"\$\{trialParameters\.([^}]+)\}")
META_REF_RE = re.compile(
    r"^\$\{trialSpec\.(Name|Namespace|Kind|APIVersion|Labels\[[^\]]+\]|Annotations\[[^\]]+\])\}$"
)
JOB_SUCCESS = 'status.conditions.#(type=="Complete")#|#(status=="True")#'
JOB_FAILURE = 'status.conditions.#(type=="Failed")#|#(status=="True")#'


class SpecError(ChexflowError):
    """The Experiment YAML is not valid; the message names the file and field."""


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

    def grid(self) -> list[Any]:
        """Katib's grid combinations for this parameter (min..max by step, or the list)."""
        if not self.numeric:
            return list(self.values)
        if self.type == "int":
            return list(range(int(self.min), int(self.max) + 1, int(self.step or 1)))
        n = int(math.floor((self.max - self.min) / self.step + 1e-9))
        return [self.snap(self.min + i * self.step) for i in range(n + 1)]

    def snap(self, value: Any) -> Any:
        """A value of this parameter's type, on its step grid and within its bounds."""
        if not self.numeric:
            return str(value)
        v = float(value)
        if self.step:
            v = self.min + round((v - self.min) / self.step) * self.step
            top = self.min + math.floor((self.max - self.min) / self.step + 1e-9) * self.step
            v = min(max(v, self.min), top)
        v = min(max(v, self.min), self.max)
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

    def contains(self, value: Any) -> bool:
        if not self.numeric:
            return str(value) in self.values
        v = float(value)
        if self.type == "int" and v != int(v):
            return False
        if not self.min - 1e-12 <= v <= self.max + 1e-12:
            return False
        if self.step:
            k = (v - self.min) / self.step
            return abs(k - round(k)) < 1e-6
        return True


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
    metrics_formats: list[str]
    resume_policy: str
    raw: dict
    source: str = ""

    @property
    def trial_parameters(self) -> list[dict]:
        return list(self.trial_template.get("trialParameters") or [])

    @property
    def trial_spec(self) -> dict:
        return self.trial_template.get("trialSpec") or {}

    def parameter(self, name: str) -> Parameter:
        return next(p for p in self.parameters if p.name == name)

    def fingerprint(self) -> str:
        """A hash of the effective spec: a state folder belongs to one spec."""
        text = json.dumps(self.raw, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Errors:
    def __init__(self, source: str):
        self.source = source
        self.items: list[str] = []

    def add(self, path: str, msg: str) -> None:
        self.items.append(f"{path}: {msg}")

    def raise_if_any(self) -> None:
        if self.items:
            head = f"{self.source}: " if self.source else ""
            raise SpecError(head + "; ".join(self.items))


def load_experiment(path: Path | str, overrides: list[str] | None = None) -> Experiment:
    """Read, default and validate an Experiment YAML file (`overrides`: `--set PATH=VALUE`)."""
    path = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except FileNotFoundError as e:
        raise SpecError(f"{path}: no such file") from e
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    exps = [d for d in docs if isinstance(d, dict) and d.get("kind") == "Experiment"]
    if len(exps) != 1:
        raise SpecError(f"{path}: expected one document of kind Experiment, found {len(exps)}")
    raw = copy.deepcopy(exps[0])
    for item in overrides or []:
        apply_override(raw, item, str(path))
    return parse_experiment(raw, str(path))


def apply_override(raw: dict, item: str, source: str = "") -> None:
    """`spec.maxTrialCount=2` or `spec.parameters[0].feasibleSpace.max=0.1` (YAML value)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SpecError(f"--set {item!r}: expected PATH=VALUE, e.g. spec.maxTrialCount=4")
    tokens = re.findall(r"[^.\[\]]+|\[\d+\]", key)
    node: Any = raw
    for i, tok in enumerate(tokens):
        last = i == len(tokens) - 1
        if tok.startswith("["):
            idx = int(tok[1:-1])
            if not isinstance(node, list) or idx >= len(node):
                raise SpecError(f"{source}: --set {key}: {tok} is not an index of a list there")
            if last:
                node[idx] = yaml.safe_load(value)
            node = node[idx]
        else:
            if not isinstance(node, dict):
                raise SpecError(f"{source}: --set {key}: {tok!r} is not a field of a mapping")
            if last:
                node[tok] = yaml.safe_load(value)
            else:
                node = node.setdefault(tok, {})


def _num(errors: _Errors, path: str, value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        errors.add(path, f"{value!r} is not a number")
        return None
    if not math.isfinite(v):
        errors.add(path, f"{value!r} is not a finite number")
        return None
    return v


def _int(errors: _Errors, path: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(path, f"{value!r} must be an integer")
        return None
    if value < minimum:
        errors.add(path, f"{value} must be at least {minimum}")
        return None
    return value


def _settings(errors: _Errors, path: str, items: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, s in enumerate(items or []):
        if not isinstance(s, dict) or "name" not in s:
            errors.add(f"{path}[{i}]", "expected {name, value}")
            continue
        out[str(s["name"])] = str(s.get("value", ""))
    return out


def parse_experiment(raw: dict, source: str = "") -> Experiment:
    """Defaults and validation of an Experiment document already read from YAML."""
    errors = _Errors(source)
    if raw.get("apiVersion") != API_VERSION:
        errors.add("apiVersion", f"{raw.get('apiVersion')!r}: expected {API_VERSION}")
    meta = raw.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        errors.add("metadata.name", "required")
    elif not NAME_RE.match(name) or len(name) > NAME_MAX:
        errors.add(
            "metadata.name",
            f"{name!r} must match {NAME_RE.pattern} and be at most {NAME_MAX} characters",
        )
    spec = raw.get("spec")
    if not isinstance(spec, dict):
        errors.add("spec", "required")
        errors.raise_if_any()

    objective = _objective(errors, spec.get("objective"))
    algo = spec.get("algorithm") or {}
    algorithm = str(algo.get("algorithmName") or "")
    if not algorithm:
        errors.add("spec.algorithm.algorithmName", "required")
    algorithm_settings = _settings(
        errors, "spec.algorithm.algorithmSettings", algo.get("algorithmSettings")
    )
    es = spec.get("earlyStopping") or {}
    early_stopping = es.get("algorithmName") or None
    es_settings = _settings(
        errors, "spec.earlyStopping.algorithmSettings", es.get("algorithmSettings")
    )

    parallel = _int(errors, "spec.parallelTrialCount", spec.get("parallelTrialCount", 3), 1)
    max_trials = _int(errors, "spec.maxTrialCount", spec.get("maxTrialCount"), 1)
    max_failed = _int(errors, "spec.maxFailedTrialCount", spec.get("maxFailedTrialCount"), 0)
    if max_trials is not None and max_failed is not None and max_failed > max_trials:
        errors.add("spec.maxFailedTrialCount", "should be less than or equal to maxTrialCount")
    if max_trials is not None and parallel is not None and parallel > max_trials:
        errors.add("spec.parallelTrialCount", "should be less than or equal to maxTrialCount")
    resume = spec.get("resumePolicy", "Never")
    if resume not in RESUME_POLICIES:
        errors.add("spec.resumePolicy", f"{resume!r}: expected one of {', '.join(RESUME_POLICIES)}")

    parameters = _parameters(errors, spec.get("parameters"))
    template = spec.get("trialTemplate")
    if not isinstance(template, dict):
        errors.add("spec.trialTemplate", "required")
        template = {}
    _trial_template(errors, template, parameters)
    formats = _metrics_collector(errors, spec.get("metricsCollectorSpec"))

    exp = Experiment(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        objective=objective,
        algorithm=algorithm,
        algorithm_settings=algorithm_settings,
        early_stopping=early_stopping,
        early_stopping_settings=es_settings,
        parallel_trial_count=parallel or 3,
        max_trial_count=max_trials,
        max_failed_trial_count=max_failed,
        parameters=parameters,
        trial_template=template,
        metrics_formats=formats,
        resume_policy=resume,
        raw=raw,
        source=source,
    )
    if algorithm and not errors.items:
        from chexflow.katib.suggest import validate_algorithm

        for path, msg in validate_algorithm(exp):
            errors.add(path, msg)
    if early_stopping:
        from chexflow.katib.earlystop import validate_early_stopping

        for path, msg in validate_early_stopping(exp):
            errors.add(path, msg)
    errors.raise_if_any()
    return exp


def _objective(errors: _Errors, obj: Any) -> Objective:
    if not isinstance(obj, dict):
        errors.add("spec.objective", "required")
        return Objective("maximize", "", None, [], {})
    otype = obj.get("type")
    if otype not in ("maximize", "minimize"):
        errors.add("spec.objective.type", f"{otype!r}: expected maximize or minimize")
        otype = "maximize"
    metric = str(obj.get("objectiveMetricName") or "")
    if not metric:
        errors.add("spec.objective.objectiveMetricName", "required")
    additional = [str(m) for m in obj.get("additionalMetricNames") or []]
    if metric in additional:
        errors.add(
            "spec.objective.additionalMetricNames", f"must not contain the objective {metric!r}"
        )
    goal = None
    if obj.get("goal") is not None:
        goal = _num(errors, "spec.objective.goal", obj["goal"])
    default = "max" if otype == "maximize" else "min"
    strategies = {m: default for m in [metric, *additional]}
    for i, s in enumerate(obj.get("metricStrategies") or []):
        path = f"spec.objective.metricStrategies[{i}]"
        sname, value = (s or {}).get("name"), (s or {}).get("value")
        if sname not in strategies:
            errors.add(f"{path}.name", f"{sname!r} is not the objective or an additional metric")
        elif value not in STRATEGIES:
            errors.add(f"{path}.value", f"{value!r}: expected one of {', '.join(STRATEGIES)}")
        else:
            strategies[sname] = value
    return Objective(otype, metric, goal, additional, strategies)


def _parameters(errors: _Errors, items: Any) -> list[Parameter]:
    if not items:
        errors.add("spec.parameters", "required: at least one parameter")
        return []
    out: list[Parameter] = []
    seen: set[str] = set()
    for i, p in enumerate(items):
        path = f"spec.parameters[{i}]"
        if not isinstance(p, dict):
            errors.add(path, "expected a mapping")
            continue
        name = str(p.get("name") or "")
        if not name:
            errors.add(f"{path}.name", "required")
        elif name in seen:
            errors.add(f"{path}.name", f"{name!r} is used twice")
        seen.add(name)
        ptype = p.get("parameterType")
        fs = p.get("feasibleSpace") or {}
        if ptype not in PARAMETER_TYPES:
            errors.add(f"{path}.parameterType", f"{ptype!r}: expected {', '.join(PARAMETER_TYPES)}")
            continue
        fpath = f"{path}.feasibleSpace"
        dist = fs.get("distribution") or "uniform"
        if ptype in ("int", "double"):
            if fs.get("list"):
                errors.add(f"{fpath}.list", f"not supported for parameterType {ptype}")
            if fs.get("min") in (None, "") or fs.get("max") in (None, ""):
                errors.add(fpath, f"min and max are required for parameterType {ptype}")
                continue
            lo = _num(errors, f"{fpath}.min", fs["min"])
            hi = _num(errors, f"{fpath}.max", fs["max"])
            step = None
            if fs.get("step") not in (None, ""):
                step = _num(errors, f"{fpath}.step", fs["step"])
                if step is not None and step <= 0:
                    errors.add(f"{fpath}.step", f"{fs['step']!r} must be greater than 0")
            if lo is None or hi is None:
                continue
            if lo >= hi:
                errors.add(fpath, f"min {fs['min']} must be less than max {fs['max']}")
            if ptype == "int":
                for key, v in (("min", lo), ("max", hi), ("step", step)):
                    if v is not None and v != int(v):
                        errors.add(f"{fpath}.{key}", f"{v} is not an integer (parameterType int)")
                step = step or 1
            if dist not in DISTRIBUTIONS:
                errors.add(
                    f"{fpath}.distribution", f"{dist!r}: expected {', '.join(DISTRIBUTIONS)}"
                )
            elif dist in ("logUniform", "logNormal") and lo <= 0:
                errors.add(f"{fpath}.min", f"{fs['min']} must be greater than 0 for {dist}")
            out.append(Parameter(name, ptype, lo, hi, step, [], dist))
        else:
            if any(fs.get(k) not in (None, "") for k in ("min", "max", "step")):
                errors.add(fpath, f"min, max and step are not supported for parameterType {ptype}")
            if fs.get("distribution"):
                errors.add(f"{fpath}.distribution", f"not supported for parameterType {ptype}")
            values = [str(v) for v in fs.get("list") or []]
            if not values:
                errors.add(f"{fpath}.list", f"required for parameterType {ptype}")
            elif len(set(values)) != len(values):
                errors.add(f"{fpath}.list", "has duplicate values")
            if ptype == "discrete":
                for v in values:
                    _num(errors, f"{fpath}.list", v)
            out.append(Parameter(name, ptype, values=values, distribution="uniform"))
    return out


def template_references(node: Any) -> set[str]:
    """Every `${trialParameters.NAME}` used anywhere in a trialSpec."""
    found: set[str] = set()
    if isinstance(node, dict):
        for v in node.values():
            found |= template_references(v)
    elif isinstance(node, list):
        for v in node:
            found |= template_references(v)
    elif isinstance(node, str):
        found |= set(TRIAL_PARAM_RE.findall(node))
    return found


def _trial_template(errors: _Errors, tt: dict, parameters: list[Parameter]) -> None:
    path = "spec.trialTemplate"
    spec = tt.get("trialSpec")
    if spec is None and tt.get("configMap") is None:
        errors.add(path, "one of trialSpec or configMap is required")
        return
    if spec is None:
        errors.add(f"{path}.configMap", "trial templates from ConfigMaps need --cluster")
        return
    if not isinstance(spec, dict) or not spec.get("apiVersion") or not spec.get("kind"):
        errors.add(f"{path}.trialSpec", "must have apiVersion and kind")
        return
    if spec.get("kind") == "Job" and str(spec.get("apiVersion")) == "batch/v1":
        tt.setdefault("successCondition", JOB_SUCCESS)
        tt.setdefault("failureCondition", JOB_FAILURE)
    else:
        for key in ("successCondition", "failureCondition"):
            if not tt.get(key):
                errors.add(f"{path}.{key}", f"required for trialSpec kind {spec.get('kind')}")
    if not tt.get("primaryContainerName"):
        errors.add(f"{path}.primaryContainerName", "required")
    names = {p.name for p in parameters}
    declared: set[str] = set()
    for i, tp in enumerate(tt.get("trialParameters") or []):
        tpath = f"{path}.trialParameters[{i}]"
        tname, ref = str(tp.get("name") or ""), str(tp.get("reference") or "")
        if not tname:
            errors.add(f"{tpath}.name", "required")
        if tname in declared:
            errors.add(f"{tpath}.name", f"{tname!r} is declared twice")
        declared.add(tname)
        if not ref:
            errors.add(f"{tpath}.reference", "required")
        elif ref not in names and not META_REF_RE.match(ref):
            errors.add(f"{tpath}.reference", f"{ref!r} is not a parameter in spec.parameters")
    used = template_references(spec)
    for missing in sorted(declared - used):
        errors.add(
            f"{path}.trialParameters",
            f"{missing!r} is not used in trialSpec as ${{trialParameters.{missing}}}",
        )
    for undeclared in sorted(used - declared):
        errors.add(
            f"{path}.trialSpec",
            f"${{trialParameters.{undeclared}}} is used but not declared in trialParameters",
        )


def _metrics_collector(errors: _Errors, mc: Any) -> list[str]:
    mc = mc or {}
    kind = ((mc.get("collector") or {}).get("kind")) or "StdOut"
    if kind not in COLLECTORS:
        errors.add("spec.metricsCollectorSpec.collector.kind", f"{kind!r} is not a collector kind")
    elif kind != "StdOut":
        errors.add(
            "spec.metricsCollectorSpec.collector.kind",
            f"{kind}: the local runner collects StdOut only (use --cluster for {kind})",
        )
    formats = ((mc.get("source") or {}).get("filter") or {}).get("metricsFormat") or []
    for i, f in enumerate(formats):
        try:
            groups = re.compile(f).groups
        except re.error as e:
            errors.add(f"spec.metricsCollectorSpec.source.filter.metricsFormat[{i}]", str(e))
            continue
        if groups < 2:
            errors.add(
                f"spec.metricsCollectorSpec.source.filter.metricsFormat[{i}]",
                f"{f!r} must have two subexpressions: metric name and value",
            )
    return list(formats) or [DEFAULT_METRICS_FORMAT]
