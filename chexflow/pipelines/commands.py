"""`chexflow compile`, `chexflow run` and `chexflow submit` (Kubeflow Pipelines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.pipelines.checks import shown
from chexflow.pipelines.registry import (
    UNKNOWN,
    Parameter,
    pipeline_names,
    pipeline_parameters,
    pipelines_dir,
    run_defaults,
    signature_defaults,
)
from chexflow.pipelines.submit import SERVICE_ACCOUNT

# Pipeline parameters a local run sets itself (raw_dir is --data, work_root is in --out).
NOT_RUN_OPTIONS = ("raw_dir", "work_root")
# How `chexflow run` reads a value of each annotation of a pipeline parameter.
LIST_HELP = "comma-separated values, e.g. 1,2 (use --OPTION=VALUES when they start with -)"


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")
    return text.lower() in ("true", "1", "yes")


def _list(text: str) -> list:
    return [_json_or_text(item.strip()) for item in text.split(",") if item.strip()]


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _dict(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


PARSERS = {"str": str, "int": int, "float": float, "bool": _bool, "list": _list, "dict": _dict}
EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false",
            "list": "comma-separated values", "dict": 'a JSON object, e.g. {"key": "value"}'}


def option_value(name: str, typ: str, text: str):
    """A pipeline option's text as a value of the parameter's annotation (PARSERS); one line
    naming the option otherwise."""
    try:
        return PARSERS.get(typ, str)(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise ChexflowError(
            f"--{name.replace('_', '-')} {shown(text)}: expected {EXPECTED[typ]}") from None


def run_parameters() -> dict[str, dict[str, Parameter]]:
    """Every pipeline's parameters that `chexflow run` offers as options: name -> {pipeline:
    Parameter}, in the order the signatures state them."""
    out: dict[str, dict[str, Parameter]] = {}
    for name in pipeline_names():
        for p in pipeline_parameters(name):
            if p.name not in NOT_RUN_OPTIONS:
                out.setdefault(p.name, {})[name] = p
    return out


# the metavar of a pipeline option, by its parameter's annotation
METAVARS = {"int": "N", "float": "X", "bool": "BOOL", "list": "A,B", "dict": "JSON", "str": "S"}


def shown_default(value: Any) -> str:
    """A default as the option would be written."""
    if value is UNKNOWN:
        return "set by the definition"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value) if value != "" else "none"


def _by_value(values: dict[str, str]) -> str:
    """`V` when every pipeline has the same, else `V1 (a, b); V2 (c)`."""
    groups: dict[str, list[str]] = {}
    for pipeline, value in values.items():
        groups.setdefault(value, []).append(pipeline)
    if len(groups) == 1:
        return next(iter(groups))
    return ", ".join(f"{value} for {' and '.join(names)}" for value, names in groups.items())


def option_help(param: str, by_pipeline: dict[str, Parameter], here: dict[str, dict],
                compiled: dict[str, dict]) -> str:
    """`default V` (what `chexflow run` gives each pipeline having it) and, where the compiled
    pipeline's own default differs, `compiled pipeline: V`."""
    def value(table: dict[str, dict], pipeline: str) -> str:
        if param in table[pipeline]:
            return shown_default(table[pipeline][param])
        return "required" if by_pipeline[pipeline].required else shown_default(UNKNOWN)

    effective = {name: value(here, name) for name in by_pipeline}
    theirs = {name: value(compiled, name) for name in by_pipeline}
    text = "" if len(by_pipeline) == len(here) else f"{' and '.join(by_pipeline)} only; "
    shown = _by_value(effective)
    text += shown if shown == "required" else f"default {shown}"
    if theirs != effective:
        text += f"; KFP {_by_value(theirs)}"
    return text


def add_pipeline_options(r: argparse.ArgumentParser) -> None:
    """One option per pipeline parameter (from the pipelines' signatures); the help says which
    pipelines have it when not all do, its default in `chexflow run` and, where it differs, the
    compiled pipeline's (a run on Kubeflow Pipelines)."""
    g = r.add_argument_group(
        "pipeline parameters", "default: what `chexflow run` gives the pipeline (the small "
        "settings of its RUN_DEFAULTS, else its signature's); KFP: the compiled pipeline's "
        f"(its signature's: a Kubeflow Pipelines run's), where it differs. A,B: {LIST_HELP}")
    by_param = run_parameters()  # each definition file parsed once, not once per option
    names = pipeline_names()
    compiled = {name: signature_defaults(name) for name in names}
    here = {name: {**compiled[name], **run_defaults(name)} for name in names}
    for param, by_pipeline in by_param.items():
        typ = next(iter(by_pipeline.values())).type
        # read as text here, as its pipeline's parameter in run_run: one line for a bad value
        g.add_argument(f"--{param.replace('_', '-')}", dest=param,
                       metavar=METAVARS.get(typ, "S"),
                       help=option_help(param, by_pipeline, here, compiled))


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "compile", help="write the KFP IR YAML of the pipelines (pipelines/) and components "
        "(components/)")
    names = pipeline_names()
    c.add_argument("pipelines", nargs="*", default=[], metavar="PIPELINE",
                   help=f"default: all of {', '.join(names)}")
    c.add_argument("--out", type=Path, default=None, help="default: the pipelines/ folder")
    c.add_argument("--components-out", type=Path, default=None,
                   help="the components' YAML; default: the components/ folder")
    c.add_argument("--trainer-image", help="default: chexflow.container_images.trainer_image()")
    c.add_argument("--launcher-image", help="default: chexflow.container_images.launcher_image()")
    c.set_defaults(func=run_compile)

    r = sub.add_parser(
        "run", help="run a pipeline locally (kfp.local + local Horovod jobs, or jobs on "
        "Kubernetes)",
        usage="chexflow run [PIPELINE] [--data DIR] [--out DIR] [OPTIONS] [PIPELINE PARAMETERS]",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=30),
        description="Run a pipeline on this machine with kfp.local's SubprocessRunner; its "
        "jobs run here (--backend local, the default) or as MPIJobs/Jobs on the cluster of "
        "KUBECONFIG (--backend kubernetes --pvc-host-path DIR). Without --data a small "
        "NIH-format dataset is generated.",
    )
    r.add_argument("pipeline", nargs="?", default="chexnet-train", choices=names,
                   metavar="PIPELINE", help=f"one of {', '.join(names)} (default %(default)s)")
    r.add_argument("--data", type=Path, metavar="DIR",
                   help="NIH-format folder, or chexflow preprocess output")
    r.add_argument("--out", type=Path, metavar="DIR",
                   help="runs go in DIR/PIPELINE-TIME (default: runs, or PVC_HOST_PATH/runs)")
    r.add_argument("--pvc-host-path", type=Path, metavar="DIR",
                   help="with --backend kubernetes: the folder on this machine behind "
                   "--data-pvc (a hostPath or local PersistentVolume); the run and its data go "
                   "in it and the jobs' pods mount the PVC at this same path")
    r.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                   help="any pipeline parameter (value parsed as JSON, else a string)")
    r.add_argument("--verbose", action="store_true",
                   help="also show every step's output (always in OUT/RUN/logs/STEP.log)")
    r.add_argument("--dry-run", action="store_true",
                   help="check every parameter as the pipeline's steps will, print the "
                   "arguments the pipeline would get (JSON) and stop: nothing is written or "
                   "started")
    add_pipeline_options(r)
    r.set_defaults(func=run_run)

    s = sub.add_parser("submit", help="submit a compiled pipeline to Kubeflow Pipelines")
    s.add_argument("pipeline", help=f"one of {', '.join(names)}, or a compiled .yaml")
    s.add_argument("--host", required=True, help="KFP API URL, e.g. http://localhost:8888 "
                   "(kubectl port-forward -n kubeflow svc/ml-pipeline 8888)")
    s.add_argument("--namespace", help="Kubeflow profile namespace (multi-user): the run's, "
                   "and the jobs' (the pipeline's namespace parameter) unless --param "
                   "namespace=... says otherwise")
    s.add_argument("--token", help="bearer token (existing_token)")
    s.add_argument("--experiment", default="chexflow")
    s.add_argument("--run-name")
    s.add_argument("--service-account", default=SERVICE_ACCOUNT,
                   help="the run's service account (default %(default)s: mpijob/rbac.yaml)")
    s.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                   help="a pipeline parameter (value parsed as JSON, else a string)")
    s.set_defaults(func=run_submit)


# What a --param value parsed as JSON must be, for each annotation a pipeline parameter has
PARAM_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "list": (list,),
               "dict": (dict,)}


def check_params(pipeline: str, items: list[str], params: dict) -> dict:
    """--param NAME=VALUE checked against the pipeline's signature: a known name and a value of
    the annotated type (JSON; a str parameter takes VALUE as it is)."""
    checked = {}
    for key, raw in raw_params(items).items():
        if key not in params:
            raise ChexflowError(
                f"--param {shown(key)}: not a parameter of {pipeline} (its parameters: "
                f"{', '.join(params)})"
            )
        typ = params[key].type
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if typ == "str":
            checked[key] = value if isinstance(value, str) else raw
            continue
        allowed = PARAM_TYPES.get(typ, (object,))
        if not isinstance(value, allowed) or (typ != "bool" and isinstance(value, bool)):
            raise ChexflowError(
                f"--param {key}={shown(raw)}: expected a JSON {typ} for this parameter of "
                f"{pipeline}"
            )
        checked[key] = float(value) if typ == "float" else value
    return checked


def raw_params(items: list[str]) -> dict[str, str]:
    """--param NAME=VALUE items as {NAME: VALUE}."""
    params = {}
    for item in items:
        if "=" not in item:
            raise ChexflowError(f"--param {item!r}: expected NAME=VALUE")
        key, value = item.split("=", 1)
        params[key] = value
    return params


def parse_params(items: list[str]) -> dict:
    """--param NAME=JSON items, each value parsed as JSON, else kept as a string."""
    params = {}
    for key, value in raw_params(items).items():
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def run_compile(args: argparse.Namespace) -> int:
    from chexflow.folders import writable_folders
    from chexflow.pipelines.registry import compile_components, compile_pipeline, components_dir

    writable_folders((args.out or pipelines_dir(), "--out"),
                     (args.components_out or components_dir(), "--components-out"))
    for name in args.pipelines or pipeline_names():
        path = compile_pipeline(name, args.out, args.trainer_image,
                                args.launcher_image)
        print(f"compiled {name}: {path}")
    for path in compile_components(args.components_out):
        print(f"compiled component: {path}")
    return 0


def run_run(args: argparse.Namespace) -> int:
    from chexflow.pipelines.kfp_local import run_with_kfp_local

    params = {p.name: p for p in pipeline_parameters(args.pipeline)}
    given = {k: getattr(args, k) for k in run_parameters() if getattr(args, k) is not None}
    for key in given:
        if key not in params:
            raise ChexflowError(f"--{key.replace('_', '-')}: not a parameter of {args.pipeline}")
    overrides = {k: option_value(k, params[k].type, text) for k, text in given.items()}
    overrides.update(check_params(args.pipeline, args.param, params))
    if isinstance(overrides.get("katib_spec"), str):  # the steps run in other folders
        overrides["katib_spec"] = str(Path(overrides["katib_spec"]).resolve())
    missing = [p for p in params.values() if p.required and p.name not in NOT_RUN_OPTIONS
               and p.name not in overrides and p.name not in run_defaults(args.pipeline)]
    if missing:
        flags = ", ".join(f"--{p.name.replace('_', '-')}" for p in missing)
        raise ChexflowError(f"{args.pipeline} needs {flags}")
    # every value is checked by the steps' own rules before any step starts
    # (chexflow.pipelines.checks), and with --dry-run nothing more is done
    run_with_kfp_local(args.pipeline, args.out, args.data, overrides, verbose=args.verbose,
                       pvc_host_path=args.pvc_host_path, dry_run=args.dry_run)
    return 0


def submit_package(pipeline: str) -> Path:
    """The compiled pipeline `chexflow submit PIPELINE` names: a .yaml path, or a pipeline's
    compiled YAML beside its definition (one line naming the known pipelines otherwise)."""
    package = Path(pipeline)
    if package.suffix:
        if not package.is_file():
            raise ChexflowError(f"{package}: no such file (a compiled pipeline .yaml)")
        return package
    names = pipeline_names()
    if pipeline not in names:
        raise ChexflowError(f"pipeline {shown(pipeline)}: not one of {', '.join(names)} (or "
                            "give a compiled pipeline .yaml)")
    package = pipelines_dir() / f"{pipeline}.yaml"
    if not package.is_file():
        raise ChexflowError(f"{package}: pipeline {pipeline} is not compiled: run `chexflow "
                            f"compile {pipeline}`")
    return package


def run_submit(args: argparse.Namespace) -> int:
    from chexflow.pipelines.submit import Submission, submit

    package = submit_package(args.pipeline)
    if Path(args.pipeline).suffix:  # a compiled file: its parameters' types are not read here
        params = parse_params(args.param)
    else:
        params = check_params(args.pipeline, args.param,
                              {p.name: p for p in pipeline_parameters(args.pipeline)})
    run = submit(Submission(package, args.host, args.namespace, args.token, args.experiment,
                            args.run_name, args.service_account, params))
    print(f"submitted {package.name}: run {run.run_id}  {args.host.rstrip('/')}/#/runs/details/"
          f"{run.run_id}")
    return 0
