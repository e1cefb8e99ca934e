"""CheXpert `train.csv` / `valid.csv`: 14 observations with 1, 0, -1 (uncertain) or blank."""

from __future__ import annotations

import re
from pathlib import Path

from chexflow.data.csvfile import read_rows
from chexflow.data.records import DataError, Record, Rejection

CHEXPERT_CLASSES = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)
CHEXPERT_COLUMNS = ("Path", "Sex", "Age", "Frontal/Lateral", "AP/PA", *CHEXPERT_CLASSES)
PATIENT = re.compile(r"(?:^|/)patient(\d+)/")
UNCERTAIN_POLICIES = ("ones", "zeros", "ignore")  # U-Ones, U-Zeros, U-Ignore


def read_chexpert(
    csv_path: Path, images_dir: Path, uncertain: str = "ones"
) -> tuple[list[Record], list[Rejection]]:
    """Read and validate every row, mapping uncertain (-1) labels by the U-policy."""
    if uncertain not in UNCERTAIN_POLICIES:
        raise DataError(f"--uncertain {uncertain!r}: expected one of {UNCERTAIN_POLICIES}")
    records: list[Record] = []
    rejections: list[Rejection] = []
    seen: dict[str, int] = {}
    rows = read_rows(csv_path)
    _, header = next(rows, (0, None))
    if header is None:
        raise DataError(f"{csv_path}: the file is empty (expected a CheXpert header)")
    missing = [c for c in CHEXPERT_COLUMNS if c not in header]
    if missing:
        raise DataError(
            f"{csv_path}: line 1: missing CheXpert column(s) {missing}; "
            f"expected: {','.join(CHEXPERT_COLUMNS)}"
        )
    path_column = header.index("Path")
    for line, fields in rows:
        path = fields[path_column] if path_column < len(fields) else ""

        def reject(reason: str, path=path, line=line) -> None:
            rejections.append(Rejection(str(csv_path), line, path, reason))

        if len(fields) != len(header):
            reject(f"expected {len(header)} fields, found {len(fields)}")
            continue
        row = dict(zip(header, fields, strict=True))
        match = PATIENT.search(path)
        if not match:
            reject(f"Path {path!r} has no patientNNNNN folder")
            continue
        if path in seen:
            reject(f"duplicate Path (first on line {seen[path]})")
            continue
        seen[path] = line
        labels, mask, bad = [], [], None
        for cls in CHEXPERT_CLASSES:
            value = row[cls].strip()
            if value in ("", "0", "0.0"):
                labels.append(0.0)
                mask.append(1.0)
            elif value in ("1", "1.0"):
                labels.append(1.0)
                mask.append(1.0)
            elif value in ("-1", "-1.0"):
                labels.append(1.0 if uncertain == "ones" else 0.0)
                mask.append(0.0 if uncertain == "ignore" else 1.0)
            else:
                bad = f"{cls}: {value!r} is not 1, 0, -1 or blank"
                break
        if bad:
            reject(bad)
            continue
        age = row["Age"].strip()
        if not age.isdigit():
            reject(f"Age {age!r} is not a number of years")
            continue
        records.append(
            Record(
                image_index=path,
                path=images_dir / path,
                patient_id=str(int(match.group(1))),
                labels=labels,
                mask=mask,
                source_row=line,
                extra={"view": row["Frontal/Lateral"], "gender": row["Sex"], "age": age},
            )
        )
    if not records and not rejections:
        raise DataError(f"{csv_path}: the header is there but the file has no rows")
    return records, rejections
