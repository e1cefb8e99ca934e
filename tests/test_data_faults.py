"""Bad input to `chexflow preprocess` and `chexflow data synth`: a one-line error (exit 2, no
output left) or a rejected row with a readable reason, never a traceback or a silent result."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexflow.data.output import staging_dir
from chexflow.data.pixels import load_greyscale
from tests.conftest import CHEXFLOW, run_chexflow
from tests.test_train import _descendants
from tests.test_train_guards import _alive


@pytest.fixture(scope="module")
def synth40(tmp_path_factory) -> Path:
    """`chexflow data synth --images 40 --size 32` (NIH format)."""
    out = tmp_path_factory.mktemp("synth40") / "ds"
    run_chexflow("data", "synth", "--out", out, "--images", 40, "--size", 32)
    return out


@pytest.fixture()
def ds(synth40, tmp_path) -> Path:
    return Path(shutil.copytree(synth40, tmp_path / "ds"))


def preprocess(ds: Path, out: Path, *extra, check: bool = True):
    return run_chexflow(
        "preprocess", "--csv", ds / "Data_Entry_2017.csv", "--images", ds / "images",
        "--out", out, "--image-size", 32, "--workers", 1, *extra, check=check,
    )


def one_line_error(proc, *expected: str) -> str:
    """The run failed with exit 2 and exactly one line on stderr that holds `expected`."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.split("\n") if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("chexflow "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def rows_of(path: Path) -> list[list[str]]:
    return list(csv.reader(path.read_text().splitlines()))


def rejected(out: Path) -> list[dict]:
    with open(out / "rejected.csv") as f:
        return list(csv.DictReader(f))


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with one tiny IDAT: what Pillow's bomb guard sees."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 8))
            + chunk(b"IEND", b""))


# --- CSV encodings and containers ---

def test_csv_with_byte_order_mark_is_read_as_excel_writes_it(ds, tmp_path):
    path = ds / "Data_Entry_2017.csv"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    preprocess(ds, tmp_path / "out", "--plan-only")
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["accepted"] == 40 and m["rejected"] == 0


def test_non_utf8_csv_is_one_line_naming_the_line(ds, tmp_path):
    path = ds / "Data_Entry_2017.csv"
    lines = path.read_bytes().split(b"\n")
    lines[5] = lines[5].replace(b",PA,", b",P\xe9,").replace(b",AP,", b",A\xe9,")
    path.write_bytes(b"\n".join(lines))
    proc = preprocess(ds, tmp_path / "out", "--plan-only", check=False)
    one_line_error(proc, "Data_Entry_2017.csv: line 6: not UTF-8 text (byte 0xe9)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content, expected",
    [
        (png_header(64, 64), "line 1: not UTF-8 text (byte 0x89)"),
        (b"Image Index,Finding\x00Labels\n", "line 1: not a CSV text file (it contains NUL bytes"),
    ],
    ids=["png-bytes", "nul-bytes"],
)
def test_binary_csv_is_one_line(ds, tmp_path, content, expected):
    (ds / "Data_Entry_2017.csv").write_bytes(content)
    proc = preprocess(ds, tmp_path / "out", "--plan-only", check=False)
    one_line_error(proc, f"Data_Entry_2017.csv: {expected}")


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda gz: gz[: len(gz) // 2], "truncated: the compressed data end before"),
        (lambda gz: b"not gzip at all", "not a gzip file"),
    ],
    ids=["truncated", "not-gzip"],
)
def test_damaged_csv_gz_is_one_line(ds, tmp_path, damage, expected):
    gz = ds / "Data_Entry_2017.csv.gz"
    gz.write_bytes(damage(gzip.compress((ds / "Data_Entry_2017.csv").read_bytes())))
    proc = run_chexflow("preprocess", "--plan-only", "--csv", gz, "--images", ds / "images",
                        "--out", tmp_path / "out", check=False)
    one_line_error(proc, f"{gz}: {expected}")


# --- rows and images ---

def test_chexpert_rows_with_too_few_or_too_many_fields_are_rejected(tmp_path):
    run_chexflow("data", "synth", "--format", "chexpert", "--out", tmp_path / "cx",
                 "--images", 40, "--size", 32)
    path = tmp_path / "cx" / "CheXpert-v1.0-small" / "train.csv"
    rows = rows_of(path)
    rows[2] = rows[2][:-1]  # line 3: last label missing (was stored as 0 before)
    rows[4] = [*rows[4], "1.0"]  # line 5: one field too many
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    out = tmp_path / "out"
    run_chexflow("preprocess", "--plan-only", "--format", "chexpert", "--csv", path,
                 "--images", tmp_path / "cx", "--out", out)
    reasons = {r["source_row"]: r["reason"] for r in rejected(out)}
    assert reasons == {"3": "expected 19 fields, found 18", "5": "expected 19 fields, found 20"}
    m = json.loads((out / "manifest.json").read_text())
    assert m["accepted"] == len(rows) - 3 and m["rejected"] == 2


@pytest.mark.slow
def test_decompression_bomb_and_junk_image_are_rejected_rows_with_readable_reasons(ds, tmp_path):
    names = [r[0] for r in rows_of(ds / "Data_Entry_2017.csv")[1:]]
    (ds / "images" / names[3]).write_bytes(png_header(30000, 30000))
    (ds / "images" / names[7]).write_bytes(b"this is not an image")
    out = tmp_path / "out"
    preprocess(ds, out)
    reasons = {r["image"]: r["reason"] for r in rejected(out)}
    assert set(reasons) == {names[3], names[7]}
    assert reasons[names[3]].startswith(f"image too large to decode safely: {ds}/images/")
    assert "900000000 pixels" in reasons[names[3]]
    assert reasons[names[7]] == f"not an image Pillow can identify: {ds / 'images' / names[7]}"
    assert "<_io." not in (out / "rejected.csv").read_text()
    assert json.loads((out / "manifest.json").read_text())["accepted"] == 38


@pytest.mark.slow
def test_degenerate_image_is_a_rejected_row_not_upscaled(ds, tmp_path):
    rows = rows_of(ds / "Data_Entry_2017.csv")
    names = [r[0] for r in rows[1:]]
    assert rows[1][7:9] == ["32", "32"]  # OriginalImage[Width,Height]
    Image.new("L", (1, 1), 128).save(ds / "images" / names[0])
    Image.new("L", (16, 24), 128).save(ds / "images" / names[1])  # resized: kept
    out = tmp_path / "out"
    preprocess(ds, out)
    (row,) = rejected(out)
    assert row["image"] == names[0] and row["source_row"] == "2"
    assert row["reason"] == (f"image is 1x1 px (the CSV says 32x32), below 8 px a side: not a "
                             f"usable radiograph: {ds / 'images' / names[0]}")
    assert json.loads((out / "manifest.json").read_text())["accepted"] == 39


def test_run_that_accepts_no_row_exits_2_and_writes_nothing(ds, tmp_path):
    path = ds / "Data_Entry_2017.csv"
    rows = rows_of(path)
    for row in rows[1:]:
        row[1] = "Pneumonitis"
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    proc = preprocess(ds, tmp_path / "out", "--plan-only", check=False)
    one_line_error(proc, "no image was accepted from 40 rows", "all 40 were rejected",
                   "line 2: Finding Labels: unknown label(s) ['Pneumonitis']")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_run_whose_every_image_is_corrupt_exits_2_and_writes_nothing(ds, tmp_path):
    for png in (ds / "images").iterdir():
        data = png.read_bytes()
        png.write_bytes(data[: len(data) // 2])
    proc = preprocess(ds, tmp_path / "out", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().split("\n")[-1]
    assert "no image was accepted after reading the images: all 40 were rejected" in last
    assert "corrupt or unreadable image" in last
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))


def test_split_left_empty_exits_2(ds, tmp_path):
    """Two patients cannot fill three splits."""
    path = ds / "Data_Entry_2017.csv"
    rows = rows_of(path)
    two = [r for r in rows[1:] if r[3] in {rows[1][3], rows[-1][3]}]
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([rows[0], *two])
    proc = preprocess(ds, tmp_path / "out", "--plan-only", check=False)
    one_line_error(proc, "split is empty", "a split by patient needs more images and patients")
    assert not (tmp_path / "out").exists()


def test_small_dataset_gets_a_patient_in_every_split(ds, tmp_path):
    """20 images whose first patient has many follow-ups: every split still gets a patient."""
    path = ds / "Data_Entry_2017.csv"
    path.write_text("\n".join(path.read_text().splitlines()[:21]) + "\n")
    patients = {r[3] for r in rows_of(path)[1:]}
    for seed in range(4):
        out = tmp_path / f"out{seed}"
        preprocess(ds, out, "--plan-only", "--seed", seed)
        splits = json.loads((out / "manifest.json").read_text())["splits"]
        assert all(splits[s]["patients"] >= 1 for s in ("train", "val", "test")), splits
        assert sum(splits[s]["patients"] for s in splits) == len(patients)


def test_patient_with_different_sex_on_different_rows_is_reported(ds, tmp_path):
    path = ds / "Data_Entry_2017.csv"
    rows = rows_of(path)
    patient = next(r[3] for r in rows[1:] if sum(x[3] == r[3] for x in rows[1:]) >= 3)
    lines = [i + 1 for i, r in enumerate(rows) if r[3] == patient]
    flipped = rows[lines[-1] - 1]
    was = flipped[5]
    flipped[5] = "F" if was == "M" else "M"
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    proc = preprocess(ds, tmp_path / "out", "--plan-only")
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["accepted"] == 40  # labels are per image and the split is by patient: kept
    same = ", ".join(map(str, lines[:-1]))
    expected = (f"patient {int(patient)} has different sex on different rows "
                f"({was} on line(s) {same}; {flipped[5]} on line(s) {lines[-1]})")
    assert m["warnings"] == [expected]
    assert f"chexflow preprocess: warning: {expected}" in proc.stderr


# --- numeric options: one line each, nothing created ---

PREPROCESS_OPTIONS = [
    (("--images-per-shard", 0), "--images-per-shard 0: expected a whole number from 1"),
    (("--image-size", 0), "--image-size 0: expected a whole number from 8 to 4096"),
    (("--image-size", -5), "--image-size -5: expected a whole number from 8 to 4096"),
    (("--workers", 0), "--workers 0: expected a whole number from 1 to 256"),
    (("--seed", -1), "--seed -1: expected a whole number from 0"),
    (("--split", "70/0/30"), "--split '70/0/30': expected three positive numbers"),
    (("--split", "nan/10/20"), "--split 'nan/10/20': expected three positive numbers"),
    (("--split", "70/10/30"), "--split '70/10/30': the parts add up to 110; expected percentages"),
    (("--split", "0.7/0.1/0.1"), "--split '0.7/0.1/0.1': the parts add up to 0.9; expected"),
]
SYNTH_OPTIONS = [
    (("--images", 0), "--images 0: expected a whole number from 1"),
    (("--size", 0), "--size 0: expected a whole number of pixels from 8 to 4096"),
    (("--size", -5), "--size -5: expected a whole number of pixels from 8 to 4096"),
    (("--seed", -1), "--seed -1: expected a whole number from 0"),
    (("--min-prevalence", 2), "--min-prevalence 2.0: expected a rate from 0 to 1"),
]


def option_ids(cases) -> list[str]:
    return [" ".join(map(str, option)) for option, _ in cases]


@pytest.mark.parametrize("option, expected", PREPROCESS_OPTIONS, ids=option_ids(PREPROCESS_OPTIONS))
def test_preprocess_option_out_of_range_is_one_line(ds, tmp_path, option, expected):
    proc = preprocess(ds, tmp_path / "out", *option, check=False)
    one_line_error(proc, expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, expected", SYNTH_OPTIONS, ids=option_ids(SYNTH_OPTIONS))
def test_synth_option_out_of_range_is_one_line(tmp_path, option, expected):
    proc = run_chexflow("data", "synth", "--out", tmp_path / "ds", *option, check=False)
    one_line_error(proc, expected)
    assert not (tmp_path / "ds").exists()


def test_synth_refuses_to_replace_a_dataset(synth40, tmp_path):
    ds = Path(shutil.copytree(synth40, tmp_path / "ds"))
    before = (ds / "Data_Entry_2017.csv").read_bytes()
    proc = run_chexflow("data", "synth", "--out", ds, "--images", 10, "--seed", 3, check=False)
    one_line_error(proc, f"--out {ds}: already holds 'Data_Entry_2017.csv'")
    assert (ds / "Data_Entry_2017.csv").read_bytes() == before
    assert len(list((ds / "images").iterdir())) == 40


# --- 16-bit images: scaled by their bit depth, not as if every one spanned 16 bits ---


def _png16(path: Path, values: np.ndarray, sbit: int | None = None) -> Path:
    """A 16-bit greyscale PNG of `values`, with an sBIT chunk (after IHDR) when `sbit` is given."""
    buf = io.BytesIO()
    Image.fromarray(values.astype(np.uint16)).save(buf, format="PNG")
    data = buf.getvalue()
    if sbit is not None:
        at = 8 + 8 + 13 + 4  # signature, IHDR length/type, IHDR data, CRC
        body = b"sBIT" + bytes([sbit])
        data = data[:at] + struct.pack(">I", 1) + body + struct.pack(
            ">I", zlib.crc32(body)) + data[at:]
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("top", "sbit", "bits"), [
    (4046, None, 12),   # a DICOM-derived 12-bit image (max below 4096): 4095 is white
    (1000, 10, 10),     # the PNG says 10 significant bits: 1023 is white
    (65535, None, 16),  # values over 4095: a full 16-bit image
])
def test_wide_png_is_scaled_by_its_bit_depth(tmp_path, top, sbit, bits):
    values = np.linspace(0, top, 32 * 32).reshape(32, 32)
    path = _png16(tmp_path / "x.png", values, sbit)
    pixels, _, mode = load_greyscale(path, 32)
    assert mode.endswith(f"({bits}-bit)"), mode
    white = (1 << bits) - 1
    assert pixels.max() == round(top * 255 / white)
    assert len(np.unique(pixels)) > 200  # not sixteen grey levels
    assert pixels.min() == 0


# --- stopped by Ctrl-C or SIGTERM: one line, nothing left behind ---


@pytest.fixture(scope="module")
def slow_to_decode(tmp_path_factory) -> Path:
    """400 NIH-format rows whose images are one 4096 x 4096 PNG (16 KB of zeros, linked under
    every name): each takes a tenth of a second to decode and shrink, so a preprocess with 2
    workers decodes for seconds."""
    out = tmp_path_factory.mktemp("slow") / "ds"
    run_chexflow("data", "synth", "--out", out, "--images", 400, "--size", 32)
    big = out / "big.png"
    Image.fromarray(np.zeros((4096, 4096), np.uint8)).save(big)
    for image in (out / "images").iterdir():
        image.unlink()
        os.link(big, image)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_stop_preprocess_in_one_line_leaving_nothing(
        slow_to_decode, tmp_path, sig, status):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*CHEXFLOW, "preprocess", "--csv", str(slow_to_decode / "Data_Entry_2017.csv"),
         "--images", str(slow_to_decode / "images"), "--out", str(out), "--image-size", "32",
         "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ,
                                                             "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    tree: list[int] = []
    try:
        err = b""
        while not re.search(rb"\| +[1-9]\d*/400 ", err):  # the progress bar: images decoded
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, err.decode()[-2000:]
            err += chunk
        tree = _descendants(proc.pid)  # the decoding processes, multiprocessing's tracker
        assert len(tree) >= 2, tree
        proc.send_signal(sig)  # to `chexflow preprocess` alone, as `kill` does
        _, rest = proc.communicate(timeout=120)
        lines = (err + rest).decode().replace("\r", "\n").strip().splitlines()
        assert proc.returncode == status, lines[-20:]
        assert lines[-1] == "chexflow preprocess: interrupted"
        assert not [line for line in lines if not line.startswith("preprocess:")][:-1], lines
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in tree if _alive(p)]
        assert not out.exists() and not staging_dir(out).exists()
    finally:
        for pid in [proc.pid, *tree]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
