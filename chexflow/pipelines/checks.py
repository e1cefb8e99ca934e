"""A pipeline's arguments checked before any of its steps runs, by the steps' own rules.

The pipeline's compiled form (its KFP pipeline spec) says which value reaches which input of
which step: a pipeline parameter, a constant of the definition, an item of a ParallelFor over a
parameter, or an earlier step's output. `check_arguments` follows those wires from the
arguments to every step, checks each value against the type the step's input declares, and
hands each step's inputs known before the run to the step's own check
(chexflow.components.steps.STEP_CHECKS: the functions the step calls before its job). A value a
step would refuse after the steps before it have run for minutes is refused at once, in one
line naming the option it came from.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from graphlib import TopologicalSorter
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.pipelines.registry import build, pipeline_parameters

# KFP's parameter types: the JSON values each takes, and in words
KFP_TYPES = {"STRING": (str,), "NUMBER_INTEGER": (int,), "NUMBER_DOUBLE": (int, float),
             "BOOLEAN": (bool,), "LIST": (list,), "STRUCT": (dict,)}
KFP_WORDS = {"STRING": "a string", "NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number",
             "BOOLEAN": "true or false", "LIST": "a list", "STRUCT": "a JSON object"}
# What a constant of the definition is called in a message
OWN_VALUE = "the pipeline definition's own value"


class ArgumentError(ChexflowError):
    """A pipeline argument a step would refuse."""


@dataclass(frozen=True)
class Value:
    """A value known before the run, and where it came from (an option, or the definition)."""

    value: Any
    source: str


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def pipeline_spec(name: str, mount_path: str | None = None) -> dict[str, Any]:
    """The pipeline's KFP pipeline spec as a dict (built once per process)."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(build(name, mount_path=mount_path).pipeline_spec)


def shown(text: str) -> str:
    """TEXT as a message shows it: as it is, or quoted with escapes where it holds a line break
    or another character that does not print (a message stays one line)."""
    return text if text and text.isprintable() else repr(text)


def printable(value: Any) -> bool:
    """Whether every string in a JSON value prints (no line break, tab, ...)."""
    if isinstance(value, str):
        return value.isprintable()
    if isinstance(value, dict):
        return all(printable(k) and printable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(printable(v) for v in value)
    return True


def typed(kind: str, value: Any, where: str) -> Any:
    """VALUE as KFP's parameter type KIND takes it (an integral float is an integer, an integer a
    number: KFP hands numbers over as floats), its strings free of characters that do not print
    (line breaks, ...: no path, name or option holds them); ArgumentError naming WHERE
    otherwise."""
    if kind == "NUMBER_INTEGER" and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, KFP_TYPES.get(kind, (object,)))
    if not ok or (kind != "BOOLEAN" and isinstance(value, bool)):
        raise ArgumentError(f"{where} {json.dumps(value)}: expected {KFP_WORDS[kind]}")
    if not printable(value):
        raise ArgumentError(f"{where} {json.dumps(value)}: holds a line break or another "
                            "character that does not print")
    return float(value) if kind == "NUMBER_DOUBLE" else value


def check_arguments(name: str, arguments: dict[str, Any],
                    mount_path: str | None = None) -> dict[str, Any]:
    """Check pipeline NAME's ARGUMENTS (a parameter left out is unknown, e.g. data a run will
    generate) before the run, as every step will; return them with the defaults the pipeline
    gives the others. ArgumentError (or the step's own error) in one line otherwise."""
    spec = pipeline_spec(name, mount_path)
    declared = spec["root"]["inputDefinitions"]["parameters"]
    unknown = sorted(set(arguments) - set(declared))
    if unknown:
        raise ArgumentError(f"{', '.join(map(flag, unknown))}: not a parameter of {name}")
    full = {k: d["defaultValue"] for k, d in declared.items() if "defaultValue" in d}
    full.update(arguments)
    env = {k: Value(typed(declared[k]["parameterType"], v, flag(k)), flag(k))
           for k, v in full.items()}
    _check_dag(spec, spec["root"], env)
    order = [p.name for p in pipeline_parameters(name) if p.name in env]  # the signature's
    return {k: env[k].value for k in [*order, *(k for k in env if k not in order)]}


def _check_dag(spec: dict[str, Any], component: dict[str, Any], env: dict[str, Value]) -> None:
    """Every task of a DAG in order: a sub-DAG (a ParallelFor's body) once per item, a step
    through its check; what a step's check returns feeds the tasks after it."""
    tasks = component["dag"].get("tasks", {})
    order = TopologicalSorter({t: [d for d in tasks[t].get("dependentTasks", []) if d in tasks]
                               for t in tasks})
    outputs: dict[str, dict[str, Value]] = {}
    for name in order.static_order():
        task = tasks[name]
        inputs = {k: v for k, ref in task.get("inputs", {}).get("parameters", {}).items()
                  if (v := _resolve(ref, env, outputs)) is not None}
        callee = spec["components"][task["componentRef"]["name"]]
        if _condition_false(task, inputs):
            continue  # a dsl.If whose parameter says it will not run (deploy=False)
        if "dag" in callee:
            for item_env in _iterations(task, inputs):
                _check_dag(spec, callee, item_env)
        else:
            outputs[name] = _check_step(spec, name, callee, inputs)


CONDITION = re.compile(r"^inputs\.parameter_values\['([^']+)'\] == (true|false)$")


def _condition_false(task: dict[str, Any], inputs: dict[str, Value]) -> bool:
    """A task under a dsl.If of one parameter compared with true or false (KFP's CEL), whose
    value is known now and fails it; any other condition is taken to hold."""
    match = CONDITION.match(task.get("triggerPolicy", {}).get("condition", ""))
    if not match or match.group(1) not in inputs:
        return False
    return bool(inputs[match.group(1)].value) != (match.group(2) == "true")


def _resolve(ref: dict[str, Any], env: dict[str, Value],
             outputs: dict[str, dict[str, Value]]) -> Value | None:
    """The value a task input is wired to, if it is known before the run."""
    if "componentInputParameter" in ref:
        return env.get(ref["componentInputParameter"])
    if "runtimeValue" in ref:
        constant = ref["runtimeValue"].get("constant")
        if isinstance(constant, str) and constant.startswith("{{$"):
            return None  # a placeholder KFP fills in as the run starts: its run id, ...
        return Value(constant, OWN_VALUE)
    if "taskOutputParameter" in ref:
        out = ref["taskOutputParameter"]
        return outputs.get(out["producerTask"], {}).get(out["outputParameterKey"])
    return None


def _iterations(task: dict[str, Any], inputs: dict[str, Value]) -> Iterator[dict[str, Value]]:
    """A sub-DAG's inputs: once, or for a ParallelFor once per item of a known list."""
    loop = task.get("parameterIterator")
    if loop is None:
        yield inputs
        return
    source = loop["items"].get("inputParameter")
    if "raw" in loop["items"]:
        items = Value(json.loads(loop["items"]["raw"]), OWN_VALUE)
    else:
        items = inputs.get(source)
    if items is None:  # an earlier step's output: not known before the run
        yield inputs
        return
    if not items.value:
        raise ArgumentError(f"{items.source} []: the pipeline runs its steps once per item of "
                            "this list; give at least one")
    for item in items.value:
        yield {**inputs, loop["itemInput"]: Value(item, f"{items.source} item")}


def _check_step(spec: dict[str, Any], task: str, component: dict[str, Any],
                given: dict[str, Value]) -> dict[str, Value]:
    """A step's known inputs (with its own defaults) checked against the types it declares,
    then by its own check; the outputs that check knows."""
    from chexflow.components.steps import check_step

    declared = component.get("inputDefinitions", {}).get("parameters", {})
    inputs = {k: Value(d["defaultValue"], OWN_VALUE) for k, d in declared.items()
              if "defaultValue" in d}
    inputs.update(given)
    values = {}
    for key, v in inputs.items():
        kind = declared.get(key, {}).get("parameterType")
        where = v.source if v.source != OWN_VALUE else f"{task}'s input {key} ({OWN_VALUE})"
        values[key] = typed(kind, v.value, where) if kind else v.value
    executor = spec["deploymentSpec"]["executors"][component["executorLabel"]]
    args = executor["container"].get("args", [])
    function = args[args.index("--function_to_execute") + 1] \
        if "--function_to_execute" in args else ""
    try:
        outputs = check_step(function, values)
    except ChexflowError as e:
        raise ArgumentError(f"{e}{_origins(task, str(e), inputs)}") from None
    return {k: Value(v, f"{task}'s output {k}") for k, v in outputs.items()}


def _origins(task: str, message: str, inputs: dict[str, Value]) -> str:
    """Which options the step's inputs named in MESSAGE came from, where their names differ:
    ` (train-op's threads from --threads-per-worker)`."""
    named = [f"{key} from {v.source}" for key, v in inputs.items()
             if v.source.startswith("--") and v.source != flag(key)
             and (flag(key) in message or f" {key} " in f" {message} "
                  or (isinstance(v.value, str) and len(v.value) > 3 and v.value in message))]
    return f" ({task}'s {'; '.join(named)})" if named else ""
