"""`chexflow compile`, `chexflow run` and `chexflow submit` (Kubeflow Pipelines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.pipelines.checks import shown
from chexflow.pipelines.registry import (
    Parameter,
    pipeline_names,
    pipeline_parameters,
    pipelines_dir,
    run_defaults,
)

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


def add_pipeline_options(r: argparse.ArgumentParser) -> None:
    """One option per pipeline parameter (from the pipelines' signatures); the help says which
    pipelines have it, their default, and the local run's default where it differs."""
    g = r.add_argument_group(
        "pipeline parameters", "default: the local run's small settings, where it has one, "
        "else the pipeline's own (the cluster default)")
    by_param = run_parameters()  # each definition file parsed once, not once per option
    local_defaults = {name: run_defaults(name) for name in pipeline_names()}
    for param, by_pipeline in by_param.items():
        first = next(iter(by_pipeline.values()))
        parts = []
        for pipeline, p in by_pipeline.items():
            local = local_defaults[pipeline].get(param)
            shown = "required" if p.required else f"default {p.default}"
            shown += f", locally {local}" if local is not None and local != p.default else ""
            parts.append(f"{pipeline} ({shown})")
        more = f"; {LIST_HELP}" if first.type == "list" else ""
        # read as text here, as its pipeline's parameter in run_run: one line for a bad value
        g.add_argument(f"--{param.replace('_', '-')}", dest=param,
                       help="; ".join(parts) + more)


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
        description="Run a pipeline on this machine with kfp.local's SubprocessRunner; its "
        "jobs run here (--backend local, the default) or as MPIJobs/Jobs on the cluster of "
        "KUBECONFIG (--backend kubernetes --pvc-host-path DIR). Without --data a small "
        "NIH-format dataset is generated.",
    )
    r.add_argument("pipeline", nargs="?", default="chexnet-train", choices=names)
    r.add_argument("--data", type=Path, help="NIH-format folder, or chexflow preprocess output")
    r.add_argument("--out", type=Path,
                   help="runs go in OUT/PIPELINE-TIME (default: runs, or PVC_HOST_PATH/runs)")
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
    s.add_argument("pipeline", help="a pipeline name or a compiled .yaml")
    s.add_argument("--host", required=True, help="KFP API URL, e.g. http://localhost:8888")
    s.add_argument("--namespace", help="Kubeflow profile namespace (multi-user)")
    s.add_argument("--token", help="bearer token (existing_token)")
    s.add_argument("--experiment", default="chexflow")
    s.add_argument("--run-name")
    s.add_argument("--service-account", default="chexflow-launcher",
                   help="the run's service account (see mpijob/rbac.yaml)")
    s.add_argument("--param", action="append", default=[], metavar="NAME=JSON")
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


def run_submit(args: argparse.Namespace) -> int:
    import kfp

    package = Path(args.pipeline)
    if not package.suffix:
        package = pipelines_dir() / f"{args.pipeline}.yaml"
    if not package.exists():
        raise ChexflowError(f"{package}: no compiled pipeline (run `chexflow compile`)")
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        client = kfp.Client(host=args.host, namespace=args.namespace, existing_token=args.token)
        run = client.create_run_from_pipeline_package(
            str(package), arguments=parse_params(args.param), run_name=args.run_name,
            experiment_name=args.experiment, namespace=args.namespace,
            service_account=args.service_account,
        )
    except (HTTPError, ConnectionError) as e:
        raise ChexflowError(
            f"--host {args.host}: Kubeflow Pipelines API unreachable ({e})"
        ) from None
    except ApiException as e:
        raise ChexflowError(
            f"--host {args.host}: Kubeflow Pipelines refused the run: HTTP {e.status} {e.reason}: "
            f"{(e.body or '')[:500]}"
        ) from None
    print(f"submitted {package.name}: run {run.run_id}  {args.host.rstrip('/')}/#/runs/details/"
          f"{run.run_id}")
    return 0
