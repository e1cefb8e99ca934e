"""Training under bad input and faults (issue 18): every numeric option range-checked in one
line, one run per --out folder (a lock naming its holder), no worker outliving a killed
`chexflow train`, a clear last line when a worker dies, and no run that trains on nothing."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chexflow.errors import ChexflowError
from chexflow.train.launch import HorovodrunLog, failure_reason
from chexflow.train.options import add_train_arguments
from chexflow.train.rundir import RUN_FILE, check_options, check_out, run_identity
from tests.conftest import CHEXFLOW, run_chexflow
from tests.test_train import _descendants, _is_worker


def _parsed(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_arguments(p, launcher=True)
    return p.parse_args(["--out", "/nowhere", "--synthetic-data", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (("--epochs", "0"), "--epochs 0: must be >= 1"),
    (("--batch-size", "-4"), "--batch-size -4: must be >= 1"),
    (("--steps-per-epoch", "0"), "--steps-per-epoch 0: must be >= 1"),
    (("--validation-steps", "0"),
     "--validation-steps 0: must be >= 1 (leave it out to validate on the whole split)"),
    (("--warmup-steps", "-1"), "--warmup-steps -1: must be >= 0"),
    (("--lr-warmup-epochs", "-0.5"), "--lr-warmup-epochs -0.5: must be >= 0"),
    (("--lr-warmup-epochs", "nan"), "--lr-warmup-epochs nan: must be >= 0"),
    (("--lr", "nan"), "--lr nan: must be > 0"),
    (("--lr", "inf"), "--lr inf: must be > 0"),
    (("--lr", "0"), "--lr 0.0: must be > 0"),
    (("--weight-decay", "nan"), "--weight-decay nan: must be >= 0"),
    (("--image-size", "-5"), "--image-size -5: must be >= 1"),
    (("--image-size", "16"), "--image-size 16: Keras' models need at least 32 px"),
    (("--threads", "0"), "--threads 0: must be >= 1"),
    (("--bn-momentum", "1"), "--bn-momentum 1.0: expected a number from 0 to below 1"),
    (("--bn-momentum", "nan"), "--bn-momentum nan: expected a number from 0 to below 1"),
    (("--seed", "-1"), "--seed -1: must be in [0, 4294967295]"),
    (("--seed", str(2**32)), "--seed 4294967296: must be in [0, 4294967295]"),
])
def test_numeric_train_option_out_of_range_is_refused(argv, message):
    with pytest.raises(ChexflowError) as refused:
        check_options(_parsed(*argv))
    assert str(refused.value) == message


@pytest.mark.parametrize(("argv", "message"), [
    (("--lr", "1e99"), "--lr 1e+99: must be <= 10.0"),
    (("--weight-decay", "2"), "--weight-decay 2.0: must be <= 1.0"),
    (("--threads", str(2**31)), "--threads 2147483648: must be <= 2147483647"),
    (("--batch-size", str(10**20)), "--batch-size 100000000000000000000: must be <= 2147483647"),
    (("--steps-per-epoch", str(10**20)),
     "--steps-per-epoch 100000000000000000000: must be <= 2147483647"),
    (("--image-size", "5000"), "--image-size 5000: must be <= 4096"),
    (("--fusion-threshold-mb", "1e99"), "--fusion-threshold-mb 1e+99: must be <= 1024.0"),
    (("--cycle-time-ms", "1e99"), "--cycle-time-ms 1e+99: must be <= 1000.0"),
    (("--weights", "w" * 300), f"--weights {'w' * 300}: no such file (expected none, imagenet, "
                               "a Keras .h5 backbone weights file or a .keras model written by "
                               "chexflow train)"),
])
def test_train_option_the_worker_would_fail_on_is_refused_first(argv, message):
    """Values the worker failed on after it started (a ValueError as TensorFlow took them, an
    OSError for a name too long) or that no run can use."""
    with pytest.raises(ChexflowError) as refused:
        check_options(_parsed(*argv))
    assert str(refused.value) == message


def test_in_range_train_options_pass():
    check_options(_parsed("--validation-steps", "1", "--warmup-steps", "0", "--bn-momentum", "0",
                          "--lr-warmup-epochs", "0", "--seed", str(2**32 - 1)))


def test_bad_numbers_refused_in_one_line_before_any_worker_starts(tmp_path):
    for argv, message in [
        (("--validation-steps", "0"), "--validation-steps 0: must be >= 1"),
        (("--warmup-steps", "-3"), "--warmup-steps -3: must be >= 0"),
        (("--workers", "0"), "--workers 0: must be at least 1"),
        (("--lr", "1e99"), "--lr 1e+99: must be <= 10.0"),
    ]:
        proc = run_chexflow("train", "--data", tmp_path, "--out", tmp_path / "o", *argv,
                            check=False)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"chexflow train: error: {message}"), line
        assert "launch:" not in proc.stdout and not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a failed run's last line

# horovodrun's lines when rank 1 was killed (as it printed them here, its traceback shortened)
KILLED_RANK_1 = """\
[0]<stdout>:Epoch 1/3
[1]<stderr>:Killed
[0]<stderr>:[2026-11-23 12:20:27: E horovod/common/operations.cc:697] [0]: Horovod background \
loop uncaught exception: Read error [127.0.0.1]:50575: Connection reset by peer
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
[0]<stderr>:Terminated
Process 0 exit with status code 143.
Traceback (most recent call last):
  File "/work/main/.venv/bin/horovodrun", line 6, in <module>
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus \
causing the job to be terminated. The first process to do so was:
Process name: 1
Exit code: 137
"""


def _log(text: str) -> HorovodrunLog:
    log = HorovodrunLog()
    for line in text.splitlines():
        log.add(line)
    return log


def test_failure_reason_names_the_first_failed_rank_and_how():
    assert failure_reason(1, _log(KILLED_RANK_1)) == (
        "worker rank 1 was killed by SIGKILL (exit status 137); horovodrun ended the other "
        "workers")
    crashed = "[1]<stderr>:Traceback (most recent call last):\n[1]<stderr>:ValueError: bad\n" \
              "[1]<stderr>:\nProcess 1 exit with status code 1.\nProcess 0 exit with status " \
              "code 143.\n"
    assert failure_reason(1, _log(crashed)) == "worker rank 1 exited with status 1: ValueError: bad"
    assert failure_reason(2, _log("usage: horovodrun\nhorovodrun: error: bad -np\n")) == \
        "horovodrun exited 2: horovodrun: error: bad -np"


MPIRUN_KILLED_RANK_1 = """\
[1,0]<stdout>:Epoch 1/3
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
"""
MPIRUN_FAILED_RANK_1 = """\
[1,1]<stderr>:ValueError: bad
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[7129,1],1]
  Exit code:    3
"""


def test_failure_reason_reads_mpiruns_report_under_the_mpi_controller():
    assert failure_reason(1, _log(MPIRUN_KILLED_RANK_1)) == (
        "worker rank 1 was killed by SIGKILL (exit status 137); horovodrun ended the other "
        "workers")
    assert failure_reason(1, _log(MPIRUN_FAILED_RANK_1)) == \
        "worker rank 1 exited with status 3: ValueError: bad"


def test_openmpis_help_messages_are_held_back_and_the_rest_passes():
    """mpirun's boxed help messages (between rules of dashes) are held, so a failed rank's one
    line stays the only one; rank lines and mpirun's other lines pass."""
    log = HorovodrunLog()
    held = [line for line in MPIRUN_KILLED_RANK_1.splitlines() if log.hold(line)]
    assert held == MPIRUN_KILLED_RANK_1.splitlines()[1:5] == log.mpi_help
    assert not log.in_mpi_help and not log.hold("[1,0]<stderr>:-----------------------------")


# ---------------------------------------------------------------- one run per --out (trainer env)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


SYNTHETIC = ("--synthetic-data", "--model", "resnet50", "--image-size", "32", "--batch-size", "4",
             "--threads", "1")


@pytest.mark.trainer
@pytest.mark.slow
def test_second_train_refused_and_killing_the_launcher_leaves_no_worker(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [*CHEXFLOW, "train", *SYNTHETIC, "--workers", "2", "--epochs", "1",
         "--steps-per-epoch", "100000", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    tree: list[int] = []
    try:
        seen = []
        for line in first.stdout:  # rank 0 prints this line once it holds the lock
            seen.append(line)
            if re.match(r"\[(?:\d+,)?0\]<stdout>:train: resnet50", line):  # gloo or mpirun
                break
        assert first.poll() is None, "".join(seen)[-3000:]
        tree = _descendants(first.pid)
        workers = [p for p in tree if _is_worker(p)]
        # horovodrun, or the mpirun it became (horovodrun --mpi, the default, execs it)
        assert len(workers) == 2 and any(
            "horovodrun" in _cmdline(p) or "mpirun" in _cmdline(p) for p in tree)

        second = run_chexflow("train", *SYNTHETIC, "--epochs", "1", "--out", out, check=False)
        assert second.returncode == 2
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith(f"chexflow train: error: {out}: in use by PID {first.pid} "
                               f"(chexflow train), PID "), line
        assert "(chexflow train rank 0)" in line
        assert any(f"PID {w} (chexflow train rank 0)" in line for w in workers), line

        os.kill(first.pid, signal.SIGKILL)  # only the top-level `chexflow train`
        first.wait()
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = [f"{p}: {_cmdline(p)}" for p in tree if _alive(p)]
        assert not left, left
    finally:
        for pid in [first.pid, *tree]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- a diverged run


@pytest.mark.trainer
def test_diverged_training_fails_in_one_line_and_saves_no_model(tmp_path):
    out = tmp_path / "run"
    proc = run_chexflow("train", *SYNTHETIC, "--epochs", "2", "--steps-per-epoch", "3",
                        "--validation-steps", "1", "--warmup-steps", "0", "--lr", "10",
                        "--optimizer", "sgd", "--out", out, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("chexflow train: error: training diverged: epoch 1's "), line
    assert line.endswith(" is nan; stopped without saving that epoch (best_model.keras, if there "
                         "is one, is from an earlier epoch); try a lower --lr than 10"), line
    assert not (out / "best_model.keras").exists()
    assert not (out / "metrics.json").exists()


# ---------------------------------------------------------------- resuming on another split


@pytest.mark.slow
def test_resume_on_data_preprocessed_again_with_another_split_is_refused(tmp_path):
    raw, data, out = tmp_path / "raw", tmp_path / "data", tmp_path / "run"
    run_chexflow("data", "synth", "--out", raw, "--images", 40, "--size", 32)

    def preprocess(seed: int, *extra) -> None:
        run_chexflow("preprocess", "--csv", raw / "Data_Entry_2017.csv", "--images",
                     raw / "images", "--out", data, "--image-size", 32, "--workers", 1,
                     "--seed", seed, *extra)

    preprocess(0)
    args = _parsed("--data", str(data), "--image-size", "32")
    args.synthetic_data, args.out = False, str(out)
    out.mkdir()
    (out / RUN_FILE).write_text(json.dumps(run_identity(args)))  # as rank 0 writes it
    assert check_out(args) is not None  # the same data: resumed
    preprocess(0, "--overwrite")  # preprocessed again, the same split: still resumed
    assert check_out(args) is not None
    preprocess(1, "--overwrite")
    with pytest.raises(ChexflowError) as refused:
        check_out(args)
    assert str(refused.value) == (
        f"--out {out}: was trained on another split of --data {data} (its splits.csv has "
        f"changed since: preprocessed again?); resuming would mix its train and validation "
        f"patients; use a new --out")
