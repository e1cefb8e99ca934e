"""The CheXNet recipe: masked summed binary cross-entropy, Adam, LR warm-up and plateau decay."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow import keras


@keras.saving.register_keras_serializable(package="chexflow")
class MaskedBCE(keras.losses.Loss):
    """Sum over classes of binary cross-entropy, ignoring labels whose mask is 0.

    y_true packs labels and mask: shape (batch, 2 x classes). pos/neg weights (per class)
    give CheXNet v1's weighted loss; None gives the unweighted sum (the default recipe).
    """

    def __init__(self, num_classes: int, pos_weight=None, neg_weight=None, **kwargs):
        kwargs.setdefault("name", "masked_bce")
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.pos_weight = None if pos_weight is None else [float(w) for w in pos_weight]
        self.neg_weight = None if neg_weight is None else [float(w) for w in neg_weight]

    def call(self, y_true, y_pred):
        c = self.num_classes
        labels, mask = y_true[:, :c], y_true[:, c:]
        p = tf.clip_by_value(tf.cast(y_pred, tf.float32), 1e-7, 1 - 1e-7)
        pos = labels * tf.math.log(p)
        neg = (1 - labels) * tf.math.log(1 - p)
        if self.pos_weight is not None:
            pos *= tf.constant(self.pos_weight)
            neg *= tf.constant(self.neg_weight)
        return -tf.reduce_sum((pos + neg) * mask, axis=-1)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "pos_weight": self.pos_weight,
            "neg_weight": self.neg_weight,
        }


def class_weights(
    label_counts: dict[str, int], images: int, classes
) -> tuple[list[float], list[float]]:
    """CheXNet v1 weights per class: w+ = |N| / (|P|+|N|), w- = |P| / (|P|+|N|)."""
    pos = np.array([label_counts.get(c, 0) for c in classes], dtype=np.float64)
    pos_w = (images - pos) / max(images, 1)
    neg_w = pos / max(images, 1)
    return pos_w.tolist(), neg_w.tolist()


def masked_bce_numpy(labels: np.ndarray, mask: np.ndarray, probs: np.ndarray) -> float:
    """The unweighted loss above, averaged over images (for validation on gathered arrays)."""
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    return float((bce * mask).sum(axis=1).mean()) if len(labels) else float("nan")


class _DecoupledWeightDecay:
    """The new Keras optimizers' `weight_decay` on a legacy one: before each variable's update,
    var -= lr * weight_decay * var (decoupled from the gradient, as AdamW); dense gradients
    only, which is all DenseNet-121 and ResNet-50 have."""

    def __init__(self, *args, weight_decay: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_decay = float(weight_decay)

    def get_config(self) -> dict:  # Horovod rebuilds the optimizer from it
        return {**super().get_config(), "weight_decay": self.weight_decay}

    def _resource_apply_dense(self, grad, var, apply_state=None):
        if not self.weight_decay:
            return super()._resource_apply_dense(grad, var, apply_state)
        decay = var.assign_sub(var * (self._decayed_lr(var.dtype) * self.weight_decay))
        with tf.control_dependencies([decay]):
            return super()._resource_apply_dense(grad, var, apply_state)


@keras.saving.register_keras_serializable(package="chexflow")
class Adam(_DecoupledWeightDecay, keras.optimizers.legacy.Adam):
    """Keras' legacy Adam with decoupled weight decay."""


@keras.saving.register_keras_serializable(package="chexflow")
class SGD(_DecoupledWeightDecay, keras.optimizers.legacy.SGD):
    """Keras' legacy SGD with decoupled weight decay."""


def optimizer(name: str, lr: float, weight_decay: float = 0.0) -> keras.optimizers.Optimizer:
    """CheXNet's Adam(beta_1=0.9, beta_2=0.999), or SGD with Nesterov momentum 0.9; a positive
    weight_decay is decoupled, as the new Keras optimizers' `weight_decay`.

    They are Keras' legacy optimizers: the same steps, one fused op per variable where the new
    ones trace about fifteen, so the training step builds much faster, and the steps after it
    run as fast (docs/training.md#chexflow-train).
    tests/test_train_optimizer.py checks the steps are the same."""
    if name == "sgd":
        return SGD(learning_rate=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)
    return Adam(learning_rate=lr, beta_1=0.9, beta_2=0.999, weight_decay=weight_decay)


def build_optimizer(optimizer, variables: list) -> None:
    """Create the optimizer's slots now, so a checkpoint restores them and Horovod broadcasts
    them before the first step (what the legacy optimizers' apply_gradients does first)."""
    optimizer._create_all_weights(variables)


def optimizer_variables(optimizer) -> list:
    """The optimizer's variables: a method of a legacy optimizer, a callable list once
    Horovod's DistributedOptimizer wraps it."""
    found = optimizer.variables
    return list(found() if callable(found) else found)


def plateau_callback() -> keras.callbacks.ReduceLROnPlateau:
    """LR / 10 when the validation loss stops improving (CheXNet)."""
    return keras.callbacks.ReduceLROnPlateau(
        monitor="val_loss", factor=0.1, patience=1, min_lr=1e-7, verbose=0
    )
