"""Decoding images in worker processes and writing TFRecord shards in the parent.

Workers only decode, convert and resize (PIL + numpy: cheap to start); the parent alone imports
TensorFlow, serializes tf.train.Examples and writes each shard atomically (tmp, then rename).
"""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from chexflow.data.pixels import ImageRejected, load_greyscale
from chexflow.data.records import DataError, Record, Rejection


@dataclass
class Decoded:
    """A worker's answer for one record: the pixels, or why the image was rejected."""

    pixels: bytes = b""
    height: int = 0
    width: int = 0
    sha256: str = ""
    converted: str | None = None
    rejected: str | None = None


@dataclass
class ShardResult:
    """What was written to one shard."""

    path: str
    written: list[Record] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    converted: dict[str, int] = field(default_factory=dict)
    image_hashes: list[tuple[str, str]] = field(default_factory=list)


def decode(record: Record, size: int) -> Decoded:
    """Worker function: load one image as size x size 8-bit greyscale."""
    try:
        pixels, data, converted = load_greyscale(
            record.path, size, record.extra.get("original_size")
        )
    except ImageRejected as e:
        return Decoded(rejected=str(e))
    return Decoded(pixels.tobytes(), pixels.shape[0], pixels.shape[1],
                   hashlib.sha256(data).hexdigest(), converted)


def encode_example(record: Record, image: Decoded) -> bytes:
    """One serialized tf.train.Example in chexflow's schema (the schema in records.py)."""
    import tensorflow as tf

    def b(v: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def i(v: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

    def f(v: list[float]):
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))

    features = {
        "image": b(image.pixels),
        "height": i(image.height),
        "width": i(image.width),
        "labels": f(record.labels),
        "mask": f(record.mask),
        "image_index": b(record.image_index.encode()),
        "patient_id": b(record.patient_id.encode()),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def as_os_error(message: str) -> OSError:
    """A TensorFlow file error ('PATH; No space left on device', on one of its lines, maybe after
    TensorFlow's {{function_node ...}} and before its [Op:NAME]) as the OSError it reports; one
    with errno 0 when no line names an operating system error."""
    for line in message.splitlines():
        line = re.sub(r"\s*\[Op:[^\]]*\].*$", "", re.sub(r"^\s*\{\{[^}]*\}\}\s*", "", line))
        path, _, text = line.rpartition("; ")
        code = next((n for n in errno.errorcode if os.strerror(n) == text.strip()), 0)
        if code:
            return OSError(code, text.strip(), path or None)
    path, _, text = message.rpartition("; ")
    return OSError(0, text, path or None)


def decoded_stream(records: list[Record], size: int, workers: int) -> Iterator[Decoded]:
    """Decode records in order, in `workers` spawned processes (inline when workers <= 1).

    A worker that dies (killed, out of memory) ends the run with one line; with
    multiprocessing.Pool the run would wait forever for the images that worker held.
    """
    fn = partial(decode, size=size)
    if workers <= 1:
        yield from map(fn, records)
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield from pool.map(fn, records, chunksize=8)
    except BrokenProcessPool:
        raise DataError(
            "a process decoding images died (killed, or out of memory); nothing was written "
            "to --out; rerun, with fewer --workers if memory is short"
        ) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def write_shards(
    shards: list[tuple[str, list[Record]]],
    size: int,
    workers: int,
    csv_name: str,
    progress: Iterable | None = None,
) -> list[ShardResult]:
    """Write every (path, records) shard; `progress` is updated once per image."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    stream = decoded_stream([r for _, recs in shards for r in recs], size, workers)
    import tensorflow as tf  # the parent only: workers decode with PIL and numpy

    results = []
    for path, records in shards:
        result = ShardResult(path=path)
        tmp = f"{path}.tmp"
        try:
            with tf.io.TFRecordWriter(tmp) as writer:
                for record, image in zip(records, stream, strict=False):
                    if progress is not None:
                        progress.update(1)
                    if image.rejected:
                        result.rejections.append(Rejection(
                            csv_name, record.source_row, record.image_index, image.rejected
                        ))
                        continue
                    if image.converted:
                        result.converted[image.converted] = (
                            result.converted.get(image.converted, 0) + 1
                        )
                    writer.write(encode_example(record, image))
                    result.written.append(record)
                    result.image_hashes.append((record.image_index, image.sha256))
        except tf.errors.OpError as e:
            raise as_os_error(e.message) from None
        Path(tmp).replace(path)
        results.append(result)
    return results
