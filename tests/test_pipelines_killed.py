"""SIGKILL of `chexflow run`: kfp.local starts each step with a Popen of its own, so a killed
run used to leave its running step, the step's job (`chexflow train`, its reaper, horovodrun or
mpirun) and the Horovod ranks training on. Now nothing of the run outlives it."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from chexflow.processes import marked, stop_marked
from tests.conftest import CHEXFLOW

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

MARK = "CHEXFLOW_TEST_KILLED_RUN"  # in the run's environment, so in every process below it
WORKER = "chexflow.train.worker"


def argv_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def is_rank(pid: int) -> bool:
    """A Horovod rank: `PYTHON -m chexflow.train.worker ...` (horovodrun's argv also holds it)."""
    return argv_of(pid)[1:3] == ["-m", WORKER]


def left_of(token: str) -> list[str]:
    """The run's processes still alive, as `PID CMDLINE` (a zombie has no environment left)."""
    return [f"{pid} {' '.join(argv_of(pid)).splitlines()[0][:160]}" for pid in marked(MARK, token)]


def test_sigkill_of_chexflow_run_leaves_no_step_job_or_rank(tmp_path, nih_tfrecords):
    token = uuid.uuid4().hex
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", MARK: token}
    # 2 ranks and more steps than are reached before the kill: they are training when it comes
    argv = [*CHEXFLOW, "run", "chexnet-train", "--data", nih_tfrecords, "--out", tmp_path,
            "--workers", 2, "--epochs", 1, "--steps-per-epoch", 500, "--batch-size", 8,
            "--image-size", 64]
    run = subprocess.Popen([str(a) for a in argv], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            ranks = [p for p in marked(MARK, token) if is_rank(p)]
            if len(ranks) == 2:
                break
            time.sleep(0.5)
        assert run.poll() is None, f"chexflow run ended ({run.returncode}) before training"
        assert len(ranks) == 2, f"no 2 training ranks after 240 s: {left_of(token)}"
        tree = left_of(token)
        assert any("kfp.dsl.executor_main" in p for p in tree), tree  # the kfp.local step
        run.kill()
        run.wait()
        killed = time.monotonic()
        while left_of(token) and time.monotonic() - killed < 15:
            time.sleep(0.2)
        left = left_of(token)
        assert not left, f"{len(left)} processes of the run outlived its SIGKILL by 15 s:\n" \
                         + "\n".join(left)
    finally:
        run.kill()
        run.wait()
        stop_marked(MARK, token, grace=2)
