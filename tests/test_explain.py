"""`chexflow predict` and `chexflow explain` on the demo's DenseNet-121 (seed 0), and the maps
and calibration its evaluation wrote: predict gives evaluate's probabilities for the test PNGs
and for DICOMs of the same pixels; each class's Grad-CAM peaks in the grid cell that class owns
in the generated data (chexflow.data.synth); the report shows the grid in Chromium."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexflow.pathologies import PATHOLOGIES
from chexflow.results import read_calibration
from tests.conftest import read_json, run_chexflow
from tests.dicoms import VARIANTS, write_dicom, write_variant
from tests.support.browser import load_in_chromium

ATOL = 1e-5
GRID = 4  # chexflow data synth: class k draws its disc in cell k of a 4 x 4 grid
DICOM_IMAGES = 6  # test images written as each DICOM variant
CACHE = Path(os.environ.get("CHEXFLOW_CACHE", Path.home() / ".cache" / "chexflow")) / "pydicom-data"
WHEEL = "pydicom-data==1.0.0"


def peak_cell(cam: np.ndarray) -> int:
    """The grid cell (row-major) holding the map's highest value."""
    y, x = np.unravel_index(int(np.argmax(cam)), cam.shape)
    return int(y * GRID // cam.shape[0]) * GRID + int(x * GRID // cam.shape[1])


@pytest.fixture(scope="session")
def real_dicom() -> Path:
    """RG1_UNCR.dcm, a real PA chest radiograph (MONOCHROME1, 15-bit), from the pydicom-data
    wheel, fetched once with `pip download --no-deps` into a cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / "RG1_UNCR.dcm"
    if not target.exists():
        wheels = sorted(CACHE.glob("pydicom_data-*.whl"))
        if not wheels:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL,
                            "-d", str(CACHE)], check=True)
            wheels = sorted(CACHE.glob("pydicom_data-*.whl"))
        with zipfile.ZipFile(wheels[-1]) as z:
            target.write_bytes(z.read("data_store/data/RG1_UNCR.dcm"))
    return target


@pytest.fixture(scope="module")
def evaluation(densenet_eval) -> dict:
    """The demo evaluation's predictions.npz: image_index, probs, labels, mask."""
    with np.load(densenet_eval / "predictions.npz") as pred:
        return {k: pred[k] for k in pred.files}


@pytest.fixture(scope="module")
def raw_images(demo_run) -> Path:
    return demo_run[2] / "synth-data-64px-seed0" / "images"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, evaluation, raw_images, real_dicom) -> dict:
    """What predict reads: the test split's PNGs; DICOMs of the first DICOM_IMAGES of them in
    every variant (one without a suffix); pairs of a 128 px PNG and a DICOM of its pixels; a
    real radiograph; files that cannot be read."""
    root = tmp_path_factory.mktemp("predict-inputs")
    (root / "png").mkdir()
    dicoms: dict[str, str] = {}
    for name in evaluation["image_index"]:
        shutil.copy(raw_images / name, root / "png" / name)
    for variant in VARIANTS:
        folder = root / "dicom" / variant
        folder.mkdir(parents=True)
        for name in evaluation["image_index"][:DICOM_IMAGES]:
            pixels = np.asarray(Image.open(raw_images / name))
            path = write_variant(folder / Path(name).with_suffix(".dcm").name, pixels, variant)
            dicoms[str(path)] = name
    suffixless = root / "dicom" / "IM0001"
    shutil.copy(next(p for p, n in dicoms.items() if "MONOCHROME1-16bit/" in p), suffixless)
    dicoms[str(suffixless)] = evaluation["image_index"][0]
    big = root / "big"
    big.mkdir()
    for name in evaluation["image_index"][:3]:
        pixels = np.asarray(Image.open(raw_images / name).resize((128, 128),
                                                                  Image.Resampling.BICUBIC))
        Image.fromarray(pixels, mode="L").save(big / name)
        write_variant(big / Path(name).with_suffix(".dcm").name, pixels, "MONOCHROME1-16bit")
    bad = root / "bad"
    bad.mkdir()
    first = (raw_images / evaluation["image_index"][0]).read_bytes()
    (bad / "truncated.png").write_bytes(first[:60])
    write_dicom(bad / "colour.dcm", np.zeros((16, 16, 3), np.uint8), "RGB", 8)
    return {"root": root, "dicoms": dicoms, "big": big, "bad": bad, "real": real_dicom,
            "missing": root / "no-such-image.png"}


@pytest.fixture(scope="module")
def predicted(inputs, densenet_run) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`chexflow predict` run once over all the inputs: (the process, the CSV's rows)."""
    root = inputs["root"]
    out = root / "out" / "predictions.csv"
    proc = run_chexflow("predict", densenet_run, root / "png", root / "dicom", inputs["big"],
                        inputs["bad"], inputs["missing"], inputs["real"], "--out", out,
                        "--batch-size", 16, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    with open(out, newline="") as f:
        return proc, list(csv.DictReader(f))


def probs_of(row: dict) -> np.ndarray:
    return np.array([float(row[c]) for c in PATHOLOGIES])


@pytest.mark.trainer
@pytest.mark.slow
def test_predict_gives_evaluates_probabilities_for_the_test_pngs(predicted, evaluation):
    _, rows = predicted
    by_name = {Path(r["image"]).name: r for r in rows if "/png/" in r["image"]}
    assert len(by_name) == len(evaluation["image_index"])
    got = np.stack([probs_of(by_name[n]) for n in evaluation["image_index"]])
    np.testing.assert_allclose(got, evaluation["probs"], atol=ATOL, rtol=0)


@pytest.mark.trainer
@pytest.mark.slow
def test_predict_gives_evaluates_probabilities_for_dicoms_of_the_same_pixels(
        predicted, inputs, evaluation):
    """MONOCHROME1 and 2, 8 and 16 bits, a rescale and a window, a VOI LUT, no suffix."""
    _, rows = predicted
    expected = dict(zip(evaluation["image_index"], evaluation["probs"], strict=True))
    seen = set()
    for row in rows:
        name = inputs["dicoms"].get(row["image"])
        if name is not None:
            assert row["error"] == "", row
            np.testing.assert_allclose(probs_of(row), expected[name], atol=ATOL, rtol=0,
                                       err_msg=row["image"])
            seen.add(row["image"])
    assert seen == set(inputs["dicoms"]) and len(seen) == len(VARIANTS) * DICOM_IMAGES + 1


@pytest.mark.trainer
@pytest.mark.slow
def test_predict_resizes_a_dicom_as_it_resizes_the_png_of_its_pixels(predicted, inputs):
    _, rows = predicted
    big = {r["image"]: probs_of(r) for r in rows if r["image"].startswith(str(inputs["big"]))}
    pngs = sorted(p for p in big if p.endswith(".png"))
    assert len(pngs) == 3
    for png in pngs:
        np.testing.assert_allclose(big[png.removesuffix(".png") + ".dcm"], big[png],
                                   atol=1e-6, rtol=0)


@pytest.mark.trainer
@pytest.mark.slow
def test_predict_reports_every_unreadable_input_in_its_own_row(predicted, inputs):
    proc, rows = predicted
    assert proc.returncode == 1  # some inputs could not be read
    errors = {Path(r["image"]).name: r["error"] for r in rows if r["error"]}
    assert set(errors) == {"truncated.png", "colour.dcm", "no-such-image.png"}
    assert "corrupt or unreadable image" in errors["truncated.png"]
    assert "PhotometricInterpretation RGB" in errors["colour.dcm"]
    assert "not found" in errors["no-such-image.png"]
    for row in rows:
        assert all(row[c] == "" for c in PATHOLOGIES) == bool(row["error"]), row
    real = next(r for r in rows if r["image"] == str(inputs["real"]))
    assert np.isfinite(probs_of(real)).all() and real["error"] == ""
    assert "3 unreadable" in proc.stdout and proc.stdout.count("predict: ") == 4
    assert "Traceback" not in proc.stderr
    # every input is a row, in the order given: the folders' files sorted, then the others
    assert len(rows) == (len(list((inputs["root"] / "png").iterdir()))
                         + len(inputs["dicoms"]) + 6 + 2 + 1 + 1)
    assert [Path(r["image"]).name for r in rows[-2:]] == ["no-such-image.png", "RG1_UNCR.dcm"]


@pytest.mark.trainer
def test_evaluation_maps_of_each_class_peak_in_its_own_cell(densenet_eval):
    """The report's grid: each class's map on the test image it is most sure of."""
    with np.load(densenet_eval / "cam.npz") as cam:
        assert list(cam["classes"]) == list(PATHOLOGIES) and cam["maps"].shape == (14, 64, 64)
        cells = [peak_cell(m.astype(np.float32)) for m in cam["maps"]]
        assert str(cam["layer"]) == "conv4_block24_concat"  # 4 x 4 cells at 64 px
    hits = [k for k, cell in enumerate(cells) if cell == k]
    assert len(hits) >= 12, f"peaks in {cells}"


@pytest.mark.trainer
@pytest.mark.slow
def test_explain_maps_of_each_class_peak_in_its_own_cell(densenet_run, evaluation, raw_images,
                                                         tmp_path):
    """`chexflow explain` on each class's highest-probability test image, as a PNG and as a
    MONOCHROME1 DICOM of the same pixels: the same maps, peaking in the class's own cell."""
    top = [str(evaluation["image_index"][i]) for i in evaluation["probs"].argmax(axis=0)]
    images = tmp_path / "images"
    images.mkdir()
    paths = []
    for k, name in enumerate(top):
        paths.append(shutil.copy(raw_images / name, images / f"{k:02d}-{name}"))
    dicom = write_variant(tmp_path / "first.dcm", np.asarray(Image.open(paths[0])),
                          "MONOCHROME1-16bit")
    out = tmp_path / "explained"
    proc = run_chexflow("explain", densenet_run, *paths, dicom, "--out", out)
    assert "layer conv4_block24_concat, 4x4 cells" in proc.stdout
    index = read_json(out / "explain.json")
    assert index["classes"] == list(PATHOLOGIES) and len(index["images"]) == 15
    for entry in index["images"]:
        with Image.open(out / entry["png"]) as png:
            assert png.format == "PNG" and png.width > 400
    with np.load(out / "maps.npz") as maps:
        m = maps["maps"].astype(np.float32)  # [image, class, 64, 64]
        probs = maps["probs"]
    assert m.shape == (15, 14, 64, 64) and m.min() >= 0 and m.max() <= 1
    cells = [peak_cell(m[k, k]) for k in range(14)]
    assert sum(cell == k for k, cell in enumerate(cells)) >= 12, f"peaks in {cells}"
    np.testing.assert_allclose(m[14], m[0], atol=1e-3)  # the DICOM: the first image's maps
    np.testing.assert_allclose(probs[:14], evaluation["probs"][evaluation["probs"].argmax(0)],
                               atol=ATOL, rtol=0)


@pytest.mark.trainer
@pytest.mark.slow
def test_explain_refuses_an_unreadable_image_or_unknown_class_before_writing(
        densenet_run, raw_images, tmp_path):
    good = next(raw_images.iterdir())
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    out = tmp_path / "out"
    proc = run_chexflow("explain", densenet_run, good, broken, "--out", out, check=False)
    assert proc.returncode == 2 and not out.exists()
    assert re.fullmatch(rf"chexflow explain: error: IMAGE {broken}: .*\n", proc.stderr)
    proc = run_chexflow("explain", densenet_run, good, "--class", "Cardiomegal", "--out", out,
                        check=False)
    assert proc.returncode == 2 and not out.exists()
    assert "--class Cardiomegal: not a class of the model" in proc.stderr


@pytest.mark.trainer
def test_evaluation_writes_calibration_and_operating_points(densenet_eval, evaluation):
    cal = read_calibration(densenet_eval)
    assert cal["split"] == "test" and cal["threshold_split"] == "val"
    assert list(cal["per_class"]) == list(PATHOLOGIES) and 0 <= cal["ece_mean"] <= 1
    labels, probs = evaluation["labels"], evaluation["probs"]
    for k, cls in enumerate(PATHOLOGIES):
        d = cal["per_class"][cls]
        assert sum(d["reliability"]["count"]) == len(probs)
        point = d["operating_point"]
        if point["threshold"] is None:
            continue
        assert point["val"]["specificity"] >= 0.9  # chosen on validation
        positives = labels[:, k] == 1
        called = probs[:, k] >= point["threshold"]  # reported on test
        assert point["sensitivity"] == pytest.approx(called[positives].mean())
        assert point["specificity"] == pytest.approx((~called[~positives]).mean())
    assert sum(d["operating_point"]["threshold"] is not None
               for d in cal["per_class"].values()) >= 12


@pytest.mark.trainer
def test_pipeline_logs_calibration_metrics_to_kfp(demo_run, densenet_eval):
    metrics = demo_run[0]["tasks"]["evaluate-op"]["artifacts"]["metrics"]["metadata"]
    cal = read_calibration(densenet_eval)
    assert metrics["ece_mean"] == pytest.approx(cal["ece_mean"])
    for cls in PATHOLOGIES:
        d = cal["per_class"][cls]
        assert metrics[f"ece_{cls}"] == pytest.approx(d["ece"])
        if d["operating_point"]["threshold"] is not None:
            assert metrics[f"threshold_{cls}"] == pytest.approx(d["operating_point"]["threshold"])
            assert metrics[f"sensitivity_{cls}"] == pytest.approx(
                d["operating_point"]["sensitivity"])


def images_in_chromium(page: Path) -> dict[str, str]:
    """Load PAGE in headless Chromium: each <img>'s id and natural size (or BROKEN)."""
    return dict(load_in_chromium(page)[0])


@pytest.mark.trainer
def test_reports_show_the_cam_grid_and_reliability_in_chromium(demo_run, densenet_eval):
    """The evaluation's report.html and the pipeline's run report."""
    for page in (densenet_eval / "report.html", Path(demo_run[0]["reports"][0])):
        text = page.read_text()
        assert "Where the model looked (Grad-CAM)" in text and "Calibration and operating" in text
        images = images_in_chromium(page)
        assert "BROKEN" not in images.values(), images
        width, height = map(int, images["cam-grid"].split("x"))
        assert width >= 1000 and height >= 500  # 4 rows of 4 (image, map) pairs
        assert int(images["reliability"].split("x")[0]) >= 1000
