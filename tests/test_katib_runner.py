"""The local Katib runner, through `chexflow tune` with local --trial-command one-liners:
every upstream example completes; failure accounting; goal stop; medianstop; kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CHEXFLOW, read_json, run_chexflow
from tests.support.reference import reference_dir

PY = sys.executable
# loss = distance to (lr 0.03, momentum 0.7): never below the examples' goal 0.001 unless close.
BOWL = (f"{PY} -c 'import sys; lr, m = map(float, sys.argv[1:]); "
        "print(f\"epoch=1 loss={(lr - 0.03) ** 2 * 1000 + (m - 0.7) ** 2 + 0.01:.6f}\")' "
        "${trialParameters.learningRate} ${trialParameters.momentum}")


def example(name: str) -> Path:
    """One of Katib's example Experiments in the shared reference folder."""
    return reference_dir() / "katib-examples" / f"{name}.yaml"


def tune(spec: Path, state: Path, command: str, *extra, check: bool = True):
    return run_chexflow("tune", spec, "--state", state, "--trial-command", command,
                        "--no-progress", *extra, check=check, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["random", "tpe", "grid", "multivariate-tpe", "cma-es",
                                  "sobol", "bayesian-optimization", "median-stop"])
def test_upstream_example_completes_locally(name: str, tmp_path: Path):
    spec = example(name)
    proc = tune(spec, tmp_path / "s", BOWL, "--set", "spec.maxTrialCount=6")  # test budget
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["reason"] == "ExperimentMaxTrialsReached", proc.stdout
    assert len(res["trials"]) == 6
    statuses = {t["status"] for t in res["trials"]}
    assert statuses <= {"Succeeded", "EarlyStopped"}
    for t in res["trials"]:
        assert 0.01 <= t["lr"] <= 0.05 and 0.5 <= t["momentum"] <= 0.9
        expect = (t["lr"] - 0.03) ** 2 * 1000 + (t["momentum"] - 0.7) ** 2 + 0.01
        assert t["loss"] == pytest.approx(expect, abs=2e-6)
    best = min(t["loss"] for t in res["trials"] if t["loss"] is not None)
    opt = read_json(tmp_path / "s" / "optimal.json")
    assert opt["metrics"]["loss"] == best and set(opt["parameters"]) == {"lr", "momentum"}
    assert "optimal trial: " in proc.stdout and "ExperimentMaxTrialsReached" in proc.stdout
    assert (tmp_path / "s" / "objective.png").stat().st_size > 5000
    assert (tmp_path / "s" / "results.csv").read_text().startswith("trial,status,lr,momentum,loss")


@pytest.mark.slow
def test_mpijob_example_with_int_steps_completes(tmp_path: Path):
    # The example's goal is loss <= 0.01: keep every loss above it so six trials always run.
    cmd = (f"{PY} -c 'import sys; lr, n = float(sys.argv[1]), int(sys.argv[2]); "
           "print(\"loss=\", 0.02 + abs(lr - 0.002) * 100 + abs(n - 100) / 1000)' "
           "${trialParameters.learningRate} ${trialParameters.numberSteps}")
    tune(example("mpijob-horovod"), tmp_path / "s", cmd)
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["reason"] == "ExperimentMaxTrialsReached"
    assert [t["status"] for t in res["trials"]] == ["Succeeded"] * 6
    assert all(isinstance(t["num-steps"], int) and t["num-steps"] % 10 == 0 for t in res["trials"])


@pytest.mark.slow
def test_failed_and_metrics_unavailable_count_against_max_failed(tmp_path: Path):
    # lr > 0.04: the job fails; 0.03 < lr <= 0.04: it succeeds but reports no objective.
    cmd = (f"{PY} -c 'import sys; lr = float(sys.argv[1]); "
           "sys.exit(3) if lr > 0.04 else print(\"accuracy=0.5\" if lr > 0.03 else "
           "f\"loss={lr}\")' ${trialParameters.learningRate}")
    # random_state 0: the three bad trials are one MetricsUnavailable and two Failed (unseeded,
    # all three were of one kind one time in eight).
    proc = tune(example("random"), tmp_path / "s", cmd, "--set", "spec.parallelTrialCount=1",
                "--set", "spec.maxTrialCount=30", "--set", "spec.maxFailedTrialCount=3",
                "--set", 'spec.algorithm.algorithmSettings=[{name: random_state, value: "0"}]',
                check=False)
    assert proc.returncode == 1
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["type"] == "Failed"
    assert res["condition"]["reason"] == "ExperimentFailed"
    for t in res["trials"]:
        want = ("Failed" if t["lr"] > 0.04 else "MetricsUnavailable" if t["lr"] > 0.03
                else "Succeeded")
        assert t["status"] == want, t
    bad = [t for t in res["trials"] if t["status"] != "Succeeded"]
    assert len(bad) == 3 and res["trials"][-1] in bad  # stopped right at the third
    assert {t["status"] for t in bad} == {"Failed", "MetricsUnavailable"}
    assert all("exit code 3" in t["message"] for t in bad if t["status"] == "Failed")


@pytest.mark.slow
def test_goal_reached_stops_the_experiment(tmp_path: Path):
    # momentum > 0.75 meets the goal (loss 0.0005 <= 0.001) at once.
    cmd = (f"{PY} -c 'import sys, time; m = float(sys.argv[1]); time.sleep(0.3); "
           "print(f\"loss={0.0005 if m > 0.75 else 0.5}\")' ${trialParameters.momentum}")
    tune(example("tpe"), tmp_path / "s", cmd, "--set", "spec.maxTrialCount=40",
         "--set", "spec.parallelTrialCount=2")
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["reason"] == "ExperimentGoalReached"
    opt = read_json(tmp_path / "s" / "optimal.json")
    assert opt["metrics"]["loss"] == 0.0005 and opt["parameters"]["momentum"] > 0.75
    done = [t for t in res["trials"] if t["status"] == "Succeeded"]
    assert sum(t["loss"] <= 0.001 for t in done) >= 1 and len(res["trials"]) < 40
    assert all(t["status"] in ("Succeeded", "Killed") for t in res["trials"])


def test_failed_trial_shows_the_commands_own_error_line_not_the_last_lines(tmp_path: Path):
    # As a chexflow train trial that fails: its one-line reason, then horovodrun's noise.
    cmd = (f"{PY} -c 'import sys; print(\"chexflow train: error: --data /d: no manifest.json "
           "there\"); [print(f\"horovodrun noise {i}\") for i in range(20)]; sys.exit(1)'")
    proc = tune(example("random"), tmp_path / "s", cmd, "--set", "spec.maxTrialCount=1",
                "--set", "spec.parallelTrialCount=1", "--set", "spec.maxFailedTrialCount=1",
                check=False)
    assert proc.returncode == 1  # the Experiment Failed
    (trial,) = read_json(tmp_path / "s" / "results.json")["trials"]
    assert trial["status"] == "Failed"
    assert trial["message"] == ("exit code 1: chexflow train: error: --data /d: no manifest.json "
                                "there")


@pytest.mark.slow
def test_medianstop_stops_a_clearly_bad_trial(tmp_path: Path):
    # The first trial is good (loss 0.1, 0.11, ...), the second clearly bad (loss 5.0).
    script = tmp_path / "trial.py"
    script.write_text(
        "import sys, time\n"
        f"counter = open({str(tmp_path / 'count')!r}, 'a+')\n"
        "counter.seek(0)\nfirst = counter.read() == ''\ncounter.write('x')\ncounter.close()\n"
        "for i in range(8):\n"
        "    print(f'epoch={i + 1} loss={0.1 + i / 100 if first else 5.0}', flush=True)\n"
        "    time.sleep(0.4)\n"
    )
    tune(example("median-stop"), tmp_path / "s",
         f"{PY} {script} ${{trialParameters.learningRate}}",
         "--set", "spec.parallelTrialCount=1", "--set", "spec.maxTrialCount=2",
         "--set", "spec.maxFailedTrialCount=1")
    state = read_json(tmp_path / "s" / "state.json")
    good, bad = state["trials"]
    assert good["status"] == "Succeeded" and good["rule"] is None
    assert len(good["logs"]["loss"]) == 8
    assert bad["status"] == "EarlyStopped"
    # Katib's rule: mean over Succeeded trials of their first start_step (2) values.
    assert bad["rule"] == {"metric": "loss", "value": pytest.approx(0.105), "comparison":
                           "greater", "start_step": 2}
    assert 2 <= len(bad["logs"]["loss"]) < 8
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["reason"] == "ExperimentMaxTrialsReached"
    assert read_json(tmp_path / "s" / "optimal.json")["trial"] == good["name"]


@pytest.mark.slow
def test_killed_sweep_resumes_without_losing_or_repeating_a_trial(tmp_path: Path):
    ledger, state_dir = tmp_path / "ledger.txt", tmp_path / "s"
    cmd = (f"echo start $CHEXFLOW_KATIB_TRIAL >> {ledger}; sleep 2.5; "
           f"{PY} -c 'import sys; print(\"loss=\", float(sys.argv[1]))' "
           "${trialParameters.learningRate} && "
           f"echo done $CHEXFLOW_KATIB_TRIAL >> {ledger}")
    args = [*CHEXFLOW, "tune", example("random"), "--state", state_dir, "--trial-command",
            cmd, "--no-progress", "--set", "spec.parallelTrialCount=1", "--set",
            "spec.maxTrialCount=3"]
    runner = subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill the runner while its 2nd trial runs
        try:
            trials = json.loads((state_dir / "state.json").read_text())["trials"]
        except (OSError, ValueError, KeyError):
            trials = []
        if len(trials) == 2 and trials[1]["status"] == "Running":
            break
        time.sleep(0.1)
    else:
        runner.kill()
        pytest.fail("the second trial never started")
    time.sleep(0.5)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    interrupted = json.loads((state_dir / "state.json").read_text())["trials"][1]["name"]

    proc = tune(example("random"), state_dir, cmd, "--set", "spec.parallelTrialCount=1",
                "--set", "spec.maxTrialCount=3")
    assert f"trial {interrupted} was interrupted" in proc.stdout
    time.sleep(3)  # a leftover of the killed attempt would have finished by now
    res = read_json(state_dir / "results.json")
    names = [t["trial"] for t in res["trials"]]
    assert len(names) == 3 and [t["status"] for t in res["trials"]] == ["Succeeded"] * 3
    lines = ledger.read_text().split()
    done = [lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "done"]
    starts = [lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "start"]
    assert sorted(done) == sorted(names)  # every trial finished exactly once
    assert starts.count(interrupted) == 2 and len(starts) == 4
    restarts = {t["trial"]: t["restarts"] for t in res["trials"]}
    assert restarts[interrupted] == 1 and sum(restarts.values()) == 1

    again = tune(example("random"), state_dir, cmd, "--set", "spec.parallelTrialCount=1",
                 "--set", "spec.maxTrialCount=3")
    assert "ExperimentMaxTrialsReached" in again.stdout
    assert len(ledger.read_text().split()) == len(lines)  # a finished sweep runs nothing


@pytest.mark.slow
def test_state_folder_belongs_to_one_spec(tmp_path: Path):
    tune(example("random"), tmp_path / "s", BOWL, "--set", "spec.maxTrialCount=3")
    other = tune(example("tpe"), tmp_path / "s", BOWL, check=False)
    assert other.returncode == 2 and "different spec" in other.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    clash = tune(example("random"), tmp_path / "mine", BOWL, check=False)
    assert clash.returncode == 2 and "not a `chexflow tune` state folder" in clash.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


@pytest.mark.slow
@pytest.mark.parametrize("program", ["missing", "not-executable"])
def test_a_trial_program_that_cannot_be_executed_fails_the_trial_in_one_line(tmp_path, program):
    """A trialSpec command that names no file, or a file without execute permission: the trial
    is Failed with one line naming the program (was a FileNotFoundError traceback that left the
    trial Created, so a rerun on the same state crashed again). primaryPodLabels that the pod
    lacks: Katib injects no collector, so the command is run as it is, without `sh -c`."""
    path = tmp_path / ("nope/train" if program == "missing" else "train.sh")
    if program == "not-executable":
        path.write_text("#!/bin/sh\necho loss=0.1\n")
        path.chmod(0o644)
    why = "No such file or directory" if program == "missing" else "Permission denied"
    command = (f'[{path}, "--lr=${{trialParameters.learningRate}}", '
               '"--momentum=${trialParameters.momentum}"]')
    container = "spec.trialTemplate.trialSpec.spec.template.spec.containers[0]"
    args = ["tune", example("random"), "--state", tmp_path / "s", "--no-progress",
            "--set", "spec.maxTrialCount=2", "--set", "spec.parallelTrialCount=1",
            "--set", "spec.maxFailedTrialCount=2",
            "--set", "spec.trialTemplate.primaryPodLabels={a: b}",
            "--set", f"{container}.command={command}"]
    for attempt in ("first", "rerun"):
        proc = run_chexflow(*args, check=False, timeout=120)
        assert proc.returncode == 1, (attempt, proc.stderr)
        assert "Traceback" not in proc.stderr, attempt
        res = read_json(tmp_path / "s" / "results.json")
        assert [t["status"] for t in res["trials"]] == ["Failed", "Failed"]
        assert res["condition"]["reason"] == "ExperimentFailed"
        if attempt == "first":
            reasons = [ln for ln in proc.stdout.splitlines() if " Failed: " in ln]
            assert len(reasons) == 2, proc.stdout
            assert all(ln.endswith(f"(cannot execute {path}: {why})") for ln in reasons)
    assert " Failed: " not in proc.stdout  # the rerun ran nothing again


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["random", "tpe"])
def test_one_value_categoricals_run_with_hyperopt(tmp_path, algorithm):
    """Every parameter a one-value categorical (legal in Katib, whose hyperopt service gives
    them to hp.choice): each trial gets those values (was a hyperopt IndexError traceback from
    an empty search space)."""
    params = ('[{name: lr, parameterType: categorical, feasibleSpace: {list: ["0.03"]}}, '
              '{name: momentum, parameterType: categorical, feasibleSpace: {list: ["0.7"]}}]')
    tune(example("random"), tmp_path / "s", BOWL, "--set", f"spec.parameters={params}",
         "--set", f"spec.algorithm.algorithmName={algorithm}", "--set", "spec.maxTrialCount=2",
         "--set", "spec.parallelTrialCount=1", "--set", "spec.maxFailedTrialCount=1")
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["reason"] == "ExperimentMaxTrialsReached"
    assert [(t["status"], t["lr"], t["momentum"]) for t in res["trials"]] == [
        ("Succeeded", "0.03", "0.7")] * 2
    assert [t["loss"] for t in res["trials"]] == [pytest.approx(0.01)] * 2
