"""DenseNet-121 / ResNet-50 for 14 sigmoid outputs on greyscale images (Keras 2: tf-keras).

The model takes raw greyscale pixels (H, W, 1) in 0..255 and does its own preprocessing:
greyscale -> 3 channels, then the ImageNet normalisation of its family as Keras defines it
(DenseNet: "torch" mode, /255 then ImageNet mean/std; ResNet-50: "caffe" mode, BGR minus the
ImageNet mean pixel), then (unless left out) a random horizontal flip while training. A saved
model therefore needs no outside knowledge to predict.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import tensorflow as tf
from tensorflow import keras

from chexflow.errors import ChexflowError

FAMILY = {"densenet121": "densenet", "resnet50": "resnet"}
# the members of a .keras file (a zip) that hold the architecture and the weights
KERAS_CONFIG, KERAS_WEIGHTS = "config.json", "model.weights.h5"

# Keras 3 has keras.version(); Keras 2 (tf-keras, or TF <= 2.15's own) has not
if hasattr(keras, "version"):
    _why = (f"TF_USE_LEGACY_KERAS={os.environ['TF_USE_LEGACY_KERAS']} is set in the environment"
            if os.environ.get("TF_USE_LEGACY_KERAS", "1") not in ("1", "true", "True")
            else "tensorflow.keras was used before chexflow set TF_USE_LEGACY_KERAS=1")
    raise ChexflowError(
        f"tensorflow.keras is Keras {keras.version()}, and chexflow and Horovod need Keras 2 "
        f"(tf-keras): {_why}; import chexflow first, or set TF_USE_LEGACY_KERAS=1"
    )


class WeightsError(ChexflowError):
    """--weights could not be loaded."""


WEIGHTS_EXPECTED = ("expected none, imagenet, a .h5 backbone weights file or a .keras model "
                    "written by chexflow train")


@keras.saving.register_keras_serializable(package="chexflow")
class ImageNetPreprocess(keras.layers.Layer):
    """Greyscale 0..255 -> 3-channel input normalised the way `family` was trained on ImageNet."""

    def __init__(self, family: str, **kwargs):
        super().__init__(**kwargs)
        if family not in ("densenet", "resnet"):
            raise ValueError(f"family {family!r}: expected densenet or resnet")
        self.family = family

    def call(self, images):
        x = tf.cast(images, self.compute_dtype)
        x = tf.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x
        if self.family == "densenet":
            return keras.applications.densenet.preprocess_input(x)
        return keras.applications.resnet50.preprocess_input(x)

    def get_config(self):
        return {**super().get_config(), "family": self.family}


def _backbone(name: str, image_size: int, weights: str | None) -> keras.Model:
    shape = (image_size, image_size, 3)
    app = {"densenet121": keras.applications.DenseNet121, "resnet50": keras.applications.ResNet50}
    return app[name](include_top=False, weights=weights, input_shape=shape, pooling="avg")


def build_model(
    name: str, image_size: int, num_classes: int, weights: str = "none", seed: int = 0,
    bn_momentum: float = 0.99, flip: bool = True,
) -> keras.Model:
    """The classifier; `weights` is none, imagenet, a Keras .h5 backbone file or a .keras model.
    `bn_momentum`: of every BatchNormalization layer's moving averages (Keras' default 0.99);
    `flip`: a random horizontal flip while training (CheXNet's augmentation)."""
    if name not in FAMILY:
        raise WeightsError(f"--model {name!r}: expected one of {', '.join(FAMILY)}")
    backbone_weights = None
    if weights == "imagenet":
        backbone_weights = "imagenet"
    elif weights not in ("none", "", None) and Path(weights).suffix == ".h5":
        backbone_weights = str(weights)
    try:
        base = _backbone(name, image_size, backbone_weights)
    except Exception as e:  # keras raises ValueError/OSError/URL errors: all mean "no weights"
        if weights == "imagenet":
            raise WeightsError(
                f"--weights imagenet: Keras could not fetch the ImageNet weights for {name} "
                f"({type(e).__name__}: {str(e).splitlines()[0][:300]}). Without network access, "
                f"download the *_notop.h5 file elsewhere and pass --weights PATH"
            ) from e
        raise WeightsError(
            f"--weights {weights}: not a Keras weights file for {name} without its top "
            f"({type(e).__name__}: {str(e).splitlines()[0][:300]})"
        ) from e
    inputs = keras.Input((image_size, image_size, 1), name="image")
    x = ImageNetPreprocess(FAMILY[name], name="imagenet_preprocess")(inputs)
    if flip:
        x = keras.layers.RandomFlip("horizontal", seed=seed, name="random_flip")(x)
    x = base(x)
    outputs = keras.layers.Dense(num_classes, activation="sigmoid", dtype="float32", name="probs")(
        x
    )
    model = keras.Model(inputs, outputs, name=f"chexflow_{name}")
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = bn_momentum
    if backbone_weights is None and weights not in ("none", "", None):
        _load_full_model_weights(model, Path(weights))
    return model


def _load_full_model_weights(model: keras.Model, path: Path) -> None:
    """Copy the weights of an earlier chexflow model (.keras file) into `model`."""
    if not path.exists():
        raise WeightsError(f"--weights {path}: no such file ({WEIGHTS_EXPECTED})")
    try:
        src = load_model(path, option="--weights", expected=WEIGHTS_EXPECTED)
        model.set_weights(src.get_weights())
    except WeightsError:
        raise
    except Exception as e:
        raise WeightsError(
            f"--weights {path}: cannot load it into {model.name} at input "
            f"{model.input_shape[1:]} ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
        ) from e


def load_model(path: Path, option: str = "--model", expected: str = "") -> keras.Model:
    """A model written by `chexflow train` (best_model.keras), for prediction; errors name
    `option`, the one that gave the path, and say what it `expected`."""
    path = Path(path)
    if path.is_dir() and (path / "best_model.keras").exists():
        path = path / "best_model.keras"
    if not path.exists():
        raise WeightsError(f"{option} {path}: no such file or run folder with best_model.keras")
    try:
        with tempfile.TemporaryDirectory(prefix="chexflow-model-") as tmp:
            return _read_keras_file(path, Path(tmp))
    except Exception as e:
        raise WeightsError(
            f"{option} {path}: not a Keras model chexflow can load ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:300]})" + (f"; {expected}" if expected else "")
        ) from e


def _read_keras_file(path: Path, tmp: Path) -> keras.Model:
    """What keras.models.load_model(path, compile=False) returns, read another way. tf-keras
    reads the weights' HDF5 member through zipfile, where every backward seek reads the member
    again from its start: extracted to a file, it loads several times faster (Keras 3 reads it
    into memory first for the same reason). The architecture comes from config.json as
    load_model takes it."""
    with zipfile.ZipFile(path) as zf:
        config = json.loads(zf.read(KERAS_CONFIG))
        weights = zf.extract(KERAS_WEIGHTS, tmp)
    config["compile_config"] = None  # as compile=False
    model = keras.saving.deserialize_keras_object(config)
    model.load_weights(weights)
    return model
