"""`chexflow job render`: print the MPIJob (or, with --job-kind trainjob, the Kubeflow Trainer v2
TrainJob; or batch Job) a job would be submitted as; `chexflow job submit`: create it with the
kubernetes backend and wait until it ends (stopping the command deletes it). `chexflow mpijob`
is the old name, an alias for one release."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chexflow.jobs.spec import IMAGE_UID


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The JobSpec fields as command-line options (shared by `mpijob render`)."""
    p.add_argument("--name", required=True, help="job name (DNS label)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--gpus-per-worker", type=int, default=0, help="nvidia.com/gpu per worker")
    p.add_argument("--slots-per-worker", type=int, default=0,
                   help="ranks per worker pod (slotsPerWorker); default: one per GPU, at least 1")
    p.add_argument("--cpu", default="", help="CPU per worker (Kubernetes quantity); default: "
                   "--cpu-per-gpu x GPUs, or 1 per rank without GPUs")
    p.add_argument("--memory", default="", help="memory per worker; default: --memory-per-gpu x "
                   "GPUs, or 2Gi per rank without GPUs")
    p.add_argument("--cpu-per-gpu", default="4", help="CPU request per GPU of a worker")
    p.add_argument("--memory-per-gpu", default="16Gi", help="memory request per GPU of a worker")
    p.add_argument("--shm-size", default="1Gi", help="/dev/shm size")
    p.add_argument("--pvc", default=None, help="data PVC to mount in launcher and workers")
    p.add_argument("--mount-path", default="/data", help="where the PVC is mounted")
    p.add_argument("--timeout", type=int, default=3600, help="activeDeadlineSeconds")
    p.add_argument("--backoff-limit", type=int, default=None,
                   help="launcher retries (runPolicy.backoffLimit; default 2; batch Job: 0)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--environment", choices=("trainer", "control"), default="trainer")
    p.add_argument("--namespace", default="default")
    p.add_argument("--image", default=None,
                   help="default: chexflow.container_images for --environment")
    p.add_argument("--clean-pod-policy", choices=("All", "Running", "None"), default="Running")
    p.add_argument("--service-account", default=None, help="the pods' service account")
    p.add_argument("--node-selector", action="append", default=[], metavar="LABEL=VALUE",
                   help="nodeSelector of every pod (repeat for more labels)")
    p.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
                   help="a toleration of every pod (GPU pods tolerate nvidia.com/gpu anyway)")
    p.add_argument("--priority-class", default="", help="priorityClassName of every pod")
    p.add_argument("--image-pull-secret", action="append", default=[], metavar="SECRET",
                   help="imagePullSecrets of every pod")
    p.add_argument("--gang-scheduling", action="store_true",
                   help="runPolicy.schedulingPolicy: all pods start together (Volcano or "
                        "scheduler-plugins, as mpi-operator is configured)")
    p.add_argument("--queue", default="", metavar="LOCALQUEUE",
                   help="Kueue: submit to this LocalQueue of the namespace (label "
                        "kueue.x-k8s.io/queue-name); the job waits suspended until admitted")
    p.add_argument("--volcano-queue", default="",
                   help="gang scheduling with Volcano: schedulingPolicy.queue")
    p.add_argument("--min-available", type=int, default=0,
                   help="gang scheduling: pods that must start together (default: all)")
    p.add_argument("--run-as-user", type=int, default=IMAGE_UID,
                   help="numeric user of every container (runAsNonRoot; the images' chexflow)")
    p.add_argument("--single", action="store_true", help="a batch Job (one process, no MPI)")
    p.add_argument("--job-kind", choices=("mpijob", "trainjob"), default="mpijob",
                   help="a Horovod job as an MPIJob (mpi-operator) or a TrainJob (Kubeflow "
                        "Trainer v2, on the runtime of trainjob/horovod-runtime.yaml)")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="--job-kind trainjob: the ClusterTrainingRuntime (default "
                        "chexflow-horovod)")
    p.add_argument("job_command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... (one rank)")


def register(sub: argparse._SubParsersAction) -> None:
    job = sub.add_parser(
        "job", aliases=["mpijob"],
        help="render or submit a training job: MPIJob (kubeflow.org/v2beta1), TrainJob "
             "(--job-kind trainjob) or batch Job (--single); `mpijob` is its old name, kept "
             "for one release")
    job_sub = job.add_subparsers(dest="job_subcommand", required=True, metavar="SUBCOMMAND")
    render = job_sub.add_parser(
        "render", help="print the job's YAML for a command, e.g. -- chexflow train ..."
    )
    add_job_arguments(render)
    render.add_argument(
        "--validate", type=Path, metavar="CRD.yaml", help="check it against this CRD's schema"
    )
    render.set_defaults(func=run_render)
    submit = job_sub.add_parser(
        "submit", help="create the job in the cluster (KUBECONFIG) and wait for it; "
                       "SIGTERM or Ctrl-C deletes it"
    )
    add_job_arguments(submit)
    submit.add_argument("--keep", action="store_true", help="keep the job after it succeeds")
    submit.set_defaults(func=run_submit)


def spec_from_args(args: argparse.Namespace):
    from chexflow.errors import ChexflowError
    from chexflow.jobs import JobSpec, Volume

    command = [a for a in args.job_command if a != "--"] if args.job_command else []
    if not command:
        raise ChexflowError("give the command to run after --, e.g. -- chexflow train --data ...")
    return JobSpec(
        name=args.name,
        command=command,
        environment=args.environment,
        workers=args.workers,
        horovod=not args.single,
        gpus_per_worker=args.gpus_per_worker,
        slots_per_worker=args.slots_per_worker,
        cpu=args.cpu,
        memory=args.memory,
        cpu_per_gpu=args.cpu_per_gpu,
        memory_per_gpu=args.memory_per_gpu,
        shm_size=args.shm_size,
        env=_pairs(args.env, "--env", "NAME=VALUE"),
        volumes=[Volume(args.pvc, args.mount_path)] if args.pvc else [],
        timeout_seconds=args.timeout,
        backoff_limit=args.backoff_limit,
    )


def _pairs(items: list[str], option: str, form: str) -> dict[str, str]:
    from chexflow.errors import ChexflowError

    pairs = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ChexflowError(f"{option} {item!r}: expected {form}")
        pairs[key] = value
    return pairs


def cluster_options_from_args(args: argparse.Namespace):
    from chexflow.jobs.spec import ClusterOptions, parse_toleration

    return ClusterOptions(
        node_selector=_pairs(args.node_selector, "--node-selector", "LABEL=VALUE"),
        tolerations=[parse_toleration(t) for t in args.toleration],
        priority_class=args.priority_class,
        image_pull_secrets=list(args.image_pull_secret),
        gang_scheduling=args.gang_scheduling,
        queue=args.queue,
        volcano_queue=args.volcano_queue,
        job_kind=args.job_kind,
        min_available=args.min_available,
        run_as_user=args.run_as_user,
    )


def run_render(args: argparse.Namespace) -> int:
    import yaml

    from chexflow.jobs.render import render
    from chexflow.jobs.schema import validate_mpijob
    from chexflow.jobs.trainjob import RUNTIME_NAME, render_trainjob

    spec = spec_from_args(args)
    if args.job_kind == "trainjob" and spec.horovod:
        obj = render_trainjob(spec, args.namespace, image=args.image,
                              runtime=args.runtime or RUNTIME_NAME,
                              options=cluster_options_from_args(args))
        yaml.safe_dump(obj, sys.stdout, sort_keys=False)
        return 0
    kwargs = {"image": args.image, "service_account": args.service_account,
              "options": cluster_options_from_args(args)}
    if spec.horovod:
        kwargs["clean_pod_policy"] = args.clean_pod_policy
    obj = render(spec, args.namespace, **kwargs)
    if args.validate and obj["kind"] == "MPIJob":
        validate_mpijob(obj, args.validate)
        print(f"# valid against {args.validate}", file=sys.stderr)
    yaml.safe_dump(obj, sys.stdout, sort_keys=False)
    return 0


def run_submit(args: argparse.Namespace) -> int:
    from chexflow.jobs import run_job

    spec = spec_from_args(args)
    result = run_job(
        spec, "kubernetes", namespace=args.namespace, image=args.image,
        service_account=args.service_account, clean_pod_policy=args.clean_pod_policy,
        options=cluster_options_from_args(args), runtime=args.runtime,
        delete_policy="never" if args.keep else "on-success", stream=sys.stderr,
    )
    print(f"{result.resource} succeeded in {result.wall_seconds:.0f}s")
    if result.log_tail:
        print(result.log_tail.rstrip())
    return 0
