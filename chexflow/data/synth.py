"""Generated datasets in the real NIH and CheXpert formats, with a learnable signal.

Each class owns one cell of a 4x4 grid over the image; a positive label draws a bright disc
in that cell (jittered), on a chest-like background with noise. A correct model can therefore
reach a high AUROC, and a model trained on shuffled labels cannot. The background is mirror-
symmetric, so a horizontal flip moves a disc into another class's cell: train on these images
without flip augmentation. Label prevalences follow
NIH's published counts (floored at `min_prevalence` so small datasets have positives for every
class); patients have several follow-ups.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from chexflow.data import faults
from chexflow.data.chexpert import CHEXPERT_CLASSES, CHEXPERT_COLUMNS
from chexflow.data.nih import NIH_HEADER
from chexflow.data.output import StagedOutput
from chexflow.data.records import DataError
from chexflow.pathologies import NO_FINDING, PATHOLOGIES

# NIH ChestX-ray14 label counts over its 112,120 images (Data_Entry_2017).
NIH_COUNTS = {
    "Atelectasis": 11559,
    "Cardiomegaly": 2776,
    "Effusion": 13317,
    "Infiltration": 19894,
    "Mass": 5782,
    "Nodule": 6331,
    "Pneumonia": 1431,
    "Pneumothorax": 5302,
    "Consolidation": 4667,
    "Edema": 2303,
    "Emphysema": 2516,
    "Fibrosis": 1686,
    "Pleural_Thickening": 3385,
    "Hernia": 227,
}
NIH_IMAGES = 112_120
NIH_IMAGES_PER_PATIENT = NIH_IMAGES / 30_805
# What each format writes into --out.
SYNTH_ENTRIES = {"nih": ("Data_Entry_2017.csv", "images"), "chexpert": ("CheXpert-v1.0-small",)}


def render(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """A greyscale uint8 image whose class-k cell holds a disc when labels[k] is 1."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    # two dark "lung fields" on a brighter mediastinum/body, as on a PA film
    body = 0.55 + 0.15 * np.cos((xx - 0.5) * np.pi)
    for cx in (0.3, 0.7):
        body -= 0.25 * np.exp(-(((xx - cx) / 0.17) ** 2 + ((yy - 0.5) / 0.3) ** 2))
    img = body + rng.normal(0.0, 0.06, (size, size))
    cell = size / 4
    radius = cell / 3
    for k in np.flatnonzero(labels):
        cy = (k // 4 + 0.5) * cell + rng.uniform(-cell / 8, cell / 8)
        cx = (k % 4 + 0.5) * cell + rng.uniform(-cell / 8, cell / 8)
        disc = ((yy * size - cy) ** 2 + (xx * size - cx) ** 2) <= radius**2
        img[disc] += rng.uniform(0.25, 0.4)
    return (np.clip(img, 0.0, 1.0) * 255).astype(np.uint8)


def prevalences(classes: tuple[str, ...], min_prevalence: float) -> np.ndarray:
    """Per-class positive rates shaped like NIH's, floored at min_prevalence."""
    base = [NIH_COUNTS.get(c, 0.05 * NIH_IMAGES) / NIH_IMAGES for c in classes]
    return np.maximum(np.array(base), min_prevalence)


def _patients(n_images: int, rng: np.random.Generator) -> list[int]:
    """Follow-up counts per patient (geometric, NIH's mean), summing to n_images."""
    counts = []
    while sum(counts) < n_images:
        counts.append(int(rng.geometric(1 / NIH_IMAGES_PER_PATIENT)))
    counts[-1] -= sum(counts) - n_images
    return [c for c in counts if c > 0]


def synth_nih(out: Path, images: int, size: int, seed: int, min_prevalence: float = 0.05) -> Path:
    """Write Data_Entry_2017.csv (the exact 2017 header, trailing comma) and images/*.png."""
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    p = prevalences(PATHOLOGIES, min_prevalence)
    csv_path = out / "Data_Entry_2017.csv"
    with (
        open(csv_path, "w", newline="") as f,
        tqdm(total=images, desc="synth nih", unit="img") as bar,
    ):
        f.write(NIH_HEADER + ",\n")
        writer = csv.writer(f, lineterminator="\n")
        for patient, follow_ups in enumerate(_patients(images, rng), start=1):
            age = int(np.clip(rng.normal(47, 17), 1, 95))
            gender = "M" if rng.random() < 0.56 else "F"
            for fu in range(follow_ups):
                labels = (rng.random(len(PATHOLOGIES)) < p).astype(np.float32)
                name = f"{patient:08d}_{fu:03d}.png"
                Image.fromarray(render(labels, size, rng), mode="L").save(out / "images" / name)
                findings = "|".join(c for c, y in zip(PATHOLOGIES, labels, strict=True) if y)
                view = "PA" if rng.random() < 0.6 else "AP"
                writer.writerow(
                    [
                        name,
                        findings or NO_FINDING,
                        fu,
                        patient,
                        min(age + fu // 4, 95),
                        gender,
                        view,
                        size,
                        size,
                        0.143,
                        0.143,
                        "",
                    ]
                )
                bar.update()
    return csv_path


def synth_chexpert(
    out: Path, images: int, size: int, seed: int, min_prevalence: float = 0.05
) -> Path:
    """Write CheXpert-v1.0-small/{train,valid}.csv and JPEG images (valid: ~5% of patients)."""
    rng = np.random.default_rng(seed)
    root = out / "CheXpert-v1.0-small"
    root.mkdir(parents=True, exist_ok=True)
    findings = CHEXPERT_CLASSES[1:]  # "No Finding" is derived
    p = prevalences(findings, min_prevalence)
    files = {name: open(root / f"{name}.csv", "w", newline="") for name in ("train", "valid")}  # noqa: SIM115
    writers = {name: csv.writer(f, lineterminator="\n") for name, f in files.items()}
    for w in writers.values():
        w.writerow(CHEXPERT_COLUMNS)
    with tqdm(total=images, desc="synth chexpert", unit="img") as bar:
        for patient, studies in enumerate(_patients(images, rng), start=1):
            split = "valid" if rng.random() < 0.05 else "train"
            sex = "Male" if rng.random() < 0.56 else "Female"
            age = int(np.clip(rng.normal(60, 17), 18, 90))
            for study in range(1, studies + 1):
                labels = (rng.random(len(findings)) < p).astype(np.float32)
                rel = (
                    f"CheXpert-v1.0-small/{split}/patient{patient:05d}/study{study}/"
                    "view1_frontal.jpg"
                )
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                full = np.concatenate([[0.0 if labels.any() else 1.0], labels])
                Image.fromarray(render(full, size, rng), mode="L").save(out / rel, quality=95)
                values = []
                for y in full:
                    draw = rng.random()
                    if split == "train" and draw < 0.08:
                        values.append("-1.0")  # uncertain
                    elif y:
                        values.append("1.0")
                    else:
                        values.append("0.0" if draw < 0.3 else "")
                frontal_ap = "AP" if rng.random() < 0.6 else "PA"
                writers[split].writerow([rel, sex, age, "Frontal", frontal_ap, *values])
                bar.update()
    for f in files.values():
        f.close()
    return root / "train.csv"


def check_free(out: Path, fmt: str) -> None:
    """Refuse an --out that already holds what this format writes (nothing is replaced)."""
    taken = [name for name in SYNTH_ENTRIES[fmt] if (out / name).exists()]
    if taken:
        raise DataError(f"--out {out}: already holds {taken[0]!r}; choose another folder")


def synth(fmt: str, out: Path, images: int, size: int, seed: int, min_prevalence: float) -> Path:
    """Write a generated dataset into OUT (staged, swapped in when complete); return its CSV."""
    checks = (
        ("--images", images, 1 <= images <= 10_000_000, "a whole number from 1 to 10000000"),
        ("--size", size, 8 <= size <= 4096, "a whole number of pixels from 8 to 4096"),
        ("--seed", seed, 0 <= seed < 2**32, "a whole number from 0 to 4294967295"),
        ("--min-prevalence", min_prevalence, 0 <= min_prevalence <= 1, "a rate from 0 to 1"),
    )
    for flag, value, ok, expected in checks:
        if not ok:
            raise DataError(f"{flag} {value}: expected {expected}")
    check_free(out, fmt)
    with StagedOutput(out, "data synth") as stage:
        check_free(out, fmt)
        make = synth_nih if fmt == "nih" else synth_chexpert
        with faults.reported(stage.dir):
            csv_path = make(stage.dir, images, size, seed, min_prevalence)
        stage.commit([])
    return out / csv_path.relative_to(stage.dir)
