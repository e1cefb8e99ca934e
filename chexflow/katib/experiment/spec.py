"""Katib Experiment specs: reading the YAML, the mutating webhook's defaults and the validating
webhook's rules, then each suggestion and early stopping service's ValidateAlgorithmSettings.

`load_experiment(path)` reads a YAML file, applies Katib's defaults (parallelTrialCount 3,
metricStrategies from the objective type, StdOut collector and the File/TensorFlowEvent paths,
success/failure conditions and primary pod labels per trial kind) and checks the rules of
Katib's webhook (pkg/webhook/v1beta1/experiment/validator). Every problem, shape errors
included, is reported on one line with the field path, e.g. `spec.parameters[1].feasibleSpace.min:
...`. What the local runner cannot run is checked apart (runner.local_problems): a spec that
Katib accepts passes here.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from chexflow.errors import ChexflowError
from chexflow.katib.earlystopping.medianstop import validate_early_stopping
from chexflow.katib.experiment import yamltext
from chexflow.katib.experiment.batchjob import unknown_fields
from chexflow.katib.experiment.fields import check_path
from chexflow.katib.experiment.model import (
    API_VERSION,
    DEFAULT_FILE_PATH,
    DEFAULT_TFEVENT_DIR,
    TRIAL_PARAM_RE,
    Collector,
    ConfigMapTemplate,
    Experiment,
    Objective,
    Parameter,
    format_value,
)
from chexflow.katib.experiment.templates import (
    TRIAL_SPEC_PATH,
    resolve,
    unquoted_placeholder,
)
from chexflow.katib.experiment.trialspec import trailing_newline
from chexflow.katib.suggestions.validation import validate_algorithm

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40
PARAMETER_TYPES = ("int", "double", "categorical", "discrete")
DISTRIBUTIONS = ("uniform", "logUniform", "normal", "logNormal")
STRATEGIES = ("min", "max", "latest")
RESUME_POLICIES = ("Never", "LongRunning", "FromVolume")
COLLECTORS = ("StdOut", "File", "TensorFlowEvent", "PrometheusMetric", "Custom", "Push")
META_KEYS = ("Name", "Namespace", "Kind", "APIVersion")
META_REF_RE = re.compile(r"^\$\{trialSpec\.(.+?)\}$")
TWO_GROUPS = re.compile(r".*\(.*\).*\(.*\).*")
# Katib's defaults per trial kind (experiment_defaults.go, constants.go).
JOB_SUCCESS = 'status.conditions.#(type=="Complete")#|#(status=="True")#'
JOB_FAILURE = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
KUBEFLOW_SUCCESS = 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
DEFAULT_CONDITIONS = {
    "Job": (JOB_SUCCESS, JOB_FAILURE, None),
    "TrainJob": (JOB_SUCCESS, JOB_FAILURE, {"jobset.sigs.k8s.io/replicatedjob-name": "node",
                                            "batch.kubernetes.io/job-completion-index": "0"}),
    **{kind: (KUBEFLOW_SUCCESS, JOB_FAILURE, {"training.kubeflow.org/job-role": "master"})
       for kind in ("TFJob", "PyTorchJob", "XGBoostJob", "MPIJob")},
}


class SpecError(ChexflowError):
    """The Experiment YAML is not valid; the message names the file and field."""


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

    def mapping(self, path: str, value: Any, required: bool = False) -> dict:
        """The value when it is a mapping; {} (and an error unless absent and optional) if not."""
        if isinstance(value, dict):
            return value
        if value is None:
            if required:
                self.add(path, "must be specified")
            return {}
        self.add(path, f"expected a mapping, got {_shape(value)}")
        return {}

    def text(self, path: str, value: Any) -> str:
        """A string field: numbers are read as their text; a mapping or list is an error."""
        if value is None:
            return ""
        if isinstance(value, (dict, list)):
            self.add(path, f"expected a string, got {_shape(value)}")
            return ""
        return str(value)

    def sequence(self, path: str, value: Any, items: type | None = None) -> list:
        """The value when it is a list (of `items`); [] and an error if not."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"expected a list, got {_shape(value)}")
            return []
        if items is dict:
            bad = [i for i, v in enumerate(value) if not isinstance(v, dict)]
        elif items is str:
            bad = [i for i, v in enumerate(value) if not isinstance(v, (str, int, float))
                   or isinstance(v, bool)]
        else:
            bad = []
        for i in bad:
            what = "a mapping" if items is dict else "a string"
            self.add(f"{path}[{i}]", f"expected {what}, got {_shape(value[i])}")
        return [v for i, v in enumerate(value) if i not in bad]


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def load_experiment(path: Path | str, overrides: list[str] | None = None,
                    trial_templates: Path | None = None) -> Experiment:
    """Read, default and validate an Experiment YAML file (`overrides`: `--set PATH=VALUE`);
    a ConfigMap template is read from `trial_templates` or beside the spec (templates.py)."""
    path = Path(path)
    try:
        docs = yamltext.load_all(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise SpecError(f"{path}: no such file") from e
    except IsADirectoryError as e:
        raise SpecError(f"{path}: a folder; expected an Experiment YAML file") from e
    except PermissionError as e:
        raise SpecError(f"{path}: not readable ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte {e.start}); expected an Experiment "
                        "YAML file") from e
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: {yamltext.problem(e)}") from None
    exps = [d for d in docs if isinstance(d, dict) and d.get("kind") == "Experiment"]
    if len(exps) != 1:
        raise SpecError(f"{path}: expected one document of kind Experiment, found {len(exps)}")
    raw = copy.deepcopy(exps[0])
    # --set into the trialSpec after its ConfigMap's template is inlined (templates.resolve)
    later = [o for o in overrides or [] if o.startswith(TRIAL_SPEC_PATH)]
    for item in overrides or []:
        if item not in later:
            apply_override(raw, item, str(path))
    config_map, files = resolve(raw, path, trial_templates, later)
    for item in later:
        apply_override(raw, item, str(path))
    return parse_experiment(raw, str(path), config_map, files)


def apply_override(raw: dict, item: str, source: str = "") -> None:
    """`spec.maxTrialCount=2` or `spec.parameters[0].feasibleSpace.max=0.1` (YAML value);
    `null` removes a mapping's field (`spec.earlyStopping=null`: no early stopping)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise SpecError(f"--set {item!r}: expected PATH=VALUE, e.g. spec.maxTrialCount=4")
    try:
        value = yamltext.load(text)
    except yamltext.DuplicateKey as e:
        raise SpecError(f"--set {item!r}: {e.text()}") from None
    except yaml.YAMLError as e:
        quoted = shlex.quote(json.dumps(text, ensure_ascii=False))  # a YAML string, for sh
        raise SpecError(f"--set {item!r}: the value is not valid YAML "
                        f"({str(e).splitlines()[0]}); quote it as a string, e.g. "
                        f"{key}={quoted}") from None
    tokens = re.findall(r"[^.\[\]]+|\[\d+\]", key)
    problem = check_path(tokens)
    if problem:
        raise SpecError(f"--set {item}: {problem}")
    node: Any = raw
    for i, tok in enumerate(tokens):
        last = i == len(tokens) - 1
        if tok.startswith("["):
            idx = int(tok[1:-1])
            if not isinstance(node, list) or idx >= len(node):
                raise SpecError(f"{source}: --set {key}: {tok} is not an index of a list there")
            if last:
                node[idx] = value
            node = node[idx]
        else:
            if not isinstance(node, dict):
                raise SpecError(f"{source}: --set {key}: {tok!r} is not a field of a mapping")
            if last and value is None:
                node.pop(tok, None)
            elif last:
                node[tok] = value
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


def _count(errors: _Errors, spec: dict, key: str, minimum: int, msg: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(f"spec.{key}", f"{value!r} must be an integer")
        return None
    if value < minimum:
        errors.add(f"spec.{key}", f"{value} {msg}")
        return None
    return value


def _settings(errors: _Errors, path: str, items: Any) -> dict[str, str]:
    """algorithmSettings: a list of {name, value}; values are strings (numbers normalised)."""
    out: dict[str, str] = {}
    for i, s in enumerate(errors.sequence(path, items, dict)):
        if "name" not in s:
            errors.add(f"{path}[{i}]", "expected {name, value}")
            continue
        value = s.get("value", "")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            s["value"] = value = str(value)
        out[errors.text(f"{path}[{i}].name", s["name"])] = errors.text(f"{path}[{i}].value", value)
    return out


def parse_experiment(raw: dict, source: str = "", config_map: ConfigMapTemplate | None = None,
                     template_files: list[Path] | None = None) -> Experiment:
    """Katib's defaults and validation of an Experiment document already read from YAML
    (`config_map`: its ConfigMap template, read from `template_files`, checked as Katib's
    webhook checks the one it reads from the cluster)."""
    errors = _Errors(source)
    meta, name, spec = _metadata(errors, raw)
    errors.raise_if_any()
    max_failed, max_trials, parallel = _trial_counts(errors, spec)
    objective = _objective(errors, spec.get("objective"))
    if objective is None:  # Katib stops at a bad objective
        errors.raise_if_any()
    algorithm, algorithm_settings = _algorithm(errors, spec.get("algorithm"), required=True,
                                               path="spec.algorithm")
    early_stopping, es_settings = _algorithm(errors, spec.get("earlyStopping"), required=False,
                                             path="spec.earlyStopping")
    _resume_policy(errors, spec)
    parameters = _parameters(errors, spec)
    template = errors.mapping("spec.trialTemplate", spec.get("trialTemplate"), required=True)
    if "configMap" not in template:
        config_map = None
    _trial_template(errors, template, parameter_names(spec), config_map)
    collector = _metrics_collector(errors, spec)
    exp = Experiment(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        objective=objective,
        algorithm=algorithm,
        algorithm_settings=algorithm_settings,
        early_stopping=early_stopping or None,
        early_stopping_settings=es_settings,
        parallel_trial_count=parallel or 3,
        max_trial_count=max_trials,
        max_failed_trial_count=max_failed,
        parameters=parameters,
        trial_template=template,
        collector=collector,
        raw=raw,
        source=source,
        config_map=config_map,
        template_files=list(template_files or []),
    )
    _whole_experiment_rules(errors, exp)
    errors.raise_if_any()
    return exp


def _metadata(errors: _Errors, raw: dict) -> tuple[dict, str, dict]:
    """apiVersion, metadata.name and that spec is a mapping: (metadata, name, spec)."""
    if raw.get("apiVersion") != API_VERSION:
        errors.add("apiVersion", f"{raw.get('apiVersion')!r}: expected {API_VERSION}")
    meta = errors.mapping("metadata", raw.get("metadata"), required=True)
    name = errors.text("metadata.name", meta.get("name"))
    if not name:
        errors.add("metadata.name", "required")
    elif not NAME_RE.match(name) or len(name) > NAME_MAX:
        errors.add(
            "metadata.name",
            f"{name!r}: name must consist of lower case alphanumeric characters or '-', start "
            f"with an alphabetic character, and end with an alphanumeric character, and may "
            f"not be longer than {NAME_MAX} characters",
        )
    return meta, name, errors.mapping("spec", raw.get("spec"), required=True)


def _trial_counts(errors: _Errors, spec: dict) -> tuple[int | None, int | None, int | None]:
    """maxFailedTrialCount, maxTrialCount and parallelTrialCount (default 3), each checked
    alone and against maxTrialCount."""
    max_failed = _count(errors, spec, "maxFailedTrialCount", 0, "should not be less than 0")
    max_trials = _count(errors, spec, "maxTrialCount", 1, "must be greater than 0")
    spec.setdefault("parallelTrialCount", 3)
    parallel = _count(errors, spec, "parallelTrialCount", 1, "must be greater than 0")
    if max_trials is not None and max_failed is not None and max_failed > max_trials:
        errors.add("spec.maxFailedTrialCount", "should be less than or equal to spec.maxTrialCount")
    if max_trials is not None and parallel is not None and parallel > max_trials:
        errors.add("spec.parallelTrialCount", "should be less than or equal to spec.maxTrialCount")
    return max_failed, max_trials, parallel


def _algorithm(errors: _Errors, value: Any, required: bool, path: str) -> tuple[str, dict]:
    """spec.algorithm or spec.earlyStopping: its algorithmName ("" when absent and optional)
    and algorithmSettings."""
    section = errors.mapping(path, value, required=required)
    name = errors.text(f"{path}.algorithmName", section.get("algorithmName"))
    if not name and (required or section):
        errors.add(f"{path}.algorithmName", "must be specified")
    return name, _settings(errors, f"{path}.algorithmSettings", section.get("algorithmSettings"))


def _resume_policy(errors: _Errors, spec: dict) -> None:
    """spec.resumePolicy, Never by default (the local runner resumes from its state folder)."""
    resume = spec.setdefault("resumePolicy", "Never")
    if resume not in RESUME_POLICIES:
        errors.add("spec.resumePolicy", f"{resume!r}: invalid ResumePolicyType "
                   f"(expected {', '.join(RESUME_POLICIES)})")


def _whole_experiment_rules(errors: _Errors, exp: Experiment) -> None:
    """What the algorithm's and the early stopping's services check (ValidateAlgorithmSettings,
    ValidateEarlyStoppingSettings), then what Katib accepts but runs badly: a command whose
    metrics it would lose, a ConfigMap template's placeholder that lost its quotes."""
    if exp.algorithm and not errors.items:
        for path, msg in validate_algorithm(exp):
            errors.add(path, msg)
    if exp.early_stopping:
        for path, msg in validate_early_stopping(exp):
            errors.add(path, msg)
    if not errors.items and (newline := trailing_newline(exp)) is not None:
        errors.add(*newline)  # stricter than Katib, which runs it and loses the metrics
    if (not errors.items and exp.config_map is not None
            and "configMap" in exp.trial_template):
        unquoted = unquoted_placeholder(exp.config_map, placeholder_values(exp))
        if unquoted is not None:  # Katib would leave each Trial in Created
            errors.add(*unquoted)


def _objective(errors: _Errors, value: Any) -> Objective | None:
    n = len(errors.items)
    obj = errors.mapping("spec.objective", value, required=True)
    if not obj:
        return None
    otype = obj.get("type")
    if otype not in ("maximize", "minimize"):
        errors.add("spec.objective.type", f"{otype!r}: must be minimize or maximize")
    metric = errors.text("spec.objective.objectiveMetricName", obj.get("objectiveMetricName"))
    if not metric:
        errors.add("spec.objective.objectiveMetricName", "must be specified")
    path = "spec.objective.additionalMetricNames"
    additional = [str(m) for m in errors.sequence(path, obj.get("additionalMetricNames"), str)]
    if metric in additional:
        errors.add(path, "should not contain spec.objective.objectiveMetricName")
    goal = None
    if obj.get("goal") is not None:
        goal = _num(errors, "spec.objective.goal", obj["goal"])
    default = "max" if otype == "maximize" else "min"
    strategies = {m: default for m in [metric, *additional]}
    path = "spec.objective.metricStrategies"
    for i, s in enumerate(errors.sequence(path, obj.get("metricStrategies"), dict)):
        sname = errors.text(f"{path}[{i}].name", s.get("name"))
        value = errors.text(f"{path}[{i}].value", s.get("value"))
        if sname not in strategies:
            errors.add(f"{path}[{i}].name", f"{sname!r} is not the objective or an additional "
                       "metric")
        elif value not in STRATEGIES:
            errors.add(f"{path}[{i}].value", f"{value!r}: expected one of {', '.join(STRATEGIES)}")
        else:
            strategies[sname] = value
    if len(errors.items) > n:
        return None
    return Objective(otype, metric, goal, additional, strategies)


def parse_parameters(items: list[dict], source: str = "") -> list[Parameter]:
    """spec.parameters (Katib's YAML shape) with Katib's defaults and validation."""
    errors = _Errors(source)
    parameters = _parameters(errors, {"parameters": items})
    errors.raise_if_any()
    return parameters


def _parameters(errors: _Errors, spec: dict) -> list[Parameter]:
    items = errors.sequence("spec.parameters", spec.get("parameters"), dict)
    if not items and spec.get("nasConfig") is None:
        errors.add("spec", "spec.parameters or spec.nasConfig must be specified")
    if items and spec.get("nasConfig") is not None:
        errors.add("spec", "only one of spec.parameters and spec.nasConfig can be specified")
    out: list[Parameter] = []
    for i, p in enumerate(items):
        path = f"spec.parameters[{i}]"
        name = errors.text(f"{path}.name", p.get("name"))
        if not name:
            errors.add(f"{path}.name", "required")
        ptype = p.get("parameterType")
        fpath = f"{path}.feasibleSpace"
        fs = errors.mapping(fpath, p.get("feasibleSpace"))
        if ptype not in PARAMETER_TYPES:
            errors.add(f"{path}.parameterType", f"parameterType: {ptype} is not supported "
                       f"(expected {', '.join(PARAMETER_TYPES)})")
            continue
        if not fs:
            errors.add(fpath, "feasibleSpace must be specified")
            continue
        dist = fs.get("distribution") or "uniform"
        if dist not in DISTRIBUTIONS:
            errors.add(f"{fpath}.distribution", f"distribution: {dist} is not supported "
                       f"(expected {', '.join(DISTRIBUTIONS)})")
        for key in ("min", "max", "step"):  # Katib's fields are strings
            if isinstance(fs.get(key), (int, float)) and not isinstance(fs.get(key), bool):
                fs[key] = str(fs[key])
        values = [str(v) for v in errors.sequence(f"{fpath}.list", fs.get("list"), str)]
        if fs.get("list") and values:
            fs["list"] = values
        param = (_numeric(errors, fpath, name, ptype, fs, dist) if ptype in ("int", "double")
                 else _listed(errors, fpath, name, ptype, fs, values))
        if param is not None:
            out.append(param)
    return out


def _numeric(errors: _Errors, fpath: str, name: str, ptype: str, fs: dict,
             dist: str) -> Parameter | None:
    if fs.get("list"):
        errors.add(f"{fpath}.list", f"feasibleSpace.list is not supported for parameterType: "
                   f"{ptype}")
    if fs.get("min") in (None, "") or fs.get("max") in (None, ""):
        errors.add(f"{fpath}.max", "feasibleSpace.max or feasibleSpace.min must be specified "
                   f"for parameterType: {ptype}")
        return None
    lo = _num(errors, f"{fpath}.min", fs["min"])
    hi = _num(errors, f"{fpath}.max", fs["max"])
    step = None
    if fs.get("step") not in (None, ""):
        step = _num(errors, f"{fpath}.step", fs["step"])
        if step is not None and step <= 0:
            errors.add(f"{fpath}.step", f"{fs['step']!r} must be greater than 0")
            step = None
    if lo is None or hi is None:
        return None
    if lo > hi:
        errors.add(fpath, f"min {fs['min']} must not be greater than max {fs['max']}")
        return None
    if dist in ("logUniform", "logNormal") and lo <= 0:
        errors.add(f"{fpath}.min", f"{fs['min']} must be greater than 0 for {dist}")
    param = Parameter(name, ptype, lo, hi, step, [], dist)
    if ptype == "int":
        param.step = step or 1
        if param.low > param.high:
            errors.add(fpath, f"no integer between min {fs['min']} and max {fs['max']}")
            return None
    return param


def _listed(errors: _Errors, fpath: str, name: str, ptype: str, fs: dict,
            values: list[str]) -> Parameter | None:
    if any(fs.get(k) not in (None, "") for k in ("min", "max", "step")):
        errors.add(fpath, f"feasibleSpace .max, .min and .step is not supported for "
                   f"parameterType: {ptype}")
    if not values:
        errors.add(f"{fpath}.list", f"required for parameterType {ptype}")
        return None
    if len(set(values)) != len(values):
        errors.add(f"{fpath}.list", "has duplicate values")
    if ptype == "discrete":
        for v in values:
            _num(errors, f"{fpath}.list", v)
    return Parameter(name, ptype, values=values, distribution="uniform")


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


def placeholder_values(exp: Experiment) -> dict[str, list[str]]:
    """Each trialParameter's values as Katib substitutes them: a parameter's bounds or list
    (meta references, names, stay strings)."""
    params = {p.name: p for p in exp.parameters}
    out: dict[str, list[str]] = {}
    for tp in exp.trial_parameters:
        p = params.get(str(tp.get("reference")))
        if p is not None:
            out[str(tp.get("name"))] = ([format_value(p, p.low), format_value(p, p.high)]
                                        if p.numeric else list(p.values))
    return out


def is_meta_reference(ref: str) -> bool:
    """`${trialSpec.Name}`, `${trialSpec.Labels[key]}` and the like (Katib's isMetaKey)."""
    m = META_REF_RE.match(ref)
    if not m:
        return False
    key = m.group(1)
    sub = re.match(r"^(.+)\[(.+)\]$", key)
    return key in META_KEYS or bool(sub and sub.group(1) in ("Labels", "Annotations"))


def _apply_kind_defaults(tt: dict, kind: str) -> None:
    """Katib's success/failure conditions and primary pod labels for the trial's kind."""
    if kind not in DEFAULT_CONDITIONS:
        return
    success, failure, labels = DEFAULT_CONDITIONS[kind]
    tt.setdefault("successCondition", success)
    tt.setdefault("failureCondition", failure)
    if labels and not tt.get("primaryPodLabels"):
        tt["primaryPodLabels"] = dict(labels)


def parameter_names(spec: dict) -> set[str]:
    """The names spec.parameters gives, also of parameters with an error of their own (a
    reference to one is no second error)."""
    items = spec.get("parameters")
    if not isinstance(items, list):
        return set()
    return {str(p["name"]) for p in items if isinstance(p, dict) and p.get("name")}


def _trial_template(errors: _Errors, tt: dict, names: set[str],
                    config_map: ConfigMapTemplate | None) -> None:
    """spec.trialTemplate as Katib's webhook checks it: its source (a trialSpec or a ConfigMap
    template, as `config_map` holds it), its trialParameters against spec.parameters and the
    template, then the template's body."""
    path = "spec.trialTemplate"
    if not tt:
        return
    source = _template_source(errors, tt, path)
    if source is None:
        return
    spec, trial_params = source
    body, where = spec, f"{path}.trialSpec"
    if spec is None and config_map is not None:  # as Katib's webhook reads it from the cluster
        body, where = config_map.trial_spec, f"{path}.configMap: {config_map.where}"
    used = template_references(body) if body is not None else None
    declared = _trial_parameters(errors, trial_params, names, used)
    if declared is None or body is None:  # a ConfigMap template not read here: Katib reads it
        return
    for undeclared in sorted(used - declared):
        errors.add(where, f"parameters: ${{trialParameters.{undeclared}}} in "
                   "spec.trialTemplate not found in spec.trialParameters")
    _template_body(errors, body, where, inline=spec is not None)


def _template_source(errors: _Errors, tt: dict, path: str) -> tuple[dict | None, list] | None:
    """The trialSpec (None for a ConfigMap template) and the trialParameters, with Katib's
    kind defaults applied; None when the template cannot be checked further."""
    spec, cm = tt.get("trialSpec"), tt.get("configMap")
    if spec is not None:
        spec = errors.mapping(f"{path}.trialSpec", spec)
        _apply_kind_defaults(tt, str(spec.get("kind") or ""))
    if not tt.get("primaryContainerName"):
        errors.add(f"{path}.primaryContainerName", "must be specified")
    if not tt.get("successCondition") or not tt.get("failureCondition"):
        errors.add(path, "successCondition and failureCondition must be specified")
    if tt.get("trialParameters") is None:
        errors.add(f"{path}.trialParameters", "must be specified")
        return None
    trial_params = errors.sequence(f"{path}.trialParameters", tt.get("trialParameters"), dict)
    if spec is None and cm is None:
        errors.add(f"{path}.TrialSource",
                   "spec.trialTemplate.trialSpec or spec.trialTemplate.configMap must be specified")
        return None
    if spec is not None and cm is not None:
        errors.add(path, "only one of spec.trialTemplate.trialSpec or spec.trialTemplate.configMap "
                   "can be specified")
        return None
    if cm is not None:
        cm = errors.mapping(f"{path}.configMap", cm)
        if not all(cm.get(k) for k in ("configMapName", "configMapNamespace", "templatePath")):
            errors.add(f"{path}.configMap",
                       "configMapName, configMapNamespace and templatePath must be specified")
    return spec, trial_params


def _trial_parameters(errors: _Errors, trial_params: list[dict], names: set[str],
                      used: set[str] | None) -> set[str] | None:
    """The trialParameters' names, each checked (name and reference given, neither twice, the
    reference a parameter, the name used in the template: `used`, unless it was not read);
    None after a name the template does not use, where Katib's webhook stops."""
    path = "spec.trialTemplate"
    declared: set[str] = set()
    refs: set[str] = set()
    for i, tp in enumerate(trial_params):
        tpath = f"{path}.trialParameters[{i}]"
        tname = errors.text(f"{tpath}.name", tp.get("name"))
        ref = errors.text(f"{tpath}.reference", tp.get("reference"))
        if not tname or not ref or "{" in tname or "}" in tname:
            errors.add(tpath, "name and reference must be specified and name must not contain "
                       "'{' or '}'")
            continue
        if tname in declared:
            errors.add(f"{tpath}.name", f"parameter name {tname} can't be duplicated in "
                       "spec.trialTemplate.trialParameters")
            continue
        if ref in refs:
            errors.add(f"{tpath}.reference", f"parameter reference {ref} can't be duplicated in "
                       "spec.trialTemplate.trialParameters")
            continue
        declared.add(tname)
        refs.add(ref)
        if names and ref not in names and not is_meta_reference(ref):
            errors.add(f"{tpath}.reference",
                       f"parameter reference {ref} does not exist in spec.parameters")
        if used is not None and tname not in used:
            errors.add(f"{tpath}.name", f"parameter name: {tname} in spec.trialParameters not "
                       f"found in spec.trialTemplate (as ${{trialParameters.{tname}}})")
            return None
    return declared


def _template_body(errors: _Errors, body: dict, where: str, inline: bool) -> None:
    """The template itself: no name or namespace of its own, an apiVersion and kind, and a
    batch/v1 Job only with fields a Job has."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    if meta.get("name") or meta.get("namespace"):
        errors.add(f"{where}.metadata" if inline else where,
                   "metadata.name and metadata.namespace in spec.trialTemplate must be omitted")
    if not body.get("apiVersion") or not body.get("kind"):
        errors.add(where, "APIVersion and Kind in spec.trialTemplate must be specified")
    elif body.get("kind") == "Job" and body.get("apiVersion") == "batch/v1":
        for pointer in unknown_fields(body):
            errors.add(where, f"invalid spec.trialTemplate: unable to convert: "
                       f"{pointer} to Job (no such field)")
    elif body.get("kind") == "MPIJob":
        _mpijob_gang(errors, body, where)


def _mpijob_gang(errors: _Errors, body: dict, where: str) -> None:
    """An MPIJob whose launcher waits for its workers (WaitForWorkersReady) with a gang larger
    than its workers: a gang-scheduling mpi-operator (--gang-scheduling, as many clusters run
    it) makes a PodGroup of minAvailable pods that never all exist, and the Trial waits forever
    (chexflow's check: Katib accepts it). A `--set` of Worker.replicas alone does this."""
    def field(node: object, key: str) -> dict:
        value = node.get(key) if isinstance(node, dict) else None
        return value if isinstance(value, dict) else {}

    spec = field(body, "spec")  # any part of another shape is told by Katib's schema, not here
    policy = field(field(spec, "runPolicy"), "schedulingPolicy")
    gang, workers = policy.get("minAvailable"), field(field(spec, "mpiReplicaSpecs"),
                                                        "Worker").get("replicas")
    if (spec.get("launcherCreationPolicy") == "WaitForWorkersReady" and isinstance(gang, int)
            and isinstance(workers, int) and gang > workers):
        errors.add(f"{where}.spec.runPolicy.schedulingPolicy.minAvailable",
                   f"a gang of {gang} pods, but the launcher waits for its workers, "
                   f"mpiReplicaSpecs.Worker.replicas {workers}: a gang scheduler would hold them "
                   f"forever; set minAvailable to {workers} with the replicas")


def _metrics_collector(errors: _Errors, spec: dict) -> Collector:
    path = "spec.metricsCollectorSpec"
    mc = errors.mapping(path, spec.get("metricsCollectorSpec"))
    spec_collector = errors.mapping(f"{path}.collector", mc.get("collector"))
    kind = str(spec_collector.get("kind") or "StdOut")
    src_path = f"{path}.source"
    source = errors.mapping(src_path, mc.get("source"))
    fsp = errors.mapping(f"{src_path}.fileSystemPath", source.get("fileSystemPath"))
    flt = errors.mapping(f"{src_path}.filter", source.get("filter"))
    filters = [str(f) for f in errors.sequence(f"{src_path}.filter.metricsFormat",
                                               flt.get("metricsFormat"), str)]
    collector = Collector(kind, filters=filters)
    if kind not in COLLECTORS:
        errors.add(f"{path}.collector.kind", f"invalid metrics collector kind: {kind}")
    elif kind == "File":
        collector.path = str(fsp.get("path") or DEFAULT_FILE_PATH)
        collector.file_format = str(fsp.get("format") or "TEXT")
        if (fsp.get("kind") or "File") != "File" or not collector.path.startswith("/"):
            errors.add(f"{src_path}.fileSystemPath.path",
                       "file path where metrics file exists is required")
        if collector.file_format not in ("TEXT", "JSON"):
            errors.add(f"{src_path}.fileSystemPath.format",
                       "format of metrics file is required for metrics collector (TEXT or JSON)")
        if collector.file_format == "JSON" and source.get("filter") is not None:
            errors.add(f"{src_path}.filter", "filter must be nil when format of metrics file is "
                       "json")
    elif kind == "TensorFlowEvent":
        collector.path = str(fsp.get("path") or DEFAULT_TFEVENT_DIR)
        if (fsp.get("kind") or "Directory") != "Directory" or not collector.path.startswith("/"):
            errors.add(src_path, "directory path where tensorflow event files exist is required "
                       "by .spec.metricsCollectorSpec.source.fileSystemPath.path")
        if fsp.get("format"):
            errors.add(f"{src_path}.fileSystemPath.format", f"{fsp['format']!r}: must be empty")
    elif kind == "PrometheusMetric":
        get = errors.mapping(f"{src_path}.httpGet", source.get("httpGet"))
        port, hpath = get.get("port", 8080), str(get.get("path") or "/metrics")
        if not str(port).isdigit() or int(port) <= 0:
            errors.add(f"{src_path}.httpGet.port", f"{port!r}: must be a positive integer value "
                       "for metrics collector kind: PrometheusMetric")
        if not hpath.startswith("/"):
            errors.add(f"{src_path}.httpGet.path", f"{hpath!r}: path is invalid for metrics "
                       "collector kind: PrometheusMetric")
    elif kind == "Custom":
        if not spec_collector.get("customCollector"):
            errors.add(f"{path}.collector.customCollector",
                       "metrics collector kind: Custom is required")
        if fsp and (not str(fsp.get("path") or "").startswith("/")
                    or fsp.get("kind") not in ("Directory", "File")):
            errors.add(f"{src_path}.fileSystemPath", ".spec.metricsCollectorSpec.source is "
                       "invalid")
    for i, f in enumerate(filters):
        fpath = f"{src_path}.filter.metricsFormat[{i}]"
        try:
            re.compile(f)
        except re.error as e:
            errors.add(fpath, f"invalid filter: {e}")
            continue
        if not TWO_GROUPS.match(f):
            errors.add(fpath, f"{f!r}: two top subexpressions are required")
    return collector
