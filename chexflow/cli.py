"""The `chexflow` command. Each feature module registers its own subcommands.

A subcommand registered with `trainer=True` needs TensorFlow/Horovod: run from the control
environment, it re-executes itself in the trainer environment (see chexflow.envs).

Ctrl-C (SIGINT) and SIGTERM (`kill`, a pod or a KFP run stopped) end every command the same way:
its own cleanup runs (partial outputs removed, child processes ended), then one line
`chexflow COMMAND: interrupted`, exit status 130 or 143 (128 + the signal's number, the status
a shell reports for a process the signal ended).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from chexflow.envs import in_trainer_env, trainer_python, with_chexflow_importable
from chexflow.errors import ChexflowError
from chexflow.jobs.signals import Terminated, sigterm_raises

# Modules with a `register(subparsers)` function. Keep imports in them light: heavy libraries
# (tensorflow, kfp) are imported inside the command functions.
COMMAND_MODULES = (
    "chexflow.bench.commands",
    "chexflow.data.commands",
    "chexflow.train.commands",
    "chexflow.evaluate.commands",
    "chexflow.explain.commands",
    "chexflow.serve.commands",
    "chexflow.devcluster.commands",
    "chexflow.slurm.commands",
    "chexflow.jobs.commands",
    "chexflow.pipelines.commands",
    "chexflow.katib.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chexflow",
        description="CheXNet-style chest X-ray training and evaluation on Kubeflow with Horovod.",
    )
    parser.add_argument("--version", action="version", version=f"chexflow {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _version() -> str:
    from chexflow import __version__

    return __version__


def reexec_in_trainer(argv: list[str]) -> None:
    """Replace this process with the same command in the trainer environment."""
    python = trainer_python()
    env = with_chexflow_importable(os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(python), [str(python), "-m", "chexflow.cli", *argv], env)


def one_line(text: str) -> str:
    """`text` with each character that is not printable (a line break, a tab, ...) written as
    its escape: a value the user gave (a path, a --set value) keeps an error to one line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()  # reads the pipeline definitions for `chexflow run`'s options
    except ChexflowError as e:
        print(f"chexflow: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        needs_trainer = getattr(args, "trainer", False)
        if callable(needs_trainer):
            needs_trainer = needs_trainer(args)
        if needs_trainer and not in_trainer_env():
            reexec_in_trainer(argv)
        with sigterm_raises():
            return int(args.func(args) or 0)
    except ChexflowError as e:
        print(f"chexflow {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as e:
        print(f"chexflow {args.command}: interrupted", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
