"""Evaluation under bad input (issue 18): numeric options range-checked in one line, a model
refused on data with other class names or another image size (from the model's run record),
one evaluation per --out folder, no evaluation of a split without images, and a model file
Keras cannot load named in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from chexflow.data.manifest import Manifest
from chexflow.envs import trainer_python, with_chexflow_importable
from chexflow.evaluate.record import ModelMismatch, check_model_fits
from chexflow.runlock import acquire
from chexflow.train.rundir import model_info
from tests.conftest import read_json, run_chexflow


@pytest.mark.parametrize(("argv", "message"), [
    (("--batch-size", "0"), "--batch-size 0: must be >= 1"),
    (("--bootstrap", "-1"), "--bootstrap -1: must be >= 0"),
    (("--seed", "-2"), "--seed -2: must be in [0, 4294967295]"),
])
def test_evaluate_numeric_option_out_of_range_is_refused(tmp_path, argv, message):
    proc = run_chexflow("evaluate", "--data", tmp_path, "--model", tmp_path, "--out",
                        tmp_path / "ev", *argv, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"chexflow evaluate: error: {message}"]
    assert not (tmp_path / "ev").exists()


# ---------------------------------------------------------------- a tiny real model (trainer env)


def _preprocess(raw: Path, out: Path, size: int, fmt: str = "nih") -> Path:
    csv = raw / ("Data_Entry_2017.csv" if fmt == "nih" else "CheXpert-v1.0-small/train.csv")
    images = raw / "images" if fmt == "nih" else raw
    run_chexflow("preprocess", "--format", fmt, "--csv", csv, "--images", images, "--out", out,
                 "--image-size", size, "--workers", 1, "--images-per-shard", 16)
    return out


@pytest.fixture(scope="module")
def nih32(tmp_path_factory) -> Path:
    """40 NIH-format images preprocessed at 32 px."""
    root = tmp_path_factory.mktemp("nih32")
    run_chexflow("data", "synth", "--out", root / "raw", "--images", 40, "--size", 32)
    return _preprocess(root / "raw", root / "data", 32)


@pytest.fixture(scope="module")
def tiny_run(nih32: Path, tmp_path_factory) -> Path:
    """ResNet-50 trained for 2 steps on nih32 (a real run folder: run.json, best_model.keras)."""
    out = tmp_path_factory.mktemp("tiny") / "run"
    run_chexflow("train", "--data", nih32, "--out", out, "--model", "resnet50", "--epochs", 1,
                 "--steps-per-epoch", 2, "--batch-size", 4, "--image-size", 32,
                 "--warmup-steps", 0, "--threads", 1)
    return out


def _evaluate(data: Path, model: Path, out: Path):
    return run_chexflow("evaluate", "--data", data, "--model", model, "--out", out,
                        "--bootstrap", 20, check=False)


@pytest.mark.trainer
@pytest.mark.slow
def test_nih_model_refused_on_chexpert_data(tiny_run, tmp_path):
    run_chexflow("data", "synth", "--format", "chexpert", "--out", tmp_path / "cx",
                 "--images", 40, "--size", 32)
    chexpert = _preprocess(tmp_path / "cx", tmp_path / "cx32", 32, "chexpert")
    # both have 14 classes at 32 px: only the names tell them apart
    assert len(read_json(chexpert / "manifest.json")["classes"]) == 14
    proc = _evaluate(chexpert, tiny_run / "best_model.keras", tmp_path / "ev")
    assert proc.returncode == 2, proc.stdout[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line == (
        f"chexflow evaluate: error: --model {tiny_run / 'best_model.keras'} was trained on "
        f"other classes than the data's (run record {tiny_run / 'run.json'}: class 1 is "
        f"'Atelectasis' there and 'No Finding' in {chexpert}/manifest.json); evaluate it on "
        f"data preprocessed from the same dataset format")
    assert not (tmp_path / "ev").exists()


@pytest.mark.trainer
@pytest.mark.slow
def test_model_refused_on_data_of_another_image_size_from_its_run_record(
        tiny_run, nih32, tmp_path):
    other = _preprocess(nih32.parent / "raw", tmp_path / "d48", 48)
    proc = _evaluate(other, tiny_run, tmp_path / "ev")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"chexflow evaluate: error: --model {tiny_run} takes 32 px images (run record "
        f"{tiny_run / 'run.json'}); {other}/manifest.json has 48 px images: preprocess with "
        f"--image-size 32"]


@pytest.mark.trainer
@pytest.mark.slow
def test_second_evaluation_into_a_locked_out_is_refused(tiny_run, nih32, tmp_path):
    out = tmp_path / "ev"
    out.mkdir()
    fd = acquire(out, "evaluate (held by this test)")
    try:
        proc = _evaluate(nih32, tiny_run, out)
    finally:
        os.close(fd)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"chexflow evaluate: error: {out}: in use by PID {os.getpid()} (chexflow evaluate (held "
        f"by this test)); wait for it to finish or choose another folder"]
    assert not (out / "auroc.json").exists()
    _evaluate(nih32, tiny_run, out).check_returncode()  # released: it runs
    assert read_json(out / "auroc.json")["images"] == read_json(
        nih32 / "manifest.json")["splits"]["test"]["images"]


def _without_images(data: Path, split: str, tmp_path: Path) -> Path:
    """A copy of `data` whose manifest lists one empty shard for `split` (as a manifest from
    elsewhere may): its other splits are intact."""
    copy = tmp_path / f"no-{split}"
    shutil.copytree(data, copy)
    manifest = read_json(copy / "manifest.json")
    (copy / split / "empty.tfrecord").write_bytes(b"")
    manifest["splits"][split].update(images=0, shards=[
        {"path": f"{split}/empty.tfrecord", "images": 0}])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.trainer
@pytest.mark.slow
def test_split_without_images_is_refused_by_evaluate_and_train(tiny_run, nih32, tmp_path):
    data = _without_images(nih32, "test", tmp_path)
    proc = _evaluate(data, tiny_run, tmp_path / "ev")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"chexflow evaluate: error: {data}/manifest.json: split 'test' has no images; nothing "
        f"to evaluate"]
    assert not (tmp_path / "ev").exists()
    data = _without_images(nih32, "train", tmp_path)
    proc = run_chexflow("train", "--data", data, "--out", tmp_path / "run", "--image-size", 32,
                        check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"chexflow train: error: {data}/manifest.json: split 'train' has no images; nothing to "
        f"train on"]
    assert not (tmp_path / "run").exists()


def _record(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps({"model": "resnet50", "image_size": 32, **fields}))
    return folder / "best_model.keras"


def test_run_record_check_names_order_count_and_older_records(tmp_path):
    data = Manifest(tmp_path / "d", ("a", "b", "c"), 32, {}, {})
    check_model_fits(_record(tmp_path / "same", classes=["a", "b", "c"]), data)
    check_model_fits(tmp_path / "no-record" / "model.keras", data)  # shape checks only
    with pytest.raises(ModelMismatch, match=r"class 1 is 'b' there and 'a' in .*/d/manifest"
                                            r"\.json \(the same names in another order\)"):
        check_model_fits(_record(tmp_path / "order", classes=["b", "a", "c"]), data)
    with pytest.raises(ModelMismatch, match=r"2 classes there, 3 in .*/d/manifest\.json"):
        check_model_fits(_record(tmp_path / "fewer", classes=["a", "b"]), data)
    # a record written before runs kept their classes: the classes of the data it names
    older = tmp_path / "older-data"
    older.mkdir()
    (older / "manifest.json").write_text(json.dumps({
        "classes": ["x", "b", "c"], "image_size": 32,
        "splits": {s: {"shards": []} for s in ("train", "val", "test")}}))
    with pytest.raises(ModelMismatch, match="class 1 is 'x' there and 'a' in"):
        check_model_fits(_record(tmp_path / "older", data=str(older)), data)


NAN_MODEL = """
import sys
import numpy as np
from chexflow.train.models import load_model
model = load_model(sys.argv[1])
weights, bias = model.get_layer("probs").get_weights()
model.get_layer("probs").set_weights([weights * np.nan, bias])
model.save(sys.argv[2])
"""


def _nan_model(run: Path, folder: Path) -> Path:
    """A copy of the run's model whose output layer has NaN weights (a diverged model)."""
    folder.mkdir()
    path = folder / "best_model.keras"
    subprocess.run([str(trainer_python()), "-c", NAN_MODEL, str(run / "best_model.keras"),
                    str(path)], check=True, capture_output=True, timeout=300,
                   env={**with_chexflow_importable(os.environ), "TF_CPP_MIN_LOG_LEVEL": "2"})
    return path


@pytest.mark.trainer
@pytest.mark.slow
def test_model_predicting_nan_is_one_line_and_keeps_the_earlier_evaluation(
        tiny_run, nih32, tmp_path):
    out = tmp_path / "ev"
    _evaluate(nih32, tiny_run, out).check_returncode()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"auroc.json", "roc.png", "report.html", "predictions.npz",
                           "calibration.json", "reliability.png", "cam.png", "cam.npz"}
    nan = _nan_model(tiny_run, tmp_path / "nan")
    proc = run_chexflow("evaluate", "--data", nih32, "--model", nan, "--out", out,
                        "--bootstrap", 20, "--overwrite", check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    test_images = read_json(nih32 / "manifest.json")["splits"]["test"]["images"]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1:] == [  # after the progress bar
        f"chexflow evaluate: error: --model {nan}: predicts NaN or infinite probabilities for "
        f"{test_images} of {test_images} images of the test split (its training diverged); no "
        f"AUROC computed, --out left as it was"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev", "nan"]  # no staging folder
    # and a good model replaces the evaluation whole
    _evaluate_over = run_chexflow("evaluate", "--data", nih32, "--model", tiny_run, "--out", out,
                                  "--bootstrap", 30, "--overwrite")
    assert _evaluate_over.returncode == 0
    assert read_json(out / "auroc.json")["bootstrap"]["resamples"] == 30


@pytest.mark.trainer
@pytest.mark.slow
def test_bare_model_file_carries_its_classes_and_another_order_is_refused(
        tiny_run, nih32, tmp_path):
    bare = tmp_path / "copied-alone.keras"  # no run.json beside it
    shutil.copy(tiny_run / "best_model.keras", bare)
    classes = read_json(nih32 / "manifest.json")["classes"]
    assert model_info(bare) == {"classes": classes, "image_size": 32}
    swapped = Path(shutil.copytree(nih32, tmp_path / "swapped"))
    manifest = read_json(swapped / "manifest.json")
    manifest["classes"][0], manifest["classes"][1] = classes[1], classes[0]
    (swapped / "manifest.json").write_text(json.dumps(manifest))
    proc = _evaluate(swapped, bare, tmp_path / "ev")
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"chexflow evaluate: error: --model {bare} was trained on other classes than the data's "
        f"(the classes and size stored in {bare}: class 1 is {classes[0]!r} there and "
        f"{classes[1]!r} in {swapped}/manifest.json (the same names in another order)); "
        f"evaluate it on data preprocessed from the same dataset format"]
    assert not (tmp_path / "ev").exists()
    _evaluate(nih32, bare, tmp_path / "ev").check_returncode()  # Keras loads it as before


@pytest.mark.trainer
@pytest.mark.slow
def test_keras_file_without_its_weights_is_one_line(tiny_run, nih32, tmp_path):
    broken = tmp_path / "broken.keras"  # a zip Keras wrote, less its weights member
    with zipfile.ZipFile(tiny_run / "best_model.keras") as zin, \
            zipfile.ZipFile(broken, "w") as zout:
        for member in zin.infolist():
            if member.filename != "model.weights.h5":
                zout.writestr(member, zin.read(member))
    proc = _evaluate(nih32, broken, tmp_path / "ev")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1:] == [
        f"chexflow evaluate: error: --model {broken}: not a Keras model chexflow can load "
        f"(KeyError: \"There is no item named 'model.weights.h5' in the archive\")"]
    assert "Traceback" not in proc.stderr and not (tmp_path / "ev").exists()


@pytest.mark.trainer
@pytest.mark.slow
def test_evaluate_says_which_classes_left_the_mean_and_that_bootstrap_0_draws_no_ci(
        tiny_run, nih32, tmp_path):
    """The mean AUROC is a nanmean: a class whose test labels are all one value has no AUROC and
    is left out; the output says which, and why (FACTS.md: report skipped classes)."""
    proc = run_chexflow("evaluate", "--data", nih32, "--model", tiny_run, "--out",
                        tmp_path / "ev", "--bootstrap", 0)
    auroc = read_json(tmp_path / "ev" / "auroc.json")
    skipped = auroc["skipped_classes"]
    assert skipped, "40 images leave a class without positives in the test split"
    lines = proc.stdout.splitlines()
    assert lines[0] == f"mean_auroc={auroc['mean']:.4f} (no CI: --bootstrap 0 draws no resamples)"
    why = {c: "no positive image" if auroc["per_class"][c]["positives"] == 0
           else "no negative image" for c in skipped}
    assert lines[1] == (
        f"evaluate: the mean is over {14 - len(skipped)} of 14 classes, leaving out "
        + ", ".join(f"{c} ({why[c]})" for c in skipped)
        + ": their labels in the test split are all one value, so they have no AUROC (nanmean)")
