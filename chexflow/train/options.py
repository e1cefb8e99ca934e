"""The options of a training run, stated once: `TrainOptions` makes the parsers of `chexflow train`
and `python -m chexflow.train.worker`, and `TrainOptions.to_argv()` is the one builder of a
worker's command line (local launcher, pipeline steps, Slurm scripts, benchmarks)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from chexflow.errors import ChexflowError

MODELS = ("densenet121", "resnet50")
OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("plateau", "cosine")
CONTROLLERS = ("gloo", "mpi")
# `chexflow train --launcher`: start the ranks here with horovodrun, or be one rank already
# started; "local" is horovodrun's old spelling, still accepted.
LAUNCHERS = ("horovodrun", "none")
LAUNCHER_ALIASES = {"local": "horovodrun"}
WORKER_MODULE = "chexflow.train.worker"


def _opt(help: str, **kwargs: Any) -> dict[str, Any]:
    return {"help": help, **kwargs}


@dataclass
class TrainOptions:
    """One training run; each field is the worker option `--<name with - for _>`."""

    data: Path | None = field(default=None, metadata=_opt(
        "folder written by `chexflow preprocess`"))
    model: str = field(default="densenet121", metadata=_opt("the network", choices=MODELS))
    epochs: int = field(default=5, metadata=_opt("epochs to train"))
    batch_size: int = field(default=16, metadata=_opt("images per worker per step"))
    lr: float = field(default=1e-3, metadata=_opt(
        "learning rate for one worker (scaled by workers)"))
    optimizer: str = field(default="adam", metadata=_opt(
        "adam (CheXNet: beta 0.9/0.999) or sgd (momentum 0.9, Nesterov)", choices=OPTIMIZERS))
    lr_schedule: str = field(default="plateau", metadata=_opt(
        "plateau: lr / 10 whenever val_loss stops improving (CheXNet); cosine: after the warm-up, "
        "from lr x workers down to 0 at the last step", choices=LR_SCHEDULES))
    bn_momentum: float = field(default=0.99, metadata=_opt(
        "momentum of the BatchNormalization moving averages used at inference (Keras' 0.99 "
        "forgets its start value in some hundred steps; 0.9 in some dozen, for short runs)"))
    no_flip: bool = field(default=False, metadata=_opt(
        "train without the random horizontal flip (for data whose left and right differ in "
        "meaning, as in chexflow's generated data, where each class owns a cell of a grid)"))
    weight_decay: float = field(default=0.0, metadata=_opt(
        "decoupled weight decay of the optimizer (0: none, as in CheXNet)"))
    image_size: int = field(default=224, metadata=_opt("must match the manifest"))
    weights: str = field(default="none", metadata=_opt(
        "none (from scratch) | imagenet (the CheXNet recipe) | PATH (Keras .h5 backbone "
        "weights, or a chexflow .keras model)"))
    out: Path | None = field(default=None, metadata=_opt(
        "run folder; rerun to resume", required=True))
    synthetic_data: bool = field(default=False, metadata=_opt(
        "train on in-memory random tensors"))
    amp: bool = field(default=False, metadata=_opt(
        "mixed precision (float16 on GPU, bfloat16 on CPU)"))
    xla: bool = field(default=False, metadata=_opt("XLA auto-clustering of the training step"))
    seed: int = field(default=0, metadata=_opt("random seed"))
    steps_per_epoch: int | None = field(default=None, metadata=_opt(
        "default: train images / (batch size x workers)"))
    warmup_steps: int = field(default=2, metadata=_opt(
        "steps at the start of each epoch left out of the throughput figures"))
    lr_warmup_epochs: float = field(default=1.0, metadata=_opt(
        "epochs over which the learning rate ramps from lr to lr x workers"))
    weighted_loss: bool = field(default=False, metadata=_opt(
        "weight each class's BCE by its training-set prevalence (CheXNet v1)"))
    shuffle_labels: bool = field(default=False, metadata=_opt(
        "permute training labels across images (a control that must not learn)"))
    validation_steps: int | None = field(default=None, metadata=_opt(
        "default: the whole validation split"))
    threads: int | None = field(default=None, metadata=_opt(
        "CPU only: TensorFlow threads per worker (default: cores / workers on the host)"))
    fp16_allreduce: bool = field(default=False, metadata=_opt(
        "Horovod: gradients sent as float16 in the allreduce (hvd.Compression.fp16; half the "
        "bytes, slightly different numbers)"))
    backward_passes_per_step: int | None = field(default=None, metadata=_opt(
        "Horovod: gradients of N steps summed locally, then one allreduce and one optimizer "
        "update every N steps (default 1)"))
    fusion_threshold_mb: float | None = field(default=None, metadata=_opt(
        "Horovod tensor fusion buffer in MB (HOROVOD_FUSION_THRESHOLD; default: Horovod's own "
        "or the environment's)"))
    cycle_time_ms: float | None = field(default=None, metadata=_opt(
        "Horovod cycle time in ms (HOROVOD_CYCLE_TIME; default: the environment's, else 25 on "
        "hosts without a GPU and Horovod's 1 ms with one)"))

    @staticmethod
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    @classmethod
    def value_type(cls, name: str) -> type:
        """The field's type without `| None`: int, float, str, bool or Path."""
        hint = typing.get_type_hints(cls)[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if args else hint

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, **overrides: Any) -> TrainOptions:
        """The options of a parsed `chexflow train` (or worker) namespace."""
        values = {n: getattr(args, n) for n in cls.names() if hasattr(args, n)}
        return cls(**{**values, **overrides})

    def with_values(self, values: dict[str, Any], where: str,
                    fixed: tuple[str, ...] = ()) -> TrainOptions:
        """A copy with `values` ({"lr": "0.01", "batch-size": 16, ...}) converted to the fields'
        types; a name that is no field, or is in `fixed`, raises naming `where` it came from."""
        out = {}
        for name, value in values.items():
            key = name.replace("-", "_")
            if key not in self.names() or key in fixed:
                known = ", ".join(n for n in self.names() if n not in fixed)
                raise ChexflowError(
                    f"{where}: {name!r} is not an option of chexflow train; expected one of "
                    f"{known} (names may use '-' for '_')"
                )
            out[key] = self.convert(key, value, where)
        return dataclasses.replace(self, **out)

    @classmethod
    def convert(cls, name: str, value: Any, where: str) -> Any:
        typ = cls.value_type(name)
        if typ is bool:
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        try:
            return typ(value)
        except (TypeError, ValueError):
            raise ChexflowError(
                f"{where}: {name} {value!r} is not {typ.__name__}"
            ) from None

    def to_argv(self) -> list[str]:
        """The worker's options: every set field (`--flag VALUE`; a true bool as `--flag`)."""
        argv: list[str] = []
        for name in self.names():
            value = getattr(self, name)
            if value is None or value is False:
                continue
            argv += [self.flag(name)] if value is True else [self.flag(name), str(value)]
        return argv

    def worker_command(self, python: str = "python") -> list[str]:
        """One Horovod rank: `PYTHON -m chexflow.train.worker OPTIONS`."""
        return [python, "-m", WORKER_MODULE, *self.to_argv()]


class ArgumentAdder(Protocol):
    """An argparse parser or argument group."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...


def add_train_arguments(p: ArgumentAdder, launcher: bool, skip: tuple[str, ...] = ()) -> None:
    """The TrainOptions as options of `p` (less `skip`); `launcher` adds those of the local
    Horovod launcher."""
    for f in dataclasses.fields(TrainOptions):
        if f.name in skip:
            continue
        kwargs = dict(f.metadata)
        typ = TrainOptions.value_type(f.name)
        if typ is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=typ, default=f.default)
            if f.default is not None:
                kwargs["help"] += " (default: %(default)s)"
        p.add_argument(TrainOptions.flag(f.name), **kwargs)
    if launcher:
        p.add_argument("--workers", type=int, default=1, help="Horovod processes")
        p.add_argument(
            "--controller", choices=CONTROLLERS, default=None,
            help="horovodrun's controller: mpi (mpirun, as an MPIJob's launcher runs, with MPI "
            "tensor operations and OpenMPI yielding the core while it waits; needs OpenMPI and a "
            "Horovod built with it) or gloo (default: mpi where mpirun and Horovod's MPI build "
            "are here, else gloo; mpi was faster on CPU as measured in docs/benchmarks.md)",
        )
        p.add_argument(
            "--hosts", help="horovodrun -H, e.g. host1:2,host2:2 (default localhost:WORKERS)"
        )
        p.add_argument(
            "--launcher",
            type=lambda v: LAUNCHER_ALIASES.get(v, v),
            choices=LAUNCHERS,
            default="horovodrun",
            help="horovodrun: start WORKERS processes with horovodrun (once spelt local); "
            "none: this process is one rank already started by mpirun/horovodrun/srun",
        )
