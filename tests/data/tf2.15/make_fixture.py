"""Writes this folder's files with the TF 2.15.1 trainer environment chexflow used until 2026-11
(Keras 2.15 built in), for tests/test_tf_stack.py to read with today's TF 2.20 + tf-keras:
    PYTHONPATH=. .venv-tf2.15/bin/python tests/data/tf2.15/make_fixture.py
A small model of the trainer's own kind (chexflow's ImageNetPreprocess layer, a convolution,
14 sigmoid outputs, Adam after one step): a DenseNet-121 is 28 MB, too much for the repository.
It is saved as that trainer saved a run: best_model.keras with its classes in a member of its
own (chexflow.json), and a tf.train.Checkpoint of model and optimizer under checkpoints/ (what
--resume restores); expected.json holds its predictions.
"""

import json
import zipfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow import keras

from chexflow.train.models import ImageNetPreprocess

HERE = Path(__file__).resolve().parent
CLASSES = [f"class{i}" for i in range(14)]


def model() -> keras.Model:
    """The fixture's architecture (tests/test_tf_stack.py builds the same one)."""
    inputs = keras.Input((16, 16, 1), name="image")
    x = ImageNetPreprocess("densenet")(inputs)
    x = keras.layers.Conv2D(4, 3, name="conv")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(14, activation="sigmoid", name="pathologies")(x)
    return keras.Model(inputs, outputs, name="tiny")


def inputs() -> np.ndarray:
    return (np.arange(2 * 16 * 16, dtype=np.float32).reshape(2, 16, 16, 1) * 7) % 256


def main() -> None:
    tf.keras.utils.set_random_seed(0)
    m = model()
    m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    m.fit(inputs(), np.ones((2, 14), np.float32), epochs=1, verbose=0)
    m.save(HERE / "best_model.keras")
    with zipfile.ZipFile(HERE / "best_model.keras", "a") as zf:  # as the TF 2.15 trainer did
        zf.writestr("chexflow.json", json.dumps({"classes": CLASSES, "image_size": 16}))
    ckpt = tf.train.Checkpoint(model=m, optimizer=m.optimizer)
    tf.train.CheckpointManager(ckpt, str(HERE / "checkpoints"), max_to_keep=2).save(1)
    (HERE / "expected.json").write_text(json.dumps({
        "tensorflow": tf.__version__, "keras_package": keras.Model.__module__.split(".")[0],
        "predictions": m.predict(inputs(), verbose=0).tolist(),
        "optimizer_iterations": int(m.optimizer.iterations.numpy()),
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
