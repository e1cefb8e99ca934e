"""Reading a metadata CSV as Excel and the dataset publishers write it: UTF-8, with or without
a byte-order mark, gzipped or not; a file that is not such a CSV is one line naming the line."""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from pathlib import Path

from chexflow.data import faults
from chexflow.data.records import DataError


def open_text(path: Path) -> io.TextIOBase:
    """Open a CSV, gzipped or not; a leading byte-order mark is dropped (utf-8-sig)."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def first_undecodable_line(path: Path) -> int:
    """The 1-based number of the first line that is not UTF-8 (0 if every line decodes)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def read_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-empty row, the header included."""
    reader = None
    try:
        with open_text(path) as f:
            reader = csv.reader(f)
            for row in reader:
                if any("\x00" in field for field in row):
                    raise csv.Error("it contains NUL bytes, as a binary file does")
                if row:
                    yield reader.line_num, row
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: line {first_undecodable_line(path)}: {faults.cause(e)}") from None
    except csv.Error as e:
        line = reader.line_num if reader else 1
        raise DataError(f"{path}: line {line}: not a CSV text file ({e})") from None
    except faults.FAULTS as e:
        raise faults.error(path, e) from None
