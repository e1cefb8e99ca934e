"""The options of `chexflow train`, shared by the CLI and `python -m chexflow.train.worker`."""

from __future__ import annotations

import argparse
from pathlib import Path

MODELS = ("densenet121", "resnet50")
OPTIMIZERS = ("adam", "sgd")
LAUNCHER_ONLY = ("workers", "hosts", "launcher")


def add_train_arguments(p: argparse.ArgumentParser, launcher: bool) -> None:
    """Options of a training run; `launcher` adds those of the local Horovod launcher."""
    p.add_argument("--data", type=Path, help="folder written by `chexflow preprocess`")
    p.add_argument("--model", choices=MODELS, default="densenet121")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16, help="images per worker per step")
    p.add_argument(
        "--lr", type=float, default=1e-3, help="learning rate for one worker (scaled by workers)"
    )
    p.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="adam",
        help="adam (CheXNet: beta 0.9/0.999) or sgd (momentum 0.9, Nesterov)",
    )
    p.add_argument(
        "--weight-decay", type=float, default=0.0,
        help="decoupled weight decay of the optimizer (0: none, as in CheXNet)",
    )
    p.add_argument("--image-size", type=int, default=224, help="must match the manifest")
    p.add_argument(
        "--weights",
        default="none",
        help="none | imagenet | PATH (Keras .h5 backbone weights, or a chexflow .keras model)",
    )
    p.add_argument("--out", type=Path, required=True, help="run folder; rerun to resume")
    p.add_argument(
        "--synthetic-data", action="store_true", help="train on in-memory random tensors"
    )
    p.add_argument(
        "--amp", action="store_true", help="mixed precision (float16 on GPU, bfloat16 on CPU)"
    )
    p.add_argument(
        "--xla", action="store_true", help="XLA auto-clustering of the training step"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--steps-per-epoch", type=int, help="default: train images / (batch size x workers)"
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="steps at the start of each epoch left out of the throughput figures",
    )
    p.add_argument(
        "--lr-warmup-epochs",
        type=float,
        default=1.0,
        help="epochs over which the learning rate ramps from lr to lr x workers",
    )
    p.add_argument(
        "--weighted-loss",
        action="store_true",
        help="weight each class's BCE by its training-set prevalence (CheXNet v1)",
    )
    p.add_argument(
        "--shuffle-labels",
        action="store_true",
        help="permute training labels across images (a control that must not learn)",
    )
    p.add_argument(
        "--validation-steps", type=int, help="default: the whole validation split"
    )
    p.add_argument(
        "--threads", type=int,
        help="CPU only: TensorFlow threads per worker (default: cores / workers on the host)",
    )
    if launcher:
        p.add_argument("--workers", type=int, default=1, help="Horovod processes")
        p.add_argument(
            "--hosts", help="horovodrun -H, e.g. host1:2,host2:2 (default localhost:WORKERS)"
        )
        p.add_argument(
            "--launcher",
            choices=("local", "none"),
            default="local",
            help="local: start WORKERS processes with horovodrun; none: this process is one "
            "rank already started by mpirun/horovodrun/srun",
        )


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The worker's command-line options for a parsed `chexflow train` namespace."""
    parser = argparse.ArgumentParser(add_help=False)
    add_train_arguments(parser, launcher=False)
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return argv
