"""`chexflow mpijob render`: print the MPIJob (or batch Job) a job would be submitted as."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The JobSpec fields as command-line options (shared by `mpijob render`)."""
    p.add_argument("--name", required=True, help="job name (DNS label)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--gpus-per-worker", type=int, default=0, help="= slotsPerWorker")
    p.add_argument("--cpu", default="1", help="CPU per worker (Kubernetes quantity)")
    p.add_argument("--memory", default="2Gi", help="memory per worker")
    p.add_argument("--shm-size", default="1Gi", help="/dev/shm size")
    p.add_argument("--pvc", default=None, help="data PVC to mount in launcher and workers")
    p.add_argument("--mount-path", default="/data", help="where the PVC is mounted")
    p.add_argument("--timeout", type=int, default=3600, help="activeDeadlineSeconds")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--environment", choices=("trainer", "control"), default="trainer")
    p.add_argument("--namespace", default="default")
    p.add_argument("--image", default=None,
                   help="default: chexflow.container_images for --environment")
    p.add_argument("--clean-pod-policy", choices=("All", "Running", "None"), default="Running")
    p.add_argument("--single", action="store_true", help="a batch Job (one process, no MPI)")
    p.add_argument("job_command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... (one rank)")


def register(sub: argparse._SubParsersAction) -> None:
    mpijob = sub.add_parser("mpijob", help="MPIJob (kubeflow.org/v2beta1) rendering")
    mpijob_sub = mpijob.add_subparsers(dest="mpijob_command", required=True, metavar="SUBCOMMAND")
    render = mpijob_sub.add_parser(
        "render", help="print the MPIJob YAML for a command, e.g. -- chexflow train ..."
    )
    add_job_arguments(render)
    render.add_argument(
        "--validate", type=Path, metavar="CRD.yaml", help="check it against this CRD's schema"
    )
    render.set_defaults(func=run_render)


def spec_from_args(args: argparse.Namespace):
    from chexflow.errors import ChexflowError
    from chexflow.jobs import JobSpec, Volume

    command = [a for a in args.job_command if a != "--"] if args.job_command else []
    if not command:
        raise ChexflowError("give the command to run after --, e.g. -- chexflow train --data ...")
    env = {}
    for item in args.env:
        if "=" not in item:
            raise ChexflowError(f"--env {item!r}: expected NAME=VALUE")
        key, value = item.split("=", 1)
        env[key] = value
    return JobSpec(
        name=args.name,
        command=command,
        environment=args.environment,
        workers=args.workers,
        horovod=not args.single,
        gpus_per_worker=args.gpus_per_worker,
        cpu=args.cpu,
        memory=args.memory,
        shm_size=args.shm_size,
        env=env,
        volumes=[Volume(args.pvc, args.mount_path)] if args.pvc else [],
        timeout_seconds=args.timeout,
    )


def run_render(args: argparse.Namespace) -> int:
    import yaml

    from chexflow.jobs.render import render
    from chexflow.jobs.schema import validate_mpijob

    spec = spec_from_args(args)
    kwargs = {"image": args.image}
    if spec.horovod:
        kwargs["clean_pod_policy"] = args.clean_pod_policy
    obj = render(spec, args.namespace, **kwargs)
    if args.validate and obj["kind"] == "MPIJob":
        validate_mpijob(obj, args.validate)
        print(f"# valid against {args.validate}", file=sys.stderr)
    yaml.safe_dump(obj, sys.stdout, sort_keys=False)
    return 0
