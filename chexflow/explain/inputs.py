"""The images `chexflow predict` and `chexflow explain` read: files as given, folders searched
for PNG, JPEG and DICOM files, each decoded by training's own load_greyscale, in order, in a few
spawned processes (as preprocess decodes) a bounded number ahead of the model."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from chexflow.data.dicom import DICOM_MAGIC, DICOM_SUFFIXES
from chexflow.data.pixels import ImageRejected, load_greyscale
from chexflow.errors import ChexflowError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", *DICOM_SUFFIXES)


class InputError(ChexflowError, ValueError):
    """An input folder holds no image."""


def _suffixless_dicom(path: Path) -> bool:
    """A file without a suffix that holds the DICOM marker (how PACS exports often name them)."""
    try:
        with open(path, "rb") as f:
            return f.read(132)[128:] == DICOM_MAGIC
    except OSError:
        return False


def in_folder(folder: Path) -> list[Path]:
    """The PNG, JPEG and DICOM files under FOLDER, sorted; InputError if there are none."""
    found = sorted(p for p in folder.rglob("*") if p.is_file() and (
        p.suffix.lower() in IMAGE_SUFFIXES or (not p.suffix and _suffixless_dicom(p))))
    if not found:
        raise InputError(f"INPUT {folder}: a folder without PNG, JPEG or DICOM files "
                         f"({', '.join(IMAGE_SUFFIXES)}, or DICOM files without a suffix)")
    return found


def collect(inputs: Iterable[Path]) -> list[Path]:
    """Every input: a folder's images (in_folder), any other path as given (one that cannot be
    read is reported in its own row, not dropped)."""
    out: list[Path] = []
    for path in inputs:
        out += in_folder(path) if Path(path).is_dir() else [Path(path)]
    return out


def load(path: Path, size: int) -> tuple[np.ndarray | None, str]:
    """(size x size x 1 uint8 pixels, "") or (None, why the image cannot be read)."""
    try:
        pixels, _, _ = load_greyscale(path, size)
    except ImageRejected as e:
        return None, str(e)
    return pixels[..., None], ""


def decoded(paths: list[Path], size: int, ahead: int,
            workers: int) -> Iterator[tuple[np.ndarray | None, str]]:
    """load() of every path, in order, by `workers` processes (here when 0), at most `ahead`
    images decoded before they are used. A process that dies (killed, out of memory) ends the
    command with one line."""
    if workers == 0:
        yield from (load(path, size) for path in paths)
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        pending: deque = deque()
        queued = iter(paths)
        for path in queued:
            pending.append(pool.submit(load, path, size))
            if len(pending) >= ahead:
                break
        while pending:
            done = pending.popleft().result()
            following = next(queued, None)
            if following is not None:
                pending.append(pool.submit(load, following, size))
            yield done
    except BrokenProcessPool:
        raise InputError("a process decoding images died (killed, or out of memory)") from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def batches(paths: list[Path], size: int, batch_size: int
            ) -> Iterator[tuple[list[int], np.ndarray, dict[int, str]]]:
    """(indices into paths, their pixels [n, size, size, 1], {index: why unreadable} of the
    paths met since the previous batch) in batches of up to batch_size readable images."""
    rows: list[int] = []
    images: list[np.ndarray] = []
    failed: dict[int, str] = {}
    # a pool's start (a second or two) pays off only beyond one batch
    workers = min(4, os.cpu_count() or 1) if len(paths) > batch_size else 0
    for i, (pixels, why) in enumerate(decoded(paths, size, 2 * batch_size, workers)):
        if pixels is None:
            failed[i] = why
            continue
        rows.append(i)
        images.append(pixels)
        if len(rows) == batch_size:
            yield rows, np.stack(images), failed
            rows, images, failed = [], [], {}
    if rows or failed:
        yield rows, (np.stack(images) if images else np.zeros((0, size, size, 1), np.uint8)), \
            failed
