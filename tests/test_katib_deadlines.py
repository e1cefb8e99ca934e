"""Local Katib trials never hang `chexflow tune` and never outlive it: --timeout stops the sweep
(resumable), a job's activeDeadlineSeconds fails its trial as Katib records it, and SIGKILL of
tune (or of a resume in its first seconds, even while it reads its spec) leaves no trial process
behind, and a tune refused on a running sweep leaves that sweep's trials alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from chexflow import processes
from chexflow.katib.experiment.spec import load_experiment
from chexflow.katib.local import runner as local_runner
from chexflow.katib.local.state import open_state
from tests.conftest import CHEXFLOW, read_json, run_chexflow
from tests.support.reference import reference_dir

PY = sys.executable


def example(name: str) -> Path:
    return reference_dir() / "katib-examples" / f"{name}.yaml"


def tune(spec: Path, state: Path, command: str, *extra, check: bool = True):
    return run_chexflow("tune", spec, "--state", state, "--trial-command", command,
                        "--no-progress", *extra, check=check, timeout=120)


def budget(trials: int, failed: int) -> list[str]:
    return ["--set", f"spec.maxTrialCount={trials}", "--set", "spec.parallelTrialCount=1",
            "--set", f"spec.maxFailedTrialCount={failed}"]


def sleepers(token: str) -> list[psutil.Process]:
    """The processes whose last argument is `token` (not the shell that started them)."""
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[-1] == token]


def reapers(state: Path) -> list[psutil.Process]:
    """The reaper a tune started for this state folder."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[2:5] == ["chexflow.processes", "CHEXFLOW_KATIB_STATE", str(state)]:
            found.append(p)
    return found


def wait_for(check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    pytest.fail(f"{what} within {seconds:g}s")


def tree_command(token: str) -> str:
    """A trial whose shell starts two sleepers, one in a session of its own (as horovodrun's
    workers are), and waits."""
    sleeper = f"{PY} -c 'import time; time.sleep(300)' {token}"
    return f"{sleeper} & setsid {sleeper} & wait"


def start_tune(spec: Path, state: Path, command: str) -> subprocess.Popen:
    args = [*CHEXFLOW, "tune", spec, "--state", state, "--trial-command", command,
            "--no-progress", *budget(1, 1)]
    return subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@pytest.mark.slow
def test_sigkill_of_tune_leaves_no_trial_process(tmp_path: Path):
    token = f"chexflow-orphan-{os.getpid()}-a"
    runner = start_tune(example("random"), tmp_path / "s", tree_command(token))
    try:
        wait_for(lambda: len(sleepers(token)) == 2, "the trial's two sleepers did not start")
        runner.kill()
        runner.wait()
        deadline = time.monotonic() + 20
        while sleepers(token) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = sleepers(token)
        assert not left, f"{len(left)} trial processes outlived SIGKILL of tune"
    finally:
        runner.kill()
        kill_all(sleepers(token))


@pytest.mark.slow
def test_a_resume_killed_in_its_first_seconds_still_stops_the_leftovers(tmp_path: Path):
    token = f"chexflow-orphan-{os.getpid()}-b"
    state, cmd = tmp_path / "s", tree_command(token)
    first = start_tune(example("random"), state, cmd)
    resume = None
    try:
        wait_for(lambda: len(sleepers(token)) == 2, "the trial's two sleepers did not start")
        # a tune killed with its reaper (as `kill -9` of every chexflow process would) leaves them
        reaper = wait_for(lambda: reapers(state), "no reaper")
        kill_all(reaper)
        first.kill()
        first.wait()
        time.sleep(1)
        assert len(sleepers(token)) == 2  # left behind: the resume's to stop
        resume = start_tune(example("random"), state, cmd)
        wait_for(lambda: [p for p in reapers(state) if p.ppid() == resume.pid],
                 "the resume started no reaper", 30)
        resume.kill()  # before it has read its spec's suggester, let alone recovered trials
        resume.wait()
        deadline = time.monotonic() + 20
        while sleepers(token) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sleepers(token), "leftovers of the killed tune outlived the killed resume"
    finally:
        for p in (first, resume):
            if p is not None:
                p.kill()
        kill_all(sleepers(token))


@pytest.mark.slow
def test_a_resume_killed_while_reading_its_spec_still_stops_the_leftovers(tmp_path: Path):
    """The gap before a resume's reaper used to start (its imports and spec, about 1.5 s): the
    resume reads its spec from a FIFO nobody writes, so it is killed there, every time."""
    token = f"chexflow-orphan-{os.getpid()}-c"
    state, cmd, fifo = tmp_path / "s", tree_command(token), tmp_path / "spec.yaml"
    first = start_tune(example("random"), state, cmd)
    resume = None
    try:
        wait_for(lambda: len(sleepers(token)) == 2, "the trial's two sleepers did not start")
        kill_all(wait_for(lambda: reapers(state), "no reaper"))
        first.kill()
        first.wait()
        os.mkfifo(fifo)
        resume = start_tune(fifo, state, cmd)
        wait_for(lambda: Path(f"/proc/{resume.pid}/wchan").read_text() == "wait_for_partner",
                 "the resume did not open its spec", 30)
        assert len(sleepers(token)) == 2  # left behind: the resume's to stop
        resume.kill()
        resume.wait()
        deadline = time.monotonic() + 20
        while sleepers(token) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sleepers(token), "leftovers of the killed tune outlived a resume killed early"
    finally:
        for p in (first, resume):
            if p is not None:
                p.kill()
        kill_all(sleepers(token))


@pytest.mark.slow
def test_a_second_tune_refused_on_a_running_sweep_leaves_its_trials_alone(tmp_path: Path):
    token = f"chexflow-orphan-{os.getpid()}-d"
    state, cmd = tmp_path / "s", tree_command(token)
    first = start_tune(example("random"), state, cmd)
    try:
        wait_for(lambda: len(sleepers(token)) == 2, "the trial's two sleepers did not start")
        second = tune(example("random"), state, cmd, *budget(1, 1), check=False)
        assert second.returncode != 0 and "another `chexflow tune` is running" in second.stderr
        time.sleep(2)  # the second one's reaper has ended
        assert len(sleepers(token)) == 2 and first.poll() is None
    finally:
        first.kill()
        first.wait()
        kill_all(sleepers(token))


@pytest.mark.slow
def test_timeout_stops_a_local_sweep_that_a_rerun_resumes(tmp_path: Path):
    flag, state = tmp_path / "finish", tmp_path / "s"
    token = f"chexflow-timeout-{os.getpid()}"
    # the sleeper ignores SIGTERM: stopped by SIGKILL after the grace
    cmd = (f"if [ -f {flag} ]; then echo loss=0.5; else trap '' TERM; {PY} -c 'import time; "
           f"time.sleep(300)' {token}; fi")
    # the sleeper would outlast tune()'s own deadline: a run that waited for it fails there
    proc = tune(example("random"), state, cmd, *budget(1, 1), "--timeout", "3", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--timeout 3s passed" in lines[0] and str(state) in lines[0]
    assert not sleepers(token)
    trial = json.loads((state / "state.json").read_text())["trials"][0]
    assert trial["status"] == "Running"  # resumable: a rerun runs it again
    flag.touch()
    again = tune(example("random"), state, cmd, *budget(1, 1))
    assert f"trial {trial['name']} was interrupted" in again.stdout
    res = read_json(state / "results.json")
    assert [t["status"] for t in res["trials"]] == ["Succeeded"]


@pytest.mark.slow
@pytest.mark.parametrize("name,field", [
    ("random", "spec.trialTemplate.trialSpec.spec.activeDeadlineSeconds"),
    ("mpijob-horovod", "spec.trialTemplate.trialSpec.spec.runPolicy.activeDeadlineSeconds")])
def test_a_trial_past_its_jobs_deadline_fails_as_katib_records_it(name, field, tmp_path: Path):
    """Every trial outlives its 2 s deadline: each is stopped and Failed with the Job
    controller's DeadlineExceeded, the sweep goes on, and 2 such failures end it
    (maxFailedTrialCount 2)."""
    token = f"chexflow-deadline-{os.getpid()}-{name}"
    cmd = f"{PY} -c 'import time; time.sleep(300)' {token}"
    started = time.monotonic()
    proc = tune(example(name), tmp_path / "s", cmd, *budget(4, 2), "--set", f"{field}=2",
                check=False)
    assert time.monotonic() - started < 60 and proc.returncode == 1, proc.stderr
    state = read_json(tmp_path / "s" / "state.json")
    assert [t["status"] for t in state["trials"]] == ["Failed", "Failed"]
    for t in state["trials"]:
        assert t["reason"] == "TrialFailed. Job reason: DeadlineExceeded"
        assert t["message"] == ("Trial has failed. Job message: Job was active longer than "
                                "specified deadline")
    assert state["conditions"][-1]["reason"] == "ExperimentFailed"
    assert "Job was active longer than specified deadline" in proc.stdout
    assert not sleepers(token)


def test_a_deadline_that_is_not_a_number_of_seconds_is_one_line(tmp_path: Path):
    proc = tune(example("random"), tmp_path / "s", "echo loss=1", "--set",
                "spec.trialTemplate.trialSpec.spec.activeDeadlineSeconds=soon", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith(
        "spec.trialTemplate.trialSpec.spec.activeDeadlineSeconds: 'soon': expected a whole "
        "number of seconds greater than 0")


def test_reaper_signals_are_ignored_until_its_pipe_closes():
    """The reaper outlives a SIGTERM or SIGINT sent to its starter's group; only the end of
    its starter (its stdin pipe) makes it act."""
    from chexflow.processes import end_reaper, start_reaper

    reaper = start_reaper("CHEXFLOW_TEST_MARK", "none")
    time.sleep(1)
    for sig in (signal.SIGTERM, signal.SIGINT):
        os.kill(reaper.pid, sig)
    time.sleep(0.5)
    assert reaper.poll() is None
    end_reaper(reaper, timeout=10)
    assert reaper.returncode == 0


@pytest.mark.slow
def test_a_trial_ends_with_its_main_process_even_if_a_child_holds_its_output(tmp_path: Path):
    """As a pod's processes end with its container: a child left behind (here in a session of
    its own, holding the trial's output) is stopped, and the trial is reported at once."""
    token = f"chexflow-child-{os.getpid()}"
    cmd = f"setsid {PY} -c 'import time; time.sleep(300)' {token} & echo loss=0.5"
    # the child sleeps past tune()'s own deadline: a run that waited for it fails there
    tune(example("random"), tmp_path / "s", cmd, *budget(1, 1))
    assert [t["status"] for t in read_json(tmp_path / "s" / "results.json")["trials"]] == [
        "Succeeded"]
    assert not sleepers(token)


def test_a_child_caught_in_its_exec_is_found_on_a_later_look(tmp_path: Path, monkeypatch):
    """The kernel shows a process in the middle of execve() with no environment (3 of 200
    tries idle, more under load): the first search for the trial's marked child finds nothing,
    as it did in CI, and the runner looks again while the child still holds the output."""
    token = f"chexflow-child-{os.getpid()}-exec"
    cmd = f"setsid {PY} -c 'import time; time.sleep(300)' {token} & echo loss=0.5"
    missed = []

    def marked_once_missed(name: str, value: str) -> list[int]:
        found = processes.marked(name, value)
        if found and not missed:
            missed.append(found)
            return []
        return found

    monkeypatch.setattr(local_runner, "marked", marked_once_missed)
    exp = load_experiment(example("random"), [
        "spec.maxTrialCount=1", "spec.parallelTrialCount=1", "spec.maxFailedTrialCount=1"])
    state = open_state(tmp_path / "s", exp.name, exp.fingerprint(), exp.raw, cmd, 1)
    runner = local_runner.LocalRunner(exp, state, cmd, progress=False, timeout=30)
    try:
        runner.run()
    finally:
        kill_all(sleepers(token))
    assert missed, "the trial's child was never searched for"
    assert [t.status for t in state.trials] == ["Succeeded"]
    assert not sleepers(token)
