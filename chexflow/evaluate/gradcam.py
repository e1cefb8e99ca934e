"""Grad-CAM (Selvaraju et al. 2017) for chexflow's models, with tf.GradientTape (trainer
environment).

A class's map is the ReLU of the feature maps of one convolutional block weighted by the
spatial mean of the gradient of the class's logit (its score before the sigmoid) with respect
to them, upsampled bilinearly to the image and scaled to a peak of 1. CheXNet draws its maps
from the last block; at 224 px that is 7 x 7 cells (DenseNet-121's and ResNet-50's stride is
32). At a smaller input the last block shrinks (2 x 2 at 64 px), too coarse to say where in the
image the model looked (a quadrant at most), so the default block is the last one whose map has
at least MIN_CELLS cells a side: the last block from 128 px up, the one before it (dense block 3,
ResNet-50's conv4 stage: stride 16) from 64 px, the one before that (stride 8) below.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow import keras

from chexflow.errors import ChexflowError
from chexflow.train.models import FAMILY

# Each backbone's block outputs, last first: DenseNet-121's final BN+ReLU after dense block 4,
# then dense blocks 3 and 2; ResNet-50's stages conv5, conv4, conv3.
BLOCKS = {
    "densenet121": ("relu", "conv4_block24_concat", "conv3_block12_concat"),
    "resnet50": ("conv5_block3_out", "conv4_block6_out", "conv3_block4_out"),
}
MIN_CELLS = 4


class CamError(ChexflowError):
    """The model or the layer asked for cannot give a class activation map."""


def backbone(model: keras.Model) -> keras.Model:
    """The DenseNet-121 or ResNet-50 inside a chexflow model."""
    for layer in model.layers:
        if layer.name in FAMILY and isinstance(layer, keras.Model):
            return layer
    raise CamError(f"model {model.name}: no {' or '.join(FAMILY)} backbone in it (not a model "
                   "written by chexflow train)")


def default_layer(model: keras.Model) -> str:
    """The last block of the backbone whose map has at least MIN_CELLS cells a side (the
    earliest listed block when none has)."""
    base = backbone(model)
    blocks = BLOCKS[base.name]
    for name in blocks:
        if min(base.get_layer(name).output.shape[1:3]) >= MIN_CELLS:
            return name
    return blocks[-1]


class GradCam:
    """Maps and probabilities of a chexflow model, from one block (`layer`: a layer name of
    its backbone; None: default_layer)."""

    def __init__(self, model: keras.Model, layer: str | None = None):
        self.model = model
        base = backbone(model)
        self.layer = layer or default_layer(model)
        try:
            block = base.get_layer(self.layer)
        except ValueError:
            raise CamError(f"--layer {self.layer}: no such layer in {base.name} (e.g. "
                           f"{', '.join(BLOCKS[base.name])})") from None
        if len(block.output.shape) != 4:
            raise CamError(f"--layer {self.layer}: its output is not a feature map "
                           f"(shape {block.output.shape})")
        self.base = base
        self.features = keras.Model(base.inputs, [block.output, base.output])
        self.head = model.layers[-1]
        self.cells = tuple(block.output.shape[1:3])
        # traced once (seconds for DenseNet-121), then far faster than eager per batch
        self._compiled = tf.function(self._maps, reduce_retracing=True)

    def _forward(self, images: tf.Tensor):
        """(block feature maps, logits) of a batch, the model's own layers in inference mode."""
        x = images
        for layer in self.model.layers[1:-1]:
            if layer is self.base:
                feats, x = self.features(x, training=False)
            else:
                x = layer(x, training=False)
        return feats, tf.matmul(x, self.head.kernel) + self.head.bias

    def _maps(self, images: tf.Tensor, classes: tf.Tensor):
        with tf.GradientTape() as tape:
            feats, logits = self._forward(images)
            chosen = tf.gather(logits, classes, batch_dims=1)
        # each image's logit depends on that image's features alone (inference mode)
        grads = tape.gradient(chosen, feats)
        weights = tf.reduce_mean(grads, axis=(1, 2), keepdims=True)
        cam = tf.nn.relu(tf.reduce_sum(weights * feats, axis=-1, keepdims=True))
        cam = tf.image.resize(cam, tf.shape(images)[1:3], method="bilinear")[..., 0]
        peak = tf.reduce_max(cam, axis=(1, 2), keepdims=True)
        cam = tf.math.divide_no_nan(cam, peak)
        return cam, tf.sigmoid(logits)

    def __call__(self, images: np.ndarray, classes: np.ndarray,
                 compiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(maps [n, H, W] in 0..1, the model's probabilities [n, classes]) of raw uint8 images
        [n, H, W, 1], map i for class classes[i] of image i; `compiled`: as a tf.function
        (for many batches: tracing it costs more than one eager batch)."""
        run = self._compiled if compiled else self._maps
        cam, probs = run(tf.constant(images), tf.constant(classes, tf.int32))
        return cam.numpy(), probs.numpy()

    def all_classes(self, images: np.ndarray, batch_size: int = 32,
                    classes: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(maps [n, len(classes), H, W], probabilities [n, all classes]) of each image, for
        `classes` (indices; None: every class)."""
        n = len(images)
        picked = np.arange(self.model.output_shape[-1]) if classes is None else np.array(classes)
        rows = np.repeat(np.arange(n), len(picked))
        wanted = np.tile(picked, n)
        maps, probs = [], []
        compiled = len(rows) > 3 * batch_size
        for at in range(0, len(rows), batch_size):
            m, p = self(images[rows[at:at + batch_size]], wanted[at:at + batch_size], compiled)
            maps.append(m)
            probs.append(p)
        maps = np.concatenate(maps).reshape(n, len(picked), *images.shape[1:3])
        return maps, np.concatenate(probs)[::len(picked)]

