"""Patient-level splits: no patient appears in two splits; deterministic for a seed."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from chexflow.data import faults
from chexflow.data.records import SPLITS, DataError, Record, Rejection

NIH_LIST_FILES = ("train_val_list.txt", "test_list.txt")


def parse_fractions(text: str) -> tuple[float, float, float]:
    """'70/10/20' or '0.7/0.1/0.2' -> (0.7, 0.1, 0.2); the parts must add up to 100 or 1."""
    try:
        parts = [float(p) for p in text.split("/")]
    except ValueError:
        parts = []
    if len(parts) != 3 or not all(math.isfinite(p) and p > 0 for p in parts):
        raise DataError(
            f"--split {text!r}: expected three positive numbers like 70/10/20 "
            f"(every split needs images: train, val and test)"
        )
    total = sum(parts)
    if not any(math.isclose(total, whole, rel_tol=1e-6) for whole in (100, 1)):
        raise DataError(
            f"--split {text!r}: the parts add up to {total:g}; expected percentages that add "
            f"up to 100 (like 70/10/20) or fractions that add up to 1 (like 0.7/0.1/0.2)"
        )
    return parts[0] / total, parts[1] / total, parts[2] / total


def _by_patient(records: list[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[r.patient_id].append(r)
    return groups


def _assign(groups: dict[str, list[Record]], names: tuple[str, ...], fractions, seed: int):
    """Shuffle patients and fill each split in turn up to its share of the images.

    With as many patients as splits, no split stays empty: an empty one (a small dataset whose
    patients have many images) takes the smallest patient of the split with the most patients.
    """
    patients = sorted(groups)
    order = np.random.default_rng(seed).permutation(len(patients))
    total = sum(len(g) for g in groups.values())
    targets = np.cumsum(fractions) * total
    chosen: dict[str, list[list[Record]]] = {n: [] for n in names}
    done, k = 0, 0
    for i in order:
        group = groups[patients[i]]
        while k < len(names) - 1 and done >= targets[k] - 1e-9:
            k += 1
        chosen[names[k]].append(group)
        done += len(group)
    for name in names:
        donor = chosen[max(names, key=lambda n: len(chosen[n]))]
        if not chosen[name] and len(donor) > 1:
            smallest = min(range(len(donor)), key=lambda j: len(donor[j]))
            chosen[name].append(donor.pop(smallest))
    return {n: [r for group in chosen[n] for r in group] for n in names}


def sex_conflicts(records: list[Record]) -> list[str]:
    """Patients whose rows give different sexes, one line each (blank or unknown sex aside).

    Age legitimately changes between follow-ups; sex does not, so a conflict means a data-entry
    error or two people under one ID. The images are kept (their labels are per image and the
    split is by patient ID, so no image of the ID crosses splits) and the conflict is reported:
    the manifest lists these lines under "warnings" and the command prints them.
    """
    seen: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        sex = r.extra.get("gender", "").strip()[:1].upper()
        if sex in ("M", "F"):
            seen[r.patient_id][sex].append(r.source_row)
    lines = []
    for patient, by_sex in sorted(seen.items()):
        if len(by_sex) > 1:  # {"M": [2, 3], "F": [4]} -> "M on line(s) 2, 3; F on line(s) 4"
            rows = "; ".join(f"{sex} on line(s) {str(n)[1:-1]}" for sex, n in by_sex.items())
            lines.append(f"patient {patient} has different sex on different rows ({rows})")
    return lines


def split_random(records: list[Record], fractions, seed: int) -> dict[str, list[Record]]:
    """Split by patient into train/val/test with the given image fractions."""
    return _assign(_by_patient(records), SPLITS, fractions, seed)


def read_list(path: Path) -> list[tuple[int, str]]:
    """Non-empty lines of a split list, with their line numbers."""
    if not path.exists():
        raise DataError(f"{path}: split list not found (expected {', '.join(NIH_LIST_FILES)})")
    with faults.reported(path):
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    return [(i, s.strip()) for i, s in enumerate(lines, start=1) if s.strip()]


def split_by_lists(
    records: list[Record],
    known_names: set[str],
    lists_dir: Path,
    fractions,
    seed: int,
) -> tuple[dict[str, list[Record]], list[Rejection]]:
    """NIH's official lists: test_list.txt is test; train_val_list.txt splits into train/val
    by patient in the ratio of the first two fractions. `known_names` are all image names in
    the CSV, rejected rows included: a list naming anything else is an error."""
    train_val, test = (read_list(lists_dir / name) for name in NIH_LIST_FILES)
    for name, entries in zip(NIH_LIST_FILES, (train_val, test), strict=True):
        unknown = [(i, s) for i, s in entries if s not in known_names]
        if unknown:
            shown = ", ".join(f"line {i}: {s!r}" for i, s in unknown[:5])
            raise DataError(
                f"{lists_dir / name}: {len(unknown)} image(s) not in the CSV ({shown}"
                f"{', ...' if len(unknown) > 5 else ''})"
            )
    in_test = {s for _, s in test}
    in_train_val = {s for _, s in train_val}
    both = sorted(in_test & in_train_val)
    if both:
        raise DataError(
            f"{lists_dir}: {len(both)} image(s) in both {NIH_LIST_FILES[0]} and "
            f"{NIH_LIST_FILES[1]}, e.g. {both[:3]}"
        )
    rejections: list[Rejection] = []
    test_records, rest = [], []
    for r in records:
        if r.image_index in in_test:
            test_records.append(r)
        elif r.image_index in in_train_val:
            rest.append(r)
        else:
            rejections.append(Rejection("", r.source_row, r.image_index, "in neither split list"))
    test_patients = {r.patient_id for r in test_records}
    overlap = sorted({r.patient_id for r in rest} & test_patients)
    if overlap:
        raise DataError(
            f"{lists_dir}: {len(overlap)} patient(s) have images in both lists, e.g. {overlap[:3]}"
        )
    tv = fractions[0] + fractions[1]
    parts = _assign(
        _by_patient(rest), ("train", "val"), (fractions[0] / tv, fractions[1] / tv), seed
    )
    return {"train": parts["train"], "val": parts["val"], "test": test_records}, rejections
