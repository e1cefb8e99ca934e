"""Synth -> preprocess on generated NIH/CheXpert data: outputs, splits, every kind of bad input."""

from __future__ import annotations

import csv
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexflow.envs import trainer_python
from chexflow.pathologies import PATHOLOGIES
from tests.conftest import read_json, run_chexflow


def rejected(out: Path) -> list[dict]:
    with open(out / "rejected.csv") as f:
        return list(csv.DictReader(f))


def copy_dataset(src: Path, dst: Path, rows: int = 60) -> Path:
    """The first `rows` rows of a generated NIH dataset, with their images."""
    (dst / "images").mkdir(parents=True)
    lines = (src / "Data_Entry_2017.csv").read_text().splitlines()[: rows + 1]
    (dst / "Data_Entry_2017.csv").write_text("\n".join(lines) + "\n")
    for line in lines[1:]:
        name = line.split(",")[0]
        shutil.copy(src / "images" / name, dst / "images" / name)
    return dst


def preprocess(ds: Path, out: Path, *extra, check=True):
    return run_chexflow(
        "preprocess", "--csv", ds / "Data_Entry_2017.csv", "--images", ds / "images",
        "--out", out, "--image-size", 32, "--workers", 1, *extra, check=check,
    )


def edit_csv(ds: Path, fn) -> None:
    path = ds / "Data_Entry_2017.csv"
    rows = list(csv.reader(path.open()))
    fn(rows)
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def test_synth_writes_the_nih_format(nih_raw):
    lines = (nih_raw / "Data_Entry_2017.csv").read_text().splitlines()
    assert lines[0] == (
        "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,"
        "View Position,OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y],"
    )
    rows = list(csv.reader(lines[1:]))
    assert len(rows) == 400
    names = [r[0] for r in rows]
    assert all((nih_raw / "images" / n).exists() for n in names)
    assert all(n[:8] == f"{int(r[3]):08d}" and n[9:12] == f"{int(r[2]):03d}"
               for n, r in zip(names, rows, strict=True))
    patients = {r[3] for r in rows}
    assert len(patients) < 400 / 2  # several follow-ups per patient
    labels = [set(r[1].split("|")) for r in rows]
    assert any(len(s) > 1 for s in labels)  # multi-label rows
    assert 0.2 < sum(s == {"No Finding"} for s in labels) / 400 < 0.8
    freq = {c: sum(c in s for s in labels) for c in PATHOLOGIES}
    assert freq["Infiltration"] > freq["Hernia"]  # NIH's shape: Infiltration most common
    img = Image.open(nih_raw / "images" / names[0])
    assert img.mode == "L" and img.size == (64, 64)


def test_generated_signal_marks_each_pathology(nih_raw):
    """The class-k grid cell is brighter exactly when label k is present."""
    rows = list(csv.reader((nih_raw / "Data_Entry_2017.csv").read_text().splitlines()[1:]))
    cell = 16
    for k, name in enumerate(PATHOLOGIES):
        on, off = [], []
        for r in rows:
            px = np.asarray(Image.open(nih_raw / "images" / r[0]), dtype=np.float32)
            y, x = (k // 4) * cell, (k % 4) * cell
            value = px[y + 5:y + 11, x + 5:x + 11].mean()
            (on if name in r[1].split("|") else off).append(value)
        assert on and np.mean(on) > np.mean(off) + 40, name


@pytest.mark.slow
def test_preprocess_writes_shards_manifest_and_readable_examples(nih_raw, nih_tfrecords):
    m = read_json(nih_tfrecords / "manifest.json")
    assert m["classes"] == list(PATHOLOGIES) and m["image_size"] == 64
    assert m["accepted"] == 400 and m["rejected"] == 0 and m["patient_overlap"] == 0
    assert {r["split"] for r in csv.DictReader((nih_tfrecords / "splits.csv").open())} == {
        "train", "val", "test"}
    for split in ("train", "val", "test"):
        s = m["splits"][split]
        assert s["images"] == sum(sh["images"] for sh in s["shards"]) > 0
        assert all((nih_tfrecords / sh["path"]).stat().st_size > 0 for sh in s["shards"])
        assert len(s["images_sha256"]) == 64
    assert m["inputs"]["csv"]["sha256"]
    # decode every example with TensorFlow (trainer environment) and compare to the source PNGs
    script = f"""
import json, numpy as np, tensorflow as tf
from PIL import Image
m = json.load(open("{nih_tfrecords}/manifest.json"))
files = ["{nih_tfrecords}/" + sh["path"] for s in m["splits"].values() for sh in s["shards"]]
n = 0
for raw in tf.data.TFRecordDataset(files):
    ex = tf.train.Example.FromString(raw.numpy()).features.feature
    h, w = ex["height"].int64_list.value[0], ex["width"].int64_list.value[0]
    px = np.frombuffer(ex["image"].bytes_list.value[0], np.uint8).reshape(h, w)
    name = ex["image_index"].bytes_list.value[0].decode()
    src = np.asarray(Image.open("{nih_raw}/images/" + name))
    assert (px == src).all(), name
    assert len(ex["labels"].float_list.value) == 14 and set(ex["mask"].float_list.value) == {{1.0}}
    n += 1
print(n)
"""
    proc = subprocess.run([str(trainer_python()), "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "400"


def test_split_lists_are_honoured(nih_raw, tmp_path):
    ds = copy_dataset(nih_raw, tmp_path / "ds", rows=80)
    rows = list(csv.reader((ds / "Data_Entry_2017.csv").read_text().splitlines()[1:]))
    patients = sorted({r[3] for r in rows}, key=int)
    test_patients = set(patients[: len(patients) // 4])
    lists = tmp_path / "lists"
    lists.mkdir()
    test_names = [r[0] for r in rows if r[3] in test_patients]
    other = [r[0] for r in rows if r[3] not in test_patients]
    (lists / "test_list.txt").write_text("\n".join(test_names) + "\n")
    (lists / "train_val_list.txt").write_text("\n".join(other[:-2]) + "\n")  # 2 in no list
    preprocess(ds, tmp_path / "out", "--split-lists", lists, "--plan-only")
    split_of = {r["image_index"]: r["split"]
                for r in csv.DictReader((tmp_path / "out" / "splits.csv").open())}
    assert all(split_of[n] == "test" for n in test_names)
    assert all(split_of[n] in ("train", "val") for n in other[:-2])
    rej = rejected(tmp_path / "out")
    assert {r["image"] for r in rej} == set(other[-2:])
    assert all(r["reason"] == "in neither split list" for r in rej)


@pytest.mark.slow
def test_chexpert_synth_and_preprocess(tmp_path):
    run_chexflow("data", "synth", "--format", "chexpert", "--out", tmp_path / "cx",
                 "--images", 60, "--size", 48, "--seed", 2)
    out = tmp_path / "out"
    run_chexflow("preprocess", "--format", "chexpert", "--csv",
                 tmp_path / "cx/CheXpert-v1.0-small/train.csv", "--images", tmp_path / "cx",
                 "--out", out, "--image-size", 32, "--uncertain", "ignore", "--workers", 1)
    m = read_json(out / "manifest.json")
    assert m["classes"][0] == "No Finding" and len(m["classes"]) == 14
    assert m["accepted"] > 0 and m["rejected"] == 0 and m["uncertain_policy"] == "ignore"


@pytest.mark.slow
def test_never_overwrites_without_flag(nih_raw, tmp_path):
    ds = copy_dataset(nih_raw, tmp_path / "ds", rows=20)
    out = tmp_path / "out"
    preprocess(ds, out)
    first = (out / "manifest.json").read_text()
    proc = preprocess(ds, out, check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr and "--overwrite" in proc.stderr
    assert (out / "manifest.json").read_text() == first
    (out / "notes.txt").write_text("mine")
    proc = preprocess(ds, out, "--overwrite", check=False)
    assert proc.returncode == 2 and "notes.txt" in proc.stderr
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    preprocess(ds, out, "--overwrite", "--seed", 5)
    assert read_json(out / "manifest.json")["split"]["seed"] == 5


# --- bad input: each is either a clear error naming file/row/field, or a rejected.csv row ---

@pytest.fixture()
def small(nih_raw, tmp_path) -> Path:
    return copy_dataset(nih_raw, tmp_path / "ds", rows=30)


def error_of(small, tmp_path, *extra) -> str:
    proc = preprocess(small, tmp_path / "out", *extra, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def only_rejection(small: Path, tmp_path: Path) -> dict:
    preprocess(small, tmp_path / "out")
    rej = rejected(tmp_path / "out")
    assert len(rej) == 1, rej
    m = read_json(tmp_path / "out" / "manifest.json")
    assert m["accepted"] + m["rejected"] == 30
    return rej[0]


def test_bad_missing_column(small, tmp_path):
    edit_csv(small, lambda rows: rows[0].__setitem__(4, "Age"))
    err = error_of(small, tmp_path)
    assert "Data_Entry_2017.csv: line 1" in err and "Patient Age" in err and "'Age'" in err


def test_bad_empty_csv(small, tmp_path):
    (small / "Data_Entry_2017.csv").write_text("")
    assert "Data_Entry_2017.csv: the file is empty" in error_of(small, tmp_path)


def test_bad_header_only(small, tmp_path):
    path = small / "Data_Entry_2017.csv"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    assert "has no rows" in error_of(small, tmp_path)


def test_bad_missing_csv(small, tmp_path):
    (small / "Data_Entry_2017.csv").unlink()
    err = error_of(small, tmp_path)
    assert "--csv" in err and "Data_Entry_2017.csv: file not found" in err


@pytest.mark.slow
def test_bad_unknown_label(small, tmp_path):
    edit_csv(small, lambda rows: rows[3].__setitem__(1, "Effusion|Pneumonitis"))
    r = only_rejection(small, tmp_path)
    assert r["source_row"] == "4" and "unknown label" in r["reason"]
    assert "Pneumonitis" in r["reason"]


@pytest.mark.slow
def test_bad_duplicate_image_index(small, tmp_path):
    edit_csv(small, lambda rows: rows.append(list(rows[2])))
    preprocess(small, tmp_path / "out")
    rej = rejected(tmp_path / "out")
    assert len(rej) == 1 and "duplicate Image Index" in rej[0]["reason"]
    assert "first on line 3" in rej[0]["reason"] and rej[0]["source_row"] == "32"


@pytest.mark.slow
def test_bad_patient_id_not_matching_file_name(small, tmp_path):
    edit_csv(small, lambda rows: rows[5].__setitem__(3, "99999"))
    r = only_rejection(small, tmp_path)
    assert r["source_row"] == "6" and "does not match the image name" in r["reason"]


@pytest.mark.slow
def test_bad_non_numeric_age(small, tmp_path):
    edit_csv(small, lambda rows: rows[7].__setitem__(4, "58Y"))
    r = only_rejection(small, tmp_path)
    assert r["source_row"] == "8" and "Patient Age" in r["reason"] and "58Y" in r["reason"]


@pytest.mark.slow
def test_bad_missing_image_file(small, tmp_path):
    name = (small / "Data_Entry_2017.csv").read_text().splitlines()[9].split(",")[0]
    (small / "images" / name).unlink()
    r = only_rejection(small, tmp_path)
    assert r["image"] == name and r["source_row"] == "10" and "not found" in r["reason"]


@pytest.mark.slow
def test_bad_corrupt_png(small, tmp_path):
    name = (small / "Data_Entry_2017.csv").read_text().splitlines()[11].split(",")[0]
    data = (small / "images" / name).read_bytes()
    (small / "images" / name).write_bytes(data[: len(data) // 2])
    r = only_rejection(small, tmp_path)
    assert r["image"] == name and "corrupt" in r["reason"]


@pytest.mark.slow
def test_rgba_and_16_bit_images_are_converted_not_dropped(small, tmp_path):
    names = [line.split(",")[0] for line in
             (small / "Data_Entry_2017.csv").read_text().splitlines()[1:3]]
    grey = np.asarray(Image.open(small / "images" / names[0]))
    Image.fromarray(np.stack([grey] * 3 + [np.full_like(grey, 255)], -1), "RGBA").save(
        small / "images" / names[0])
    wide = np.asarray(Image.open(small / "images" / names[1])).astype(np.uint16) * 257
    Image.fromarray(wide).save(small / "images" / names[1])
    preprocess(small, tmp_path / "out")
    m = read_json(tmp_path / "out" / "manifest.json")
    assert m["accepted"] == 30 and m["rejected"] == 0
    converted = m["converted_images"]
    assert converted.pop("RGBA") == 1
    assert list(converted.values()) == [1] and list(converted)[0] in ("I;16 (16-bit)", "I (16-bit)")


def test_bad_split_list_naming_unknown_images(small, tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    names = [line.split(",")[0] for line in
             (small / "Data_Entry_2017.csv").read_text().splitlines()[1:]]
    (lists / "train_val_list.txt").write_text("\n".join(names[:20]) + "\n")
    (lists / "test_list.txt").write_text("\n".join([*names[20:], "99999999_000.png"]) + "\n")
    err = error_of(small, tmp_path, "--split-lists", lists)
    assert "test_list.txt" in err and "line 11" in err and "99999999_000.png" in err


@pytest.mark.slow
def test_bad_wrong_field_count_and_split_spec(small, tmp_path):
    edit_csv(small, lambda rows: rows[4].pop())
    r = only_rejection(small, tmp_path)
    assert r["source_row"] == "5" and "fields" in r["reason"]
    assert "--split" in error_of(small, tmp_path / "x", "--split", "70/30")
