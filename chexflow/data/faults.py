"""One code path for I/O and decoding faults: a readable cause, used both for a one-line error
(DataError naming the path) and for the reason of a rejected image."""

from __future__ import annotations

import csv
import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import Image

from chexflow.data.records import DataError
from chexflow.folders import os_cause

# What reading or writing a file can raise besides chexflow's own errors.
FAULTS = (
    OSError,
    UnicodeError,
    EOFError,
    zlib.error,
    csv.Error,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)


def cause(e: BaseException) -> str:
    """What went wrong, in words: no object reprs, no traceback."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{e.object[e.start]:02x}); save it as UTF-8 (CSV UTF-8)"
    if isinstance(e, EOFError):
        return "truncated: the compressed data end before the end-of-stream marker"
    if isinstance(e, zlib.error):
        return f"corrupt compressed data ({e})"
    if isinstance(e, gzip.BadGzipFile):
        return f"not a gzip file ({e})"
    if isinstance(e, OSError):
        return os_cause(e)
    return str(e) or type(e).__name__


def error(path: Path | str, e: BaseException) -> DataError:
    """A one-line DataError: the file the fault names (else `path`) and the cause."""
    where = getattr(e, "filename", None) or path
    return DataError(f"{where}: {cause(e)}")


@contextmanager
def reported(path: Path | str) -> Iterator[None]:
    """Turn any fault in the block into a one-line DataError about `path`."""
    try:
        yield
    except FAULTS as e:
        raise error(path, e) from None
