"""The Horovod training entry point: `python -m chexflow.train.worker OPTIONS`.

One process per rank. horovodrun starts it locally (`chexflow train`), mpirun starts it in an
MPIJob, srun under Slurm; Katib trials run it the same way. One GPU per process, pinned by
local rank; on CPU each process gets cores / local_size threads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.runlock import joins, locked_folder
from chexflow.train.launch import ERROR_FILE_ENV
from chexflow.train.options import add_train_arguments
from chexflow.train.rundir import (
    RUN_FILE,
    RunError,
    check_all,
    checkpoint_missing,
    checkpoint_prefix,
    read_state,
    remove_partial,
    run_identity,
    saved_epochs,
    state_file,
)

# Horovod's background thread negotiates every HOROVOD_CYCLE_TIME ms (default 1). On a CPU host
# every core already runs a worker's ops, and that polling takes cycles from them, so scaling is
# far better at 25 ms (docs/training.md#horovod-on-cpu-hosts). A GPU keeps Horovod's default.
CPU_CYCLE_TIME_MS = "25"


# --xla is XLA auto-clustering (tf_cnn_benchmarks' --xla), not Keras' jit_compile: HorovodAllreduce
# has no XLA kernel in this build, so an explicitly compiled train step fails to compile, while
# auto-clustering compiles the forward and backward pass around the allreduce (Horovod's XLA
# guide). The CPU flag lets clusters form on hosts without a GPU too.
XLA_FLAGS = ("--tf_xla_auto_jit=2", "--tf_xla_cpu_global_jit")


def _xla_autoclustering() -> None:
    """Before TensorFlow starts: add the auto-clustering flags to the user's TF_XLA_FLAGS."""
    flags = os.environ.get("TF_XLA_FLAGS", "").split()
    named = {f.split("=")[0] for f in flags}
    flags += [f for f in XLA_FLAGS if f.split("=")[0] not in named]
    os.environ["TF_XLA_FLAGS"] = " ".join(flags)


def _horovod_environment(args: argparse.Namespace, tf) -> None:
    """Before hvd.init(): --fusion-threshold-mb and --cycle-time-ms as Horovod's variables (over
    the environment's), and a longer cycle on CPU-only hosts when neither set one."""
    if args.fusion_threshold_mb is not None:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(round(args.fusion_threshold_mb * 2**20))
    if args.cycle_time_ms is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = f"{args.cycle_time_ms:g}"
    if not tf.config.list_physical_devices("GPU"):
        os.environ.setdefault("HOROVOD_CYCLE_TIME", CPU_CYCLE_TIME_MS)


def _horovod_settings(hvd, args: argparse.Namespace) -> dict:
    """What this run's Horovod did, for metrics.json (after hvd.init())."""
    threshold = os.environ.get("HOROVOD_FUSION_THRESHOLD")
    cycle = os.environ.get("HOROVOD_CYCLE_TIME")
    controller = "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else None
    # without MPI (gloo controller) Horovod's CPU operations are gloo's whatever the variable asks
    cpu_ops = (os.environ.get("HOROVOD_CPU_OPERATIONS") or controller
               if controller == "mpi" else controller)
    return {
        "controller": controller,
        "cpu_operations": cpu_ops.lower() if cpu_ops else None,
        "fp16_allreduce": bool(args.fp16_allreduce),
        "backward_passes_per_step": args.backward_passes_per_step or 1,
        "fusion_threshold_bytes": int(threshold) if threshold else None,
        "cycle_time_ms": float(cycle) if cycle else None,
    }


def _configure_devices(tf, local_rank: int, local_size: int, threads: int | None) -> str:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        return f"GPU {gpu.name}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = threads or max(1, cores // max(local_size, 1))
    # Both pools count: two inter-op threads each running an op would let a one-thread worker use
    # two cores, oversubscribing a host where every core has its own worker.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    return f"CPU, {threads} threads, Horovod cycle {os.environ['HOROVOD_CYCLE_TIME']} ms"


def _from_input_pipeline(args: argparse.Namespace, error) -> bool:
    """Whether a TensorFlow error came from reading the TFRecords (not from the model's step)."""
    if args.synthetic_data:
        return False
    return type(error).__name__ == "DataLossError" or "IteratorGetNext" in error.message


def _tf_error_detail(message: str) -> str:
    """The line of a TensorFlow graph error that says what went wrong, not where."""
    where = ("Graph execution error", "Detected at node", "<stack traces", "File ", "[[")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith(where)), lines[0])[:300]


def _collective_check(hvd, fn):
    """Run fn on rank 0; every rank raises rank 0's ChexflowError (no rank is left waiting)."""
    result, error = None, None
    if hvd.rank() == 0:
        try:
            result = fn()
        except ChexflowError as e:
            error = (type(e), str(e))
    error = hvd.broadcast_object(error, root_rank=0)
    if error:
        raise error[0](error[1])
    return result


def _build_model(hvd, args, num_classes: int):
    """Build the model; local rank 0 of each host fetches ImageNet weights first."""
    from chexflow.train.models import WeightsError, build_model

    model, error = None, None
    if hvd.local_rank() == 0 or args.weights != "imagenet":
        try:
            model = build_model(args.model, args.image_size, num_classes, args.weights, args.seed,
                                args.bn_momentum, not args.no_flip)
        except WeightsError as e:
            error = str(e)
    errors = [e for e in hvd.allgather_object(error) if e]
    if errors:
        raise WeightsError(errors[0])
    if model is None:  # the weights are in the local Keras cache now
        model = build_model(args.model, args.image_size, num_classes, args.weights, args.seed,
                            args.bn_momentum, not args.no_flip)
    return model


def train(args: argparse.Namespace) -> int:
    """Train on this rank (collective: every rank of the Horovod job runs it). Rank 0, the one
    that writes into --out, holds its lock for the run: shared with the `chexflow train` that
    started it, or alone when mpirun/srun did."""
    with contextlib.ExitStack() as held:
        return _train(args, held)


def _train(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    """The steps of one rank, in the order of Horovod's examples/tensorflow2 scripts."""
    started = time.time()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.xla:
        _xla_autoclustering()
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    from chexflow.train import recipe

    # 1. Horovod: init, one device (GPU) or a share of the cores (CPU) per rank
    _horovod_environment(args, tf)
    hvd_tf.init()
    horovod = _horovod_settings(hvd_tf, args)
    device = _configure_devices(tf, hvd_tf.local_rank(), hvd_tf.local_size(), args.threads)
    out = Path(args.out)
    # 2. the run folder (rank 0 holds its lock) and the data's manifest
    manifest, classes = _open_run(args, out, held, hvd_tf)
    # 3. the model, its loss and the optimizer wrapped for Horovod
    model = _compile_model(args, tf, hvd_tf, manifest, classes)
    # 4. resume from the last checkpoint, then every rank starts from rank 0's variables
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(ckpt, str(out / "checkpoints"), max_to_keep=2)
    state = _restore(out, ckpt, hvd_tf)
    # in place: a few grouped broadcasts; the default traces one per variable, a large part of
    # the start-up
    hvd_tf.broadcast_variables(model.variables + recipe.optimizer_variables(model.optimizer),
                               root_rank=0, inplace=True)
    initial_epoch = int(state.get("epoch", 0))
    if hvd_tf.rank() == 0:
        print(
            f"train: {args.model} {args.image_size}px, {hvd_tf.size()} workers ({device}, "
            f"{horovod['controller']} controller), batch "
            f"{args.batch_size}/worker, lr {args.lr} x {hvd_tf.size()}"
            + (f"; resumed after epoch {initial_epoch} from {state['restored_from']}"
               if initial_epoch else ""),
            flush=True,
        )
    # 5. this rank's shard of the input, and the validation set
    train_ds, validation, steps = _datasets(args, manifest, len(classes), hvd_tf)
    # 6. callbacks: validation AUROC, throughput, metric averaging, LR schedule, run state
    callbacks, throughput, first_step = _callbacks(
        args, out, hvd_tf, manager, state, validation, steps, len(classes))
    # 7. fit
    if initial_epoch < args.epochs:
        _fit(args, tf, model, train_ds, initial_epoch, steps, callbacks, hvd_tf.rank())
    elif hvd_tf.rank() == 0:
        print(f"train: {out} already holds {initial_epoch} epochs; nothing to do", flush=True)
    # 8. images/s of every rank (collective), then rank 0 writes metrics.json
    summary = throughput.summary()
    if hvd_tf.rank() == 0:
        _write_metrics(args, out, state, summary, throughput.epochs, first_step, horovod,
                       hvd_tf.size(), started)
    return 0


def _open_run(args: argparse.Namespace, out: Path, held: contextlib.ExitStack, hvd_tf):
    """(manifest or None, classes): rank 0 locks --out, checks it and the data, and records
    the run (run.json, with the classes evaluate checks); every rank gets the manifest."""
    from chexflow.pathologies import PATHOLOGIES

    def lock_and_check():
        held.enter_context(locked_folder(out, "train rank 0", shared=joins(out)))
        return check_all(args, hvd_tf.size())

    manifest = _collective_check(hvd_tf, lock_and_check)
    manifest = hvd_tf.broadcast_object(manifest, root_rank=0)
    classes = manifest.classes if manifest else PATHOLOGIES
    if hvd_tf.rank() == 0:
        from chexflow.train.callbacks import reported_writes, write_json

        if left := remove_partial(out):
            print(f"train: removed what an interrupted write left: "
                  f"{', '.join(str(p) for p in left)}", flush=True)
        with reported_writes(out, out / RUN_FILE):
            (out / "checkpoints").mkdir(parents=True, exist_ok=True)
            record = {**run_identity(args), "classes": list(classes)}  # what evaluate checks
            write_json(out / RUN_FILE, record)
    return manifest, classes


def _compile_model(args: argparse.Namespace, tf, hvd_tf, manifest, classes):
    """The model (seeded), the masked BCE loss and the optimizer, LR scaled by the workers and
    wrapped in Horovod's DistributedOptimizer when there is more than one."""
    import horovod.tensorflow.keras as hvd
    from tensorflow import keras

    from chexflow.train import recipe

    keras.utils.set_random_seed(args.seed)
    if args.amp:
        gpu = bool(tf.config.list_physical_devices("GPU"))
        keras.mixed_precision.set_global_policy("mixed_float16" if gpu else "mixed_bfloat16")
    size, c = hvd_tf.size(), len(classes)
    model = _build_model(hvd_tf, args, c)
    weights = (None, None)
    if args.weighted_loss and manifest:
        weights = recipe.class_weights(
            manifest.label_counts["train"], manifest.images("train"), classes
        )
    optimizer = recipe.optimizer(args.optimizer, args.lr * size, args.weight_decay)
    if size > 1:
        # one rank has nothing to average, and tracing Horovod's per-gradient allreduce is most
        # of building a training step. One group: all gradients in one
        # grouped allreduce (one op and one size check in the graph, not one per gradient; the
        # same sums, as Horovod fuses the tensors of a step either way).
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=args.backward_passes_per_step or 1,
            num_groups=1,
        )
    model.compile(
        optimizer=optimizer,
        loss=recipe.MaskedBCE(c, *weights),
        jit_compile=False,  # --xla: auto-clustering, see XLA_FLAGS
    )
    recipe.build_optimizer(model.optimizer, model.trainable_variables)
    return model


def _restore(out: Path, ckpt, hvd_tf) -> dict:
    """The run's state (state.json) after rank 0 restored the newest checkpoint that reads whole
    ({} for a new run); every rank gets it."""
    return hvd_tf.broadcast_object(_collective_check(hvd_tf, lambda: _restore_newest(out, ckpt)),
                                   root_rank=0)


def _restore_newest(out: Path, ckpt) -> dict:
    """Rank 0: restore the checkpoint of the epoch state.json records or, where that one does not
    read whole, the newest earlier one that does (each skipped one named); state.json is then
    rewound to that epoch, and the later epochs are trained again. None reading whole is one
    line naming the files; nothing is removed. (A run killed between the two writes may also
    have left a checkpoint after the recorded epoch; that epoch is trained again too.)"""
    state = read_state(out)
    if not state.get("epoch"):
        return state
    skipped = []
    for epoch in saved_epochs(out, state["epoch"]):
        prefix = checkpoint_prefix(out, epoch)
        why = checkpoint_missing(prefix) or _read_checkpoint(ckpt, prefix)
        if why is None:
            if skipped:
                state = _rewind(out, state, epoch, skipped)
            return {**state, "restored_from": str(prefix)}
        skipped.append(why)
    raise RunError(
        f"{out / 'checkpoints'}: no checkpoint of this run reads whole ({'; '.join(skipped)}); "
        f"nothing there was changed; restore them from a copy, or train into a new --out")


def _read_checkpoint(ckpt, prefix: Path) -> str | None:
    """Restore ckpt (model + optimizer) from prefix: None when it read whole, else which file does
    not and why. A checkpoint of another model or optimizer is a RunError."""
    import tensorflow as tf

    try:
        tf.train.load_checkpoint(str(prefix))
    except Exception as e:  # TensorFlow's errors, IndexError, ValueError: unreadable, all of them
        return f"{prefix}.index: not readable ({_exception_line(e)})"
    try:
        ckpt.restore(str(prefix)).assert_existing_objects_matched()
    except AssertionError as e:  # e.g. a checkpoint of Keras' new optimizers
        first = (str(e).strip().splitlines() or ["no detail"])[0][:200]
        raise RunError(f"{prefix}: does not match this run's model and optimizer ({first}); "
                       f"train into a new --out") from None
    except Exception as e:
        data = ", ".join(map(str, sorted(prefix.parent.glob(f"{prefix.name}.data-*"))))
        return f"{data}: does not read whole ({_exception_line(e)})"
    return None


def _exception_line(e: Exception) -> str:
    """`Type: first line` of an exception, without TensorFlow's {{function_node ...}}."""
    message = re.sub(r"\{\{[^}]*\}\}\s*", "", getattr(e, "message", None) or str(e))
    return f"{type(e).__name__}: {_tf_error_detail(message)}" if message.strip() \
        else type(e).__name__


def _rewind(out: Path, state: dict, epoch: int, skipped: list[str]) -> dict:
    """state.json rewound to `epoch` (its history cut there; the best model, possibly of a later
    epoch, kept), so that it names a checkpoint that reads whole; the skipped ones are named."""
    from chexflow.train.callbacks import reported_writes, write_json

    for why in skipped:
        print(f"train: warning: skipped a checkpoint: {why}", flush=True)

    later = state["epoch"]
    state = {**state, "epoch": epoch,
             "history": [h for h in state.get("history", []) if h["epoch"] <= epoch]}
    with reported_writes(out, state_file(out)):
        write_json(state_file(out), state)
    again = f"epoch {later} is" if later == epoch + 1 else f"epochs {epoch + 1} to {later} are"
    print(f"train: warning: resuming after epoch {epoch}, not {later}: {again} trained again, "
          f"{'its checkpoint' if later == epoch + 1 else 'their checkpoints'} written anew",
          flush=True)
    return state


def _datasets(args: argparse.Namespace, manifest, c: int, hvd_tf):
    """(training dataset, validation (dataset, this rank's images) or None, steps per epoch):
    this rank's shard of the TFRecords, or the same stages on in-memory examples."""
    from chexflow.train import data

    rank, size = hvd_tf.rank(), hvd_tf.size()
    validation = None
    if args.synthetic_data:
        # the real input's stages and callbacks (validation included) on in-memory examples
        train_ds = data.synthetic_dataset(args.image_size, c, args.batch_size, args.seed + rank)
        validation = data.synthetic_eval_dataset(args.image_size, c, args.batch_size,
                                                 args.validation_steps or 1,
                                                 args.seed + size + rank)
        return train_ds, validation, args.steps_per_epoch or 50
    train_ds = data.train_dataset(
        manifest, args.batch_size, rank, size, args.seed, args.shuffle_labels
    )
    steps = args.steps_per_epoch or max(1, manifest.images("train") // (args.batch_size * size))
    if manifest.images("val"):
        validation = data.eval_dataset(manifest, "val", args.batch_size, rank, size)
    return train_ds, validation, steps


def _callbacks(args: argparse.Namespace, out: Path, hvd_tf, manager, state: dict, validation,
               steps: int, c: int):
    """(callbacks in order, the throughput meter, the first step's wall-clock times):
    validation AUROC first, so every later callback sees it."""
    import horovod.tensorflow.keras as hvd
    from tensorflow import keras

    from chexflow.train import callbacks as cb
    from chexflow.train import recipe

    rank, size = hvd_tf.rank(), hvd_tf.size()
    scaled_lr = args.lr * size
    throughput = cb.Throughput(args.batch_size, args.warmup_steps)
    if rank == 0 and steps <= args.warmup_steps:
        print(
            f"train: warning: {steps} steps per epoch <= --warmup-steps {args.warmup_steps}: "
            "no step is timed, so images_per_sec is not reported",
            flush=True,
        )
    plateau = None
    callbacks: list = []
    if validation is not None:
        callbacks.append(cb.ValidationAUROC(*validation, c, args.validation_steps))
        plateau = recipe.plateau_callback() if args.lr_schedule == "plateau" else None
        if plateau is not None and "plateau" in state:
            plateau.on_train_begin()
            plateau.best = state["plateau"]["best"] if state["plateau"]["best"] is not None \
                else plateau.best
            plateau.wait = state["plateau"]["wait"]
            plateau.cooldown_counter = state["plateau"]["cooldown_counter"]
            plateau.on_train_begin = lambda logs=None: None  # keep the restored state
    # wall-clock (Unix) times of this rank's first step, e.g. for the time from an MPIJob's
    # creation to training (chexflow bench)
    first_step: dict[str, float] = {}
    callbacks += [throughput, hvd.callbacks.MetricAverageCallback(), keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs=None: first_step.setdefault("began", time.time()),
        on_train_batch_end=lambda batch, logs=None: first_step.setdefault("ended", time.time()))]
    callbacks.append(cb.StopOnDivergence(args.lr))  # before RunState saves the epoch's model
    if size > 1 and args.lr_warmup_epochs > 0:
        callbacks.append(
            hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=scaled_lr, warmup_epochs=args.lr_warmup_epochs,
                steps_per_epoch=steps, verbose=0,
                # Keras >= 2.11 optimizers keep momentum as a Python float, which Horovod's
                # momentum correction cannot set (AttributeError with --optimizer sgd)
                momentum_correction=False,
            )
        )
    if args.lr_schedule == "cosine":
        callbacks.append(cb.CosineDecay(scaled_lr, round(args.lr_warmup_epochs * steps) if size > 1
                                        else 0, args.epochs * steps))
    if plateau is not None:
        callbacks.append(plateau)
    if rank == 0:
        callbacks += [
            cb.RunState(out, manager, state, plateau),
            keras.callbacks.TensorBoard(str(out / "logs"), profile_batch=0),
            cb.KatibLines(),
        ]
    return callbacks, throughput, first_step


def _fit(args: argparse.Namespace, tf, model, train_ds, initial_epoch: int, steps: int,
         callbacks: list, rank: int) -> None:
    """model.fit; corrupt TFRecords met while training become one line naming --data."""
    from chexflow.train.callbacks import reported_writes

    # rank 0's writes besides RunState's (TensorBoard's event files)
    writes = reported_writes(Path(args.out)) if rank == 0 else contextlib.nullcontext()
    try:
        with writes:
            model.fit(
                train_ds, epochs=args.epochs, initial_epoch=initial_epoch,
                steps_per_epoch=steps, callbacks=callbacks, verbose=2 if rank == 0 else 0,
            )
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        if not _from_input_pipeline(args, e):
            raise
        from chexflow.data.manifest import DatasetError

        raise DatasetError(
            f"--data {args.data}: corrupt TFRecord data while training "
            f"({type(e).__name__}: {_tf_error_detail(e.message)})"
        ) from e


def _write_metrics(args: argparse.Namespace, out: Path, state: dict, summary, epochs,
                   first_step: dict, horovod: dict, size: int, started: float) -> None:
    """Rank 0: metrics.json (the best epoch, steady-state images/s, the warm-up apart) and the
    `final ...` line Katib's collectors read."""
    from chexflow.train import callbacks as cb

    state = read_state(out) or state
    metrics = _metrics(args, size, state, summary, epochs, started)
    metrics["horovod"] = horovod
    metrics["started_at"] = started
    metrics["first_step_began_at"] = first_step.get("began")
    metrics["first_step_ended_at"] = first_step.get("ended")
    if "ended" in first_step:  # warm-up, apart from the steady-state images_per_sec
        metrics["startup_seconds"] = round(first_step["began"] - started, 2)
        metrics["first_step_seconds"] = round(first_step["ended"] - first_step["began"], 2)
    with cb.reported_writes(out, out / "metrics.json"):
        cb.write_json(out / "metrics.json", metrics)
    print(
        "final " + " ".join(
            f"{k}={metrics[k]:.6g}" for k in ("val_auroc", "val_loss", "images_per_sec")
            if isinstance(metrics.get(k), float) and math.isfinite(metrics[k])
        ),
        flush=True,
    )
    print(f"train: wrote {out / 'metrics.json'} and {out / 'best_model.keras'}", flush=True)


def _metrics(args, size, state, summary, epochs, started) -> dict:
    best = state.get("best") or {}
    history = state.get("history", [])
    last = history[-1] if history else {}
    try:  # an earlier run's, for the total wall time (rewritten now)
        earlier = json.loads((Path(args.out) / "metrics.json").read_text())
    except (OSError, ValueError):
        earlier = {}
    wall = time.time() - started
    return {
        "model": args.model,
        "workers": size,
        "image_size": args.image_size,
        "batch_size_per_worker": args.batch_size,
        "global_batch_size": args.batch_size * size,
        "epochs": int(state.get("epoch", 0)),
        "lr": args.lr,
        "scaled_lr": args.lr * size,
        "optimizer": args.optimizer,
        "lr_schedule": args.lr_schedule,
        "bn_momentum": args.bn_momentum,
        "weight_decay": args.weight_decay,
        "weights": args.weights,
        "synthetic_data": bool(args.synthetic_data),
        "shuffle_labels": bool(args.shuffle_labels),
        "amp": bool(args.amp),
        "xla": bool(args.xla),
        "val_auroc": best.get("val_auroc"),
        "val_loss": best.get("val_loss"),
        "best_epoch": best.get("epoch"),
        "last_epoch": last,
        **(summary or {"images_per_sec": None, "images_per_sec_per_worker": None}),
        "warmup_steps": args.warmup_steps,
        "throughput_per_epoch": epochs,
        "wall_seconds": round(wall, 2),
        "wall_seconds_total": round(wall + (earlier.get("wall_seconds_total") or 0), 2),
        "history": history,
        "best_model": str(Path(args.out) / "best_model.keras"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chexflow.train.worker",
        description="One Horovod rank of a chexflow training run.",
    )
    add_train_arguments(parser, launcher=False)
    args = parser.parse_args(argv)
    try:
        return train(args)
    except ChexflowError as e:
        message = str(e)
        error_file = os.environ.get(ERROR_FILE_ENV)
        if error_file:  # `chexflow train` prints it: one line, not one per rank and its own
            try:
                with open(error_file, "x") as f:
                    f.write(message)
            except FileExistsError:
                pass
            return 2
        print(f"chexflow train: error: {message}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
