"""NIH ChestX-ray14 `Data_Entry_2017.csv`: header check and per-row validation."""

from __future__ import annotations

import re
from pathlib import Path

from chexflow.data.csvfile import read_rows
from chexflow.data.records import DataError, Record, Rejection
from chexflow.pathologies import NO_FINDING, PATHOLOGIES

# The exact header, as CSV fields (the bracketed names contain commas and are not quoted).
# The 2017 release has a trailing comma (an extra empty column); the 2020 file does not.
NIH_COLUMNS = (
    "Image Index",
    "Finding Labels",
    "Follow-up #",
    "Patient ID",
    "Patient Age",
    "Patient Gender",
    "View Position",
    "OriginalImage[Width",
    "Height]",
    "OriginalImagePixelSpacing[x",
    "y]",
)
NIH_HEADER = ",".join(NIH_COLUMNS)
IMAGE_NAME = re.compile(r"^(\d{8})_(\d{3})\.png$")
KNOWN_LABELS = frozenset(PATHOLOGIES) | {NO_FINDING}


def check_header(path: Path, header: list[str]) -> None:
    """Raise DataError naming the missing or renamed columns."""
    fields = header[:-1] if header and header[-1] == "" else header
    if tuple(fields) == NIH_COLUMNS:
        return
    missing = [c for c in NIH_COLUMNS if c not in fields]
    unexpected = [c for c in fields if c not in NIH_COLUMNS]
    raise DataError(
        f"{path}: line 1: not an NIH Data_Entry_2017.csv header; missing column(s) {missing}, "
        f"unexpected column(s) {unexpected}; expected: {NIH_HEADER}"
    )


def read_nih(csv_path: Path, images_dir: Path) -> tuple[list[Record], list[Rejection]]:
    """Read and validate every row; rows that cannot be used come back as rejections."""
    records: list[Record] = []
    rejections: list[Rejection] = []
    seen: dict[str, int] = {}
    rows = read_rows(csv_path)
    _, header = next(rows, (0, None))
    if header is None:
        raise DataError(f"{csv_path}: the file is empty (expected the header {NIH_HEADER})")
    check_header(csv_path, header)
    width = len(header)
    for line, row in rows:

        def reject(reason: str, row=row, line=line) -> None:
            rejections.append(Rejection(str(csv_path), line, row[0], reason))

        if len(row) != width:
            reject(f"expected {width} fields, found {len(row)}")
            continue
        name, findings, follow_up, patient, age = row[0], row[1], row[2], row[3], row[4]
        match = IMAGE_NAME.match(name)
        if not match:
            reject(f"Image Index {name!r} is not of the form PPPPPPPP_FFF.png")
            continue
        if name in seen:
            reject(f"duplicate Image Index {name!r} (first on line {seen[name]})")
            continue
        seen[name] = line
        labels = [s.strip() for s in findings.split("|")]
        unknown = [s for s in labels if s not in KNOWN_LABELS]
        if unknown:
            reject(f"Finding Labels: unknown label(s) {unknown}")
            continue
        if NO_FINDING in labels and len(labels) > 1:
            reject(f"Finding Labels: {NO_FINDING!r} combined with findings {findings!r}")
            continue
        if not patient.isdigit():
            reject(f"Patient ID {patient!r} is not a number")
            continue
        if int(patient) != int(match.group(1)):
            reject(
                f"Patient ID {patient} does not match the image name's patient {match.group(1)}"
            )
            continue
        if not follow_up.isdigit():
            reject(f"Follow-up # {follow_up!r} is not a number")
            continue
        if not age.strip().isdigit():
            reject(f"Patient Age {age!r} is not a number of years")
            continue
        vector = [1.0 if p in labels else 0.0 for p in PATHOLOGIES]
        records.append(
            Record(
                image_index=name,
                path=images_dir / name,
                patient_id=str(int(patient)),
                labels=vector,
                mask=[1.0] * len(PATHOLOGIES),
                source_row=line,
                extra={"view": row[6], "gender": row[5], "age": age,
                       "original_size": f"{row[7].strip()}x{row[8].strip()}"},
            )
        )
    if not records and not rejections:
        raise DataError(f"{csv_path}: the header is there but the file has no rows")
    return records, rejections
