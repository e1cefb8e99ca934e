"""Training under faults (issue 38): a damaged checkpoint falls back to the newest one that reads
whole (or is one line naming the files), a damaged state.json or run.json is one line, a rerun
is promised only where a checkpoint is there, a full disk is one line naming the file being
written with its partial files removed (`chexflow train` and `chexflow run`'s train step), and
SIGTERM stops `chexflow train` like Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chexflow.runlock import LOCK_FILE
from chexflow.train.launch import _resume_hint
from chexflow.train.rundir import RUN_FILE, run_identity
from tests.conftest import CHEXFLOW, read_json, run_chexflow
from tests.test_train import _descendants, _is_worker
from tests.test_train_guards import SYNTHETIC, _alive, _cmdline, _parsed

# 2 steps an epoch on in-memory examples; one validation batch
TINY = (*SYNTHETIC, "--steps-per-epoch", "2", "--warmup-steps", "0", "--validation-steps", "1")
# `chexflow run chexnet-train` on a generated dataset, one ResNet-50 worker at 32 px
TINY_RUN = ("--model", "resnet50", "--workers", "1", "--image-size", "32", "--epochs", "1",
            "--steps-per-epoch", "2", "--batch-size", "4", "--weights", "none")


def _left_partial(out: Path) -> list[Path]:
    """What a write cut short leaves: temporary files, TensorFlow's checkpoint *_temp folders."""
    return [p for p in out.rglob("*") if ".tmp" in p.name or p.name.endswith("_temp")]


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """name -> (size, modification time) of a folder's files."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


# ---------------------------------------------------------------- damaged checkpoints


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory) -> Path:
    """A run folder trained for 2 epochs: checkpoints ckpt-1 and ckpt-2, state.json at 2."""
    out = tmp_path_factory.mktemp("two-epochs") / "run"
    run_chexflow("train", *TINY, "--epochs", 2, "--out", out)
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


@pytest.mark.trainer
@pytest.mark.slow
def test_truncated_checkpoint_falls_back_to_the_previous_one_and_names_it(two_epochs, tmp_path):
    out = _copy(two_epochs, tmp_path)
    data = out / "checkpoints" / "ckpt-2.data-00000-of-00001"
    os.truncate(data, 1000)
    proc = run_chexflow("train", *TINY, "--epochs", 3, "--out", out)
    assert (f"train: warning: skipped a checkpoint: {data}: does not read whole (IndexError: "
            f"Read less bytes than requested)") in proc.stdout
    assert ("train: warning: resuming after epoch 1, not 2: epoch 2 is trained again, its "
            "checkpoint written anew") in proc.stdout
    assert f"resumed after epoch 1 from {out / 'checkpoints' / 'ckpt-1'}" in proc.stdout
    epochs = [int(e) for e in re.findall(r"^\[(?:\d+,)?0\]<stdout>:epoch=(\d+) ", proc.stdout,
                                         re.M)]
    assert epochs == [2, 3], proc.stdout[-3000:]
    state = read_json(out / "checkpoints" / "state.json")
    assert state["epoch"] == 3 and [h["epoch"] for h in state["history"]] == [1, 2, 3]
    assert data.stat().st_size > 1000  # written anew when epoch 2 was trained again


@pytest.mark.trainer
@pytest.mark.slow
def test_no_checkpoint_reading_whole_is_one_line_naming_them_and_nothing_is_removed(
        two_epochs, tmp_path):
    out = _copy(two_epochs, tmp_path)
    checkpoints = out / "checkpoints"
    data, index = checkpoints / "ckpt-2.data-00000-of-00001", checkpoints / "ckpt-1.index"
    os.truncate(data, 1000)
    index.write_bytes(b"not an index" * 40)
    before = _files(checkpoints)
    proc = run_chexflow("train", *TINY, "--epochs", 3, "--out", out, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"chexflow train: error: {checkpoints}: no checkpoint of this run reads whole ({data}: "
        f"does not read whole (IndexError: Read less bytes than requested); {index}: not "
        f"readable ("), line
    assert line.endswith("nothing there was changed; restore them from a copy, or train into a "
                         "new --out"), line
    assert "rerun the same command" not in line
    assert _files(checkpoints) == before


def _recorded_run(tmp_path: Path) -> Path:
    """A run folder as rank 0 records a synthetic TINY run (run.json), no epoch trained."""
    args = _parsed("--model", "resnet50", "--image-size", "32")
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / RUN_FILE).write_text(json.dumps(run_identity(args)))
    return out


@pytest.mark.parametrize(("damaged", "text", "why"), [
    ("checkpoints/state.json", "{\n", "not valid JSON (Expecting property name enclosed in "
     "double quotes: line 2 column 1 (char 2)); it records the epochs trained and the best "
     "model's val_loss, which the checkpoints do not hold; restore it from a copy, or train "
     "into a new --out (nothing in {out} was changed)"),
    ("checkpoints/state.json", '{"epoch": "two"}', 'no epoch number ("epoch": N) in it; it '
     "records the epochs trained and the best model's val_loss, which the checkpoints do not "
     "hold; restore it from a copy, or train into a new --out (nothing in {out} was changed)"),
    (RUN_FILE, "{\n", "not valid JSON (Expecting property name enclosed in double quotes: "
     "line 2 column 1 (char 2)); it identifies the run this --out holds; restore it from a "
     "copy, or train into a new --out"),
], ids=["state-not-json", "state-without-epoch", "run-not-json"])
def test_damaged_run_record_is_one_line_before_any_worker_starts(tmp_path, damaged, text, why):
    out = _recorded_run(tmp_path)
    (out / damaged).write_text(text)
    proc = run_chexflow("train", *TINY, "--out", out, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"chexflow train: error: {out / damaged}: {why.format(out=out)}"]
    assert "launch:" not in proc.stdout
    assert (out / damaged).read_text() == text


def test_rerun_is_promised_after_the_newest_epoch_whose_checkpoint_is_there(tmp_path):
    out = _recorded_run(tmp_path)
    checkpoints = out / "checkpoints"
    (checkpoints / "state.json").write_text(json.dumps({"epoch": 2}))
    for name in ("ckpt-1.index", "ckpt-1.data-00000-of-00001", "ckpt-2.index"):
        (checkpoints / name).write_bytes(b"x")  # ckpt-2 has lost its data
    assert _resume_hint(out) == "; rerun the same command to resume after epoch 1"
    (checkpoints / "ckpt-2.data-00000-of-00001").write_bytes(b"x")
    assert _resume_hint(out) == "; rerun the same command to resume after epoch 2"
    (checkpoints / "state.json").write_text("{")
    assert _resume_hint(out) == ""


# ---------------------------------------------------------------- a full disk


@pytest.fixture()
def small_disk(tmp_path):
    """mount(size) -> a fresh tmpfs of that size (as `mount -o size=`), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("filling a disk needs a small tmpfs, and mounting one needs root")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


# A ResNet-50 at 32 px writes a best_model.keras of 95 MB (and a copy of it while the classes are
# put in) before its first checkpoint of 283 MB: 120 MB fill up on the model, 300 MB on the
# checkpoint.
@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize(("size", "written"), [("120m", "best_model.keras"),
                                                ("300m", "checkpoints/ckpt-1")])
def test_full_disk_is_one_line_naming_the_file_and_leaves_no_partial_file(
        small_disk, size, written):
    out = small_disk(size) / "run"
    proc = run_chexflow("train", *TINY, "--epochs", 1, "--out", out, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"chexflow train: error: {out / written}: No space left on device (ENOSPC); free space "
        f"there, then rerun the same command"]
    assert "Traceback" not in proc.stdout
    assert not _left_partial(out)
    if written == "best_model.keras":
        assert not (out / written).exists()


@pytest.mark.trainer
@pytest.mark.slow
def test_full_disk_in_chexflow_runs_train_step_is_the_workers_one_line(small_disk, tmp_path):
    runs = small_disk("300m")
    proc = run_chexflow("run", "chexnet-train", "--out", runs, *TINY_RUN, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (train,) = runs.glob("chexnet-train-*/work/*/train-w1")
    line = (f"chexflow train: error: {train / 'checkpoints' / 'ckpt-1'}: No space left on device "
            f"(ENOSPC); free space there, then rerun the same command")
    assert line in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "chexflow run: error: pipeline chexnet-train failed at step train-op" in proc.stderr
    assert not _left_partial(train)


# ---------------------------------------------------------------- SIGTERM like Ctrl-C


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_stop_train_in_one_line_leaving_no_process(tmp_path, sig, status):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*CHEXFLOW, "train", *SYNTHETIC, "--workers", "2", "--epochs", "1",
         "--steps-per-epoch", "100000", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    tree: list[int] = []
    try:
        seen = []
        for line in proc.stdout:  # rank 0 prints this line once the run folder is set up
            seen.append(line)
            if re.match(r"\[(?:\d+,)?0\]<stdout>:train: resnet50", line):
                break
        tree = _descendants(proc.pid)
        assert len([p for p in tree if _is_worker(p)]) == 2, "".join(seen)[-3000:]
        proc.send_signal(sig)  # to `chexflow train` alone, as `kill` does
        rest, err = proc.communicate(timeout=120)
        assert proc.returncode == status, err[-3000:]
        assert err.strip().splitlines() == ["chexflow train: interrupted"]
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [f"{p}: {_cmdline(p)}" for p in tree if _alive(p)]
        assert not _left_partial(out) and not (out / LOCK_FILE).exists()
    finally:
        for pid in [proc.pid, *tree]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
