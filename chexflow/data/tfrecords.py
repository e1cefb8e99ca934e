"""Writing one TFRecord shard (in a worker process) and the Example encoding it uses."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from chexflow.data.images import ImageRejected, load_greyscale
from chexflow.data.records import Record, Rejection


@dataclass
class ShardResult:
    """What a worker reports for one shard."""

    path: str
    written: list[Record] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    converted: dict[str, int] = field(default_factory=dict)
    image_hashes: list[tuple[str, str]] = field(default_factory=list)


def encode_example(record: Record, pixels) -> bytes:
    """One serialized tf.train.Example in chexflow's schema (records.FEATURE_KEYS)."""
    import tensorflow as tf

    def b(v: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def i(v: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

    def f(v: list[float]):
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))

    features = {
        "image": b(pixels.tobytes()),
        "height": i(int(pixels.shape[0])),
        "width": i(int(pixels.shape[1])),
        "labels": f(record.labels),
        "mask": f(record.mask),
        "image_index": b(record.image_index.encode()),
        "patient_id": b(record.patient_id.encode()),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_shard(path: str, records: list[Record], size: int, csv_name: str) -> ShardResult:
    """Decode, convert and resize each image; write the shard atomically (tmp, then rename)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    result = ShardResult(path=path)
    tmp = f"{path}.tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for record in records:
            try:
                pixels, data, converted = load_greyscale(record.path, size)
            except ImageRejected as e:
                result.rejections.append(
                    Rejection(csv_name, record.source_row, record.image_index, str(e))
                )
                continue
            if converted:
                result.converted[converted] = result.converted.get(converted, 0) + 1
            writer.write(encode_example(record, pixels))
            result.written.append(record)
            result.image_hashes.append((record.image_index, hashlib.sha256(data).hexdigest()))
    Path(tmp).replace(path)
    return result
