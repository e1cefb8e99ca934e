"""`chexflow train`: start the ranks with horovodrun (--launcher horovodrun), or be one rank
(--launcher none)."""

from __future__ import annotations

import argparse

from chexflow.train.options import TrainOptions, add_train_arguments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train DenseNet-121/ResNet-50 with Horovod (CheXNet recipe)",
        description="Train a CheXNet-style classifier. Starts --workers Horovod "
        "processes (horovodrun: MPI tensor operations where OpenMPI is here, else gloo); "
        "rerun with the same --out to resume.",
    )
    add_train_arguments(p, launcher=True)
    p.set_defaults(func=run_train, trainer=True)


def run_train(args: argparse.Namespace) -> int:
    if args.launcher == "none":
        from chexflow.train.worker import train

        return train(args)
    from chexflow.runlock import locked_folder, share
    from chexflow.train.launch import resolve_hosts, train_with_horovodrun
    from chexflow.train.rundir import check_data, check_options, check_out

    hosts = resolve_hosts(args.workers, args.hosts)
    check_options(args)
    check_data(args, args.workers)
    # the workers join the lock (rank 0 holds it too), so --out stays locked until they are gone
    with locked_folder(args.out, "train") as lock:
        check_out(args)
        return train_with_horovodrun(args.workers, hosts, TrainOptions.from_namespace(args),
                         share(lock, args.out), controller=args.controller)
