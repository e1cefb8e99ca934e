"""`chexflow compile`, `chexflow run` and `chexflow submit` (Kubeflow Pipelines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.pipelines.registry import pipeline_names, pipelines_dir

# `chexflow run` options that override pipeline parameters (dest -> type)
RUN_PARAMS = {"model": str, "workers": int, "epochs": int, "batch_size": int, "lr": float,
              "image_size": int, "steps_per_epoch": int, "weights": str, "bootstrap": int,
              "timeout_seconds": int}


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
        "run", help="run a pipeline locally (kfp.local + local Horovod jobs)",
        description="Run a pipeline on this machine with kfp.local's SubprocessRunner and the "
        "local job backend. Without --data a small NIH-format dataset is generated.",
    )
    r.add_argument("pipeline", nargs="?", default="chexnet-train", choices=names)
    r.add_argument("--data", type=Path, help="NIH-format folder, or chexflow preprocess output")
    r.add_argument("--out", type=Path, default=Path("runs"), help="runs go in OUT/PIPELINE-TIME")
    for dest, typ in RUN_PARAMS.items():
        r.add_argument(f"--{dest.replace('_', '-')}", dest=dest, type=typ)
    r.add_argument("--worker-counts", help="scaling-study: comma-separated, e.g. 1,2")
    r.add_argument("--katib-spec", type=Path, help="tune-then-train: Katib Experiment YAML")
    r.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                   help="any other pipeline parameter (value parsed as JSON, else a string)")
    r.add_argument("--verbose", action="store_true",
                   help="also show every step's output (always in OUT/RUN/logs/STEP.log)")
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


def parse_params(items: list[str]) -> dict:
    params = {}
    for item in items:
        if "=" not in item:
            raise ChexflowError(f"--param {item!r}: expected NAME=VALUE")
        key, value = item.split("=", 1)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def run_compile(args: argparse.Namespace) -> int:
    from chexflow.pipelines.registry import compile_components, compile_pipeline

    for name in args.pipelines or pipeline_names():
        path = compile_pipeline(name, args.out, args.trainer_image,
                                args.launcher_image)
        print(f"compiled {name}: {path}")
    for path in compile_components(args.components_out):
        print(f"compiled component: {path}")
    return 0


def run_run(args: argparse.Namespace) -> int:
    from chexflow.pipelines.local_run import run_local

    overrides = {k: getattr(args, k) for k in RUN_PARAMS if getattr(args, k) is not None}
    if args.worker_counts:
        try:
            overrides["worker_counts"] = [int(w) for w in args.worker_counts.split(",")]
        except ValueError:
            raise ChexflowError(
                f"--worker-counts {args.worker_counts!r}: expected e.g. 1,2,4"
            ) from None
        if any(w < 1 for w in overrides["worker_counts"]):
            raise ChexflowError(f"--worker-counts {args.worker_counts}: each must be >= 1")
    if args.pipeline == "tune-then-train":
        if not args.katib_spec:
            raise ChexflowError("tune-then-train needs --katib-spec (a Katib Experiment YAML)")
        overrides["katib_spec"] = str(args.katib_spec.resolve())
    if args.pipeline == "scaling-study":
        for key in ("workers", "bootstrap", "weights", "lr"):
            if key in overrides:
                raise ChexflowError(f"--{key.replace('_', '-')}: not a scaling-study parameter")
    overrides.update(parse_params(args.param))
    run_local(args.pipeline, args.out, args.data, overrides, verbose=args.verbose)
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
