"""Predictions of a trained model for one split, in TFRecord order (trainer environment)."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from chexflow.data.manifest import DatasetError, Manifest


def load_checked(model_path, manifest: Manifest):
    """The model of --model, refused in one line if its input size or output count does not
    fit the data's manifest."""
    from chexflow.train.models import load_model

    model = load_model(model_path)
    size = model.input_shape[1]
    if size != manifest.image_size or model.output_shape[-1] != len(manifest.classes):
        raise DatasetError(
            f"--model {model_path} takes {size} px images and has {model.output_shape[-1]} "
            f"outputs; {manifest.root}/manifest.json has {manifest.image_size} px images and "
            f"{len(manifest.classes)} classes"
        )
    return model


def predict_split(model_path, manifest: Manifest, split: str, batch_size: int,
                  model=None) -> dict:
    """{image_index, labels, mask, probs} for every image of `split`; `model`: the model of
    `model_path` already loaded (load_checked)."""
    import tensorflow as tf

    from chexflow.train import data

    if model is None:
        model = load_checked(model_path, manifest)
    ds, count = data.eval_dataset(manifest, split, batch_size)
    parts = {"image_index": [], "labels": [], "mask": [], "probs": []}
    try:
        with tqdm(total=count, desc=f"predict {split}", unit="img") as bar:
            for x, y, m, k in ds:
                parts["probs"].append(model(x, training=False).numpy())
                parts["labels"].append(y.numpy())
                parts["mask"].append(m.numpy())
                parts["image_index"].append(k.numpy().astype(str))
                bar.update(len(k))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise DatasetError(
            f"{manifest.root}: corrupt TFRecord in split {split} ({e.message.splitlines()[0]})"
        ) from e
    return {k: np.concatenate(v) for k, v in parts.items()}
