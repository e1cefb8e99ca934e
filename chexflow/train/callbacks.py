"""Keras callbacks of a Horovod training run: validation AUROC over all ranks, throughput,
checkpoints and resume state (rank 0), and Katib-parsable epoch lines."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from tensorflow import keras

from chexflow.auroc import nanmean, per_class_auroc
from chexflow.data import faults
from chexflow.data.tfrecords import as_os_error
from chexflow.errors import ChexflowError
from chexflow.train.recipe import masked_bce_numpy
from chexflow.train.rundir import (
    RUN_FILE,
    checkpoint_prefix,
    embed_model_info,
    remove_partial,
    resumable_epoch,
    state_file,
)
from chexflow.train.throughput import RankTiming, summarize

# the faults of a full disk, whatever else the write said
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class OutputError(ChexflowError):
    """Rank 0 could not write into the run folder (a full disk, a file system gone read-only)."""


def file_fault(e: BaseException) -> OSError | None:
    """The OSError behind a failed file operation (TensorFlow's file errors, 'PATH; No space left
    on device', as the OSError they report); None for any other error."""
    if isinstance(e, tf.errors.OpError):
        error = as_os_error(e.message)
        return error if error.errno else None
    return e if isinstance(e, OSError) else None


@contextlib.contextmanager
def reported_writes(out: Path, path: Path | None = None, *partial: str) -> Iterator[None]:
    """Rank 0 writing into the run folder `out`: a file fault in the block removes what the
    cut-short write left (rundir.PARTIAL_FILES and the patterns `partial`) and becomes one line
    naming `path` (else the file the fault names) and what to do."""
    try:
        yield
    except Exception as e:
        error = file_fault(e)
        if error is None:
            raise
        remove_partial(out, *partial)
        where = path or error.filename or out
        advice = ""
        if error.errno in NO_SPACE:
            done = resumable_epoch(out)
            advice = "; free space there, then rerun the same command" + (
                f" to resume after epoch {done}" if done else "")
        raise OutputError(f"{where}: {faults.cause(error)}{advice}") from None


def gather_rows(array: np.ndarray) -> np.ndarray:
    """Concatenate every rank's rows (in rank order); ranks may hold different row counts."""
    return hvd.allgather(tf.constant(array)).numpy()


class ValidationAUROC(keras.callbacks.Callback):
    """Predict this rank's share of the validation split, gather all ranks' predictions and
    compute val_loss (summed BCE) and val_auroc (nanmean of per-class AUROC) on the whole split.
    Every rank gets the same figures, so they need no averaging."""

    def __init__(self, dataset: tf.data.Dataset, count: int, num_classes: int, steps=None):
        super().__init__()
        self.dataset, self.count, self.c, self.steps = dataset, count, num_classes, steps
        self._infer = None

    def _predict(self):
        probs, labels, masks = [], [], []
        batches = self.dataset if self.steps is None else self.dataset.take(self.steps)
        if self._infer is None:  # one traced graph, not 121 eager layers per batch
            spec = tf.TensorSpec((None, *self.model.input_shape[1:]), tf.uint8)
            self._infer = tf.function(lambda x: self.model(x, training=False), [spec])
        if self.count:
            for x, y, m, _ in batches:
                probs.append(self._infer(x).numpy())
                labels.append(y.numpy())
                masks.append(m.numpy())
        if not probs:
            empty = np.zeros((0, self.c), np.float32)
            return empty, empty, empty
        return (np.concatenate(a).astype(np.float32) for a in (probs, labels, masks))

    def on_epoch_end(self, epoch, logs=None):
        probs, labels, masks = self._predict()
        probs, labels, masks = gather_rows(probs), gather_rows(labels), gather_rows(masks)
        logs["val_loss"] = masked_bce_numpy(labels, masks, probs)
        # a diverged model (e.g. float16 gradients that overflowed) predicts nan: no AUROC
        logs["val_auroc"] = nanmean(per_class_auroc(labels, probs, masks)) \
            if np.isfinite(probs).all() else float("nan")
        logs["val_images"] = len(labels)


class TrainingDiverged(ChexflowError, RuntimeError):
    """The loss went NaN or infinite: the run stops, and that epoch's model is not kept."""


class StopOnDivergence(keras.callbacks.Callback):
    """Every rank, after the metrics are averaged and before RunState: stop the run with a
    one-line error when the epoch's loss or val_loss is NaN or infinite (every rank sees the same
    figures, so all stop together), so a diverged model is never saved as best_model.keras."""

    NAMES = ("loss", "val_loss")

    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr

    def on_epoch_end(self, epoch, logs=None):
        for name in self.NAMES:
            value = _plain((logs or {}).get(name))
            if value is not None and not math.isfinite(value):
                raise TrainingDiverged(
                    f"training diverged: epoch {epoch + 1}'s {name} is {value}; stopped without "
                    f"saving that epoch (best_model.keras, if there is one, is from an earlier "
                    f"epoch); try a lower --lr than {self.lr:g}"
                )


class Throughput(keras.callbacks.Callback):
    """Images/s of this rank over each epoch's steps after `warmup_steps`; per-rank figures
    are gathered at each epoch end, and the total is their sum."""

    def __init__(self, batch_size: int, warmup_steps: int):
        super().__init__()
        self.batch_size, self.warmup = batch_size, warmup_steps
        self.run = RankTiming(0, 0.0, [], batch_size)
        self.epochs: list[dict] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = RankTiming(0, 0.0, [], self.batch_size)
        self.last = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.last is None:
            self.last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if batch >= self.warmup:
            step = now - self.last
            for t in (self.epoch, self.run):
                t.images += self.batch_size
                t.seconds += step
                t.step_seconds.append(step)
        self.last = now

    def on_epoch_end(self, epoch, logs=None):
        ranks = [RankTiming(**d) for d in hvd_tf.allgather_object(vars(self.epoch))]
        if all(r.step_seconds for r in ranks):
            s = summarize(ranks)
            logs["images_per_sec"] = s.images_per_sec
            logs["step_time_ms"] = s.step_time_ms
            self.epochs.append({"epoch": epoch + 1, **s.as_dict()})

    def summary(self) -> dict | None:
        """The whole run's figures (collective: call on every rank)."""
        ranks = [RankTiming(**d) for d in hvd_tf.allgather_object(vars(self.run))]
        if not all(r.step_seconds for r in ranks):
            return None
        return summarize(ranks).as_dict()


class CosineDecay(keras.callbacks.Callback):
    """From `lr` after `warmup_steps` (Horovod's warm-up callback sets it before) down along a
    half cosine towards 0 at step `total_steps`; a function of the step alone, so a resumed run
    continues the same curve."""

    def __init__(self, lr: float, warmup_steps: int, total_steps: int):
        super().__init__()
        self.lr, self.warmup, self.total = lr, warmup_steps, total_steps
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        step = self.epoch * self.params["steps"] + batch
        if step >= self.warmup:
            done = (step - self.warmup) / max(1, self.total - self.warmup)
            keras.backend.set_value(self.model.optimizer.learning_rate,
                                    self.lr * 0.5 * (1 + math.cos(math.pi * done)))


class RunState(keras.callbacks.Callback):
    """Rank 0 only: after each epoch, a tf.train.Checkpoint (model + optimizer, in
    checkpoints/), the best model by validation loss (best_model.keras, with its classes and
    image size stored in it: rundir.MODEL_INFO) and state.json."""

    def __init__(self, out: Path, manager: tf.train.CheckpointManager, state: dict, plateau):
        super().__init__()
        self.out, self.manager, self.state, self.plateau = out, manager, state, plateau

    def on_epoch_end(self, epoch, logs=None):
        record = {k: _plain(v) for k, v in (logs or {}).items()}
        record["epoch"] = epoch + 1
        record["lr"] = float(keras.backend.get_value(self.model.optimizer.learning_rate))
        val_loss = record.get("val_loss")
        best = self.state.get("best")
        improved = val_loss is None or best is None or (
            not math.isnan(val_loss) and val_loss < best["val_loss"]
        )
        if improved:
            with reported_writes(self.out, self.out / "best_model.keras"):
                self._save_best()
            self.state["best"] = {
                k: record.get(k) for k in ("epoch", "val_loss", "val_auroc", "loss")
            }
        prefix = checkpoint_prefix(self.out, epoch + 1)
        # a save cut short may leave ckpt-N's files half merged: never restored (state.json
        # records the epoch only after the save), removed with the rest
        with reported_writes(self.out, prefix, f"checkpoints/{prefix.name}.*"):
            self.manager.save(checkpoint_number=epoch + 1)
        self.state["epoch"] = epoch + 1
        self.state["history"] = [h for h in self.state.get("history", []) if h["epoch"] <= epoch]
        self.state["history"].append(record)
        if self.plateau is not None:
            self.state["plateau"] = {
                "best": _plain(self.plateau.best),
                "wait": self.plateau.wait,
                "cooldown_counter": self.plateau.cooldown_counter,
            }
        with reported_writes(self.out, state_file(self.out)):
            write_json(state_file(self.out), self.state)

    def _save_best(self) -> None:
        """best_model.keras: the same layers without the (Horovod-wrapped) optimizer (weights
        and architecture), with the run's classes and image size in it."""
        tmp = self.out / "best_model.tmp.keras"
        keras.Model(self.model.inputs, self.model.outputs, name=self.model.name).save(tmp)
        run = json.loads((self.out / RUN_FILE).read_text())  # written by rank 0 first
        embed_model_info(tmp, run["classes"], run["image_size"])  # travel with it
        tmp.replace(self.out / "best_model.keras")


class KatibLines(keras.callbacks.Callback):
    """Rank 0 only: one `name=value` line per epoch, for Katib's StdOut metrics collector."""

    NAMES = ("val_auroc", "val_loss", "loss", "images_per_sec", "step_time_ms", "lr")

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        logs.setdefault("lr", keras.backend.get_value(self.model.optimizer.learning_rate))
        parts = [f"epoch={epoch + 1}"]
        for name in self.NAMES:
            value = _plain(logs.get(name))
            if value is not None and not math.isnan(value):
                parts.append(f"{name}={value:.6g}")
        print(" ".join(parts), flush=True)


def _plain(v):
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (a killed run never leaves half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(clean(data), indent=2, allow_nan=False))
    tmp.replace(path)


def clean(o):
    """JSON-safe copy: nan/inf -> None, numpy scalars -> Python numbers."""
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    if isinstance(o, (np.floating, float)):
        return None if not math.isfinite(float(o)) else float(o)
    if isinstance(o, np.integer):
        return int(o)
    return o
