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
    """The run's processes still alive, as `PID CMDLINE`. A zombie has no environment and no
    command line left: one that exited between `marked` and the read of its argv is skipped."""
    alive = ((pid, " ".join(argv_of(pid)).strip()) for pid in marked(MARK, token))
    return [f"{pid} {argv.splitlines()[0][:160]}" for pid, argv in alive if argv]


def start_training_run(tmp_path: Path, data: Path, token: str) -> subprocess.Popen:
    """`chexflow run chexnet-train` marked with `token`, once its 2 ranks exist (they are
    training: more steps than are reached before the test signals the run)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", MARK: token}
    argv = [*CHEXFLOW, "run", "chexnet-train", "--data", data, "--out", tmp_path,
            "--workers", 2, "--epochs", 1, "--steps-per-epoch", 500, "--batch-size", 8,
            "--image-size", 64]
    run = subprocess.Popen([str(a) for a in argv], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    deadline, ranks = time.monotonic() + 240, []
    while time.monotonic() < deadline and run.poll() is None and len(ranks) < 2:
        time.sleep(0.5)
        ranks = [p for p in marked(MARK, token) if is_rank(p)]
    assert run.poll() is None, f"chexflow run ended ({run.returncode}) before training"
    assert len(ranks) == 2, f"no 2 training ranks after 240 s: {left_of(token)}"
    tree = left_of(token)
    assert any("kfp.dsl.executor_main" in p for p in tree), tree  # the kfp.local step
    return run


def wait_all_gone(token: str, seconds: float) -> list[str]:
    """The run's processes left after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while left_of(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left_of(token)


def test_sigkill_of_chexflow_run_leaves_no_step_job_or_rank(tmp_path, nih_tfrecords):
    token = uuid.uuid4().hex
    run = None
    try:
        run = start_training_run(tmp_path, nih_tfrecords, token)
        run.kill()
        run.wait()
        left = wait_all_gone(token, 15)
        assert not left, f"{len(left)} processes of the run outlived its SIGKILL by 15 s:\n" \
                         + "\n".join(left)
    finally:
        if run is not None:
            run.kill()
            run.communicate()
        stop_marked(MARK, token, grace=2)


def test_sigterm_of_chexflow_run_still_fails_the_step_in_one_line_and_leaves_nothing(
        tmp_path, nih_tfrecords):
    """SIGTERM is handled as before: it goes on to the steps, the run fails naming the step,
    and (now checked) no process of it is left once it has exited."""
    token = uuid.uuid4().hex
    run = None
    try:
        run = start_training_run(tmp_path, nih_tfrecords, token)
        run.terminate()
        _, err = run.communicate(timeout=60)
        assert run.returncode == 2, err[-3000:]
        assert "error: pipeline chexnet-train stopped by SIGTERM at step train-op" in err, \
            err[-3000:]
        assert "Traceback" not in err
        left = wait_all_gone(token, 2)
        assert not left, "processes of the run outlived it:\n" + "\n".join(left)
    finally:
        if run is not None:
            run.kill()
            run.communicate()
        stop_marked(MARK, token, grace=2)
