"""tf.data input from a preprocess manifest: TFRecords sharded per Horovod rank.

Each rank reads a disjoint part of the training data: whole files when there are at least
four per rank, otherwise every N-th record. Images stay raw uint8 (H, W, 1) until the model's
own preprocessing layer; labels and mask are packed into one (2 x classes) target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from chexflow.data.manifest import Manifest, Shard

AUTOTUNE = tf.data.AUTOTUNE


def _features(num_classes: int) -> dict:
    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "labels": tf.io.FixedLenFeature([num_classes], tf.float32),
        "mask": tf.io.FixedLenFeature([num_classes], tf.float32),
        "image_index": tf.io.FixedLenFeature([], tf.string),
    }


def _decode(size: int, num_classes: int):
    def parse(serialized):
        f = tf.io.parse_example(serialized, _features(num_classes))
        images = tf.io.decode_raw(f["image"], tf.uint8)
        images = tf.reshape(images, [-1, size, size, 1])
        return images, f["labels"], f["mask"], f["image_index"]

    return parse


def rank_records(shards: list[Shard], rank: int, size: int) -> tuple[list[str], bool, int]:
    """(files this rank opens, whether it keeps only every size-th record, its image count)."""
    if len(shards) >= 4 * size:
        mine = shards[rank::size]
        return [str(s.path) for s in mine], False, sum(s.images for s in mine)
    total = sum(s.images for s in shards)
    return [str(s.path) for s in shards], True, len(range(rank, total, size))


def _records(files: list[str], by_record: bool, rank: int, size: int) -> tf.data.Dataset:
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=min(4, len(files)) or None)
    return ds.shard(size, rank) if by_record else ds


def _shuffled_label_table(files: list[str], num_classes: int, seed: int):
    """A lookup image_index -> row of a label matrix permuted across images."""
    ds = tf.data.TFRecordDataset(files).batch(512).map(
        lambda s: tf.io.parse_example(s, _features(num_classes))
    )
    keys, labels, masks = [], [], []
    for f in ds.as_numpy_iterator():
        keys += list(f["image_index"])
        labels.append(f["labels"])
        masks.append(f["mask"])
    perm = np.random.default_rng(seed).permutation(len(keys))
    rows = np.concatenate([np.concatenate(labels), np.concatenate(masks)], axis=1)[perm]
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys), tf.range(len(keys), dtype=tf.int64)
        ),
        default_value=-1,
    )
    return table, tf.constant(rows, tf.float32)


def train_dataset(
    manifest: Manifest, batch_size: int, rank: int, size: int, seed: int,
    shuffle_labels: bool = False,
) -> tf.data.Dataset:
    """Endless shuffled batches of (images uint8, labels|mask) for this rank."""
    shards = manifest.splits["train"]
    files, by_record, _ = rank_records(shards, rank, size)
    c = len(manifest.classes)
    files_ds = tf.data.Dataset.from_tensor_slices(files).shuffle(
        len(files), seed=seed, reshuffle_each_iteration=True
    )
    if by_record:
        ds = tf.data.TFRecordDataset(files_ds).shard(size, rank)
    else:
        ds = files_ds.interleave(
            tf.data.TFRecordDataset, cycle_length=min(4, len(files)), num_parallel_calls=AUTOTUNE
        )
    ds = ds.shuffle(2048, seed=seed + rank, reshuffle_each_iteration=True).repeat()
    if not shuffle_labels:
        return _training_batches(ds, manifest.image_size, c, batch_size)
    table, rows = _shuffled_label_table([str(s.path) for s in shards], c, seed)

    def relabel(x, y, m, k):
        return x, tf.gather(rows, table.lookup(k))

    return _training_batches(ds, manifest.image_size, c, batch_size, relabel)


def _training_batches(records: tf.data.Dataset, image_size: int, num_classes: int,
                      batch_size: int, relabel=None) -> tf.data.Dataset:
    """Serialized examples -> prefetched (images uint8, labels|mask) batches: the stages every
    training input runs, from TFRecord files or from memory (synthetic_dataset)."""
    ds = records.batch(batch_size, drop_remainder=True).map(
        _decode(image_size, num_classes), num_parallel_calls=AUTOTUNE
    )
    if relabel is not None:
        ds = ds.map(relabel, num_parallel_calls=AUTOTUNE)
    else:
        ds = ds.map(lambda x, y, m, k: (x, tf.concat([y, m], axis=1)))
    return ds.prefetch(AUTOTUNE)


def eval_dataset(
    manifest: Manifest, split: str, batch_size: int, rank: int = 0, size: int = 1
) -> tuple[tf.data.Dataset, int]:
    """This rank's part of a split, once, in order: (images, labels, mask, image_index)."""
    files, by_record, count = rank_records(manifest.splits[split], rank, size)
    ds = _records(files, by_record, rank, size)
    ds = ds.batch(batch_size).map(
        _decode(manifest.image_size, len(manifest.classes)), num_parallel_calls=AUTOTUNE
    )
    return ds.prefetch(AUTOTUNE), count


def random_records(image_size: int, num_classes: int, count: int, seed: int) -> list[bytes]:
    """`count` serialized examples in the TFRecords' schema: random pixels, ~10% positive
    labels, every label known."""
    from chexflow.data.records import Record
    from chexflow.data.tfrecords import Decoded, encode_example

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        pixels = rng.integers(0, 256, (image_size, image_size), dtype=np.uint8)
        labels = (rng.random(num_classes) < 0.1).astype(float).tolist()
        record = Record(f"synthetic-{seed}-{i}.png", Path(), "synthetic", labels,
                        [1.0] * num_classes, i + 2)
        out.append(encode_example(record, Decoded(pixels.tobytes(), image_size, image_size)))
    return out


def synthetic_dataset(image_size: int, num_classes: int, batch_size: int, seed: int):
    """One batch of random examples held in memory, repeated forever (tf_cnn_benchmarks'
    synthetic input) through the same shuffle, batch, decode and prefetch stages as
    train_dataset: the two differ only in where the serialized examples come from."""
    records = tf.data.Dataset.from_tensor_slices(
        random_records(image_size, num_classes, batch_size, seed)
    )
    ds = records.shuffle(batch_size, seed=seed, reshuffle_each_iteration=True).repeat()
    return _training_batches(ds, image_size, num_classes, batch_size)


def synthetic_eval_dataset(image_size: int, num_classes: int, batch_size: int, batches: int,
                           seed: int) -> tuple[tf.data.Dataset, int]:
    """A synthetic validation split in eval_dataset's form: `batches` batches of random
    examples held in memory."""
    count = batch_size * batches
    ds = tf.data.Dataset.from_tensor_slices(random_records(image_size, num_classes, count, seed))
    ds = ds.batch(batch_size).map(_decode(image_size, num_classes), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE), count
