"""Katib's StdOut/File/TensorFlowEvent wrapper, locally: the trial's command and args joined
with spaces, without quoting, under `sh -c` (pkg/webhook/v1beta1/pod/utils.go
`wrapWorkerContainer`, v0.19.0), so the issue-29 Experiment fails here as on Katib, with sh's
own message and one line saying why and how to write it; its quoted variant succeeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from chexflow.jobs.local import quick_horovodrun
from chexflow.katib.experiment.spec import load_experiment
from chexflow.katib.experiment.trialspec import (
    katib_wrap,
    kube_expand,
    local_command_parts,
    primary_container,
    quoting_note,
    render_trial_spec,
)
from tests.conftest import read_json, run_chexflow
from tests.katib_wrap_specs import PROGRAM, SH_SYNTAX_ERROR, issue_experiment

WHY = ("Katib's metrics collector joins command and args with spaces, without quoting, and runs "
       "them with sh -c")
HOW = ("put the command in a script file, or write command: [sh, -c] with the whole command "
       "line as one quoted string in args")


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_the_issue_experiment_fails_locally_with_shs_message_and_the_reason(tmp_path: Path):
    spec = write(tmp_path, issue_experiment("quoting", quoted=False))
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", "--no-progress", check=False,
                        timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = read_json(tmp_path / "s" / "results.json")
    (trial,) = res["trials"]  # maxFailedTrialCount 1: the first failure ends it, as on Katib
    assert trial["status"] == "Failed"
    assert res["condition"]["reason"] == "ExperimentFailed"
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"trial {trial['trial']}")]
    assert f"exit code 2: {SH_SYNTAX_ERROR} (" in line, line
    assert "word 3 of command + args" in line and WHY in line and line.endswith(f"{HOW}))"), line
    log = (tmp_path / "s" / "trials" / trial["trial"] / "stdout.log").read_text()
    assert log.splitlines()[1:] == [SH_SYNTAX_ERROR]  # the shell's own error, nothing else ran


@pytest.mark.slow
def test_dry_run_names_the_word_why_and_how_in_one_line(tmp_path: Path):
    spec = write(tmp_path, issue_experiment("quoting", quoted=False))
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", "--dry-run")
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("note: ")]
    assert notes == [f"note: spec.trialTemplate.trialSpec container 'main': word 3 of command + "
                     f"args, {PROGRAM!r}, is read again by the shell on Katib: {WHY}; {HOW}"]


@pytest.mark.slow
def test_the_quoted_variant_succeeds_locally_with_the_right_loss(tmp_path: Path):
    spec = write(tmp_path, issue_experiment("quoted", quoted=True))
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", "--no-progress", timeout=300)
    res = read_json(tmp_path / "s" / "results.json")
    assert res["condition"]["reason"] == "ExperimentMaxTrialsReached", proc.stdout
    for t in res["trials"]:
        assert t["status"] == "Succeeded" and t["loss"] == pytest.approx(t["x"] ** 2, abs=1e-5)
        # Katib's completion marker, written by the wrapper into the collector's folder
        (pid,) = (tmp_path / "s" / "trials" / t["trial"] / "metrics").glob("*.pid")
        assert pid.read_text() == "completed\n" and pid.stem.isdigit()
    assert not any(ln.startswith("note: ") for ln in proc.stdout.splitlines())
    dry = run_chexflow("tune", spec, "--state", tmp_path / "d", "--dry-run")
    assert "note: " not in dry.stdout


@pytest.mark.parametrize("kind, argv, early, script", [
    ("StdOut", ["python", "-c", "print(1)", "0.5"], False,
     "python -c print(1) 0.5 1>/var/log/katib/metrics.log 2>&1 && "
     "echo completed > /var/log/katib/$$.pid"),
    ("File", ["sh", "-c", "train --out /m"], False,
     "train --out /m && echo completed > /var/log/katib/$$.pid"),
    ("TensorFlowEvent", ["bash", "-c", "a", "b"], True,
     "a b || if test -f /var/log/katib/$$.pid && [ $(head -n 1 /var/log/katib/$$.pid) = "
     "early-stopped ]; then echo Training Container was Early Stopped; else echo Training "
     "Container was Failed; exit 1; fi && echo completed > /var/log/katib/$$.pid"),
])
def test_katib_wrap_builds_katibs_string(kind, argv, early, script):
    """Katib's strings after the kubelet's expansion: `$$$$.pid` is the shell's `$$.pid`; the
    early-stopping test's `$$.pid` stays `$$.pid`, inside `$(head ...)`, which the kubelet
    leaves as written (no variable of that name)."""
    out = katib_wrap(argv, 0, kind, "/var/log/katib", {}, early)
    shell = ["bash", "-c"] if argv[0] == "bash" else ["sh", "-c"]
    assert out == [*shell, script]


def test_kube_expand_is_the_kubelets_expansion():
    env = {"A": "x y", "B": "2"}
    assert kube_expand("$(A) $(B) $(C) $$(A) $$$$ $x $", env) == "x y 2 $(C) $(A) $$ $x $"


def test_shipped_specs_keep_horovodrun_and_need_no_note(tmp_path: Path):
    """The MPIJob launcher's (and the TrainJob trainer's) mpirun stays horovodrun locally;
    chexflow's own stand-ins (the trainer's horovodrun and python) are quoted words, the user's
    words are joined raw."""
    checked = 0
    for path in sorted((REPO_ROOT / "katib" / "specs").glob("*.yaml")):
        exp = load_experiment(path, [])
        params = {p.name: (p.values[0] if p.values else p.min) for p in exp.parameters}
        spec = render_trial_spec(exp, "t1", params)
        checked += 1
        container, _ = primary_container(exp, spec)  # a TrainJob's: its trainer command
        assert quoting_note(container, "x") is None, path
        argv, _, ours = local_command_parts(exp, spec, {}, tmp_path, [])
        assert argv[:3] == quick_horovodrun() and ours == 9
        shell, dash_c, script = katib_wrap(argv, ours, "StdOut", str(tmp_path), {}, False)
        assert (shell, dash_c) == ("sh", "-c")
        assert script.startswith(f"{' '.join(argv[:3])} -np 2 -H localhost:2 --gloo {argv[8]} -m "
                                 "chexflow.train.worker ")
        assert script.endswith(f" 1>{tmp_path}/metrics.log 2>&1 && echo completed > "
                               f"{tmp_path}/$$.pid")
    assert checked >= 6


def test_words_after_an_sh_c_script_get_a_note():
    note = quoting_note({"command": ["sh", "-c", "echo $0", "x"]}, "c")
    assert note is not None and "become part of the script" in note


def _job(tmp_path: Path, container: dict, **template) -> Path:
    """The issue's Experiment with another container (and trialTemplate fields)."""
    spec = issue_experiment("audit", quoted=False)
    tt = spec["spec"]["trialTemplate"]
    pod = tt["trialSpec"]["spec"]["template"]
    pod["spec"]["containers"][0] = {"name": "main", "image": "python:3.11-slim", **container}
    for key, value in template.items():
        if key == "pod_labels":
            pod["metadata"] = {"labels": value}
        elif key == "categorical":
            spec["spec"]["parameters"] = [{"name": "x", "parameterType": "categorical",
                                           "feasibleSpace": {"list": value}}]
        else:
            tt[key] = value
    return write(tmp_path, spec)


@pytest.mark.slow
def test_kubelet_expansion_and_katibs_pid_file_reach_the_local_trial(tmp_path: Path):
    """`$(GREETING)` is the container's env value and `$$` one `$`, as the kubelet expands a
    command; KATIB_TRIAL_NAME is set (Katib's webhook), also for `$(KATIB_TRIAL_NAME)`."""
    spec = _job(tmp_path, {
        "command": ["sh", "-c", "echo $(GREETING) $$0 loss=${trialParameters.px} "
                                "$(KATIB_TRIAL_NAME) $KATIB_TRIAL_NAME"],
        "env": [{"name": "GREETING", "value": "hello"}]})
    run_chexflow("tune", spec, "--state", tmp_path / "s", "--no-progress", timeout=300)
    res = read_json(tmp_path / "s" / "results.json")
    for t in res["trials"]:
        log = (tmp_path / "s" / "trials" / t["trial"] / "stdout.log").read_text()
        assert f"hello sh loss={t['x']} {t['trial']} {t['trial']}\n" in log, log


@pytest.mark.slow
def test_a_missing_label_reference_is_refused_with_katibs_message(tmp_path: Path):
    spec = issue_experiment("audit", quoted=False)
    spec["spec"]["trialTemplate"]["trialParameters"].append(
        {"name": "team", "reference": "${trialSpec.Labels[team]}"})
    spec["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0][
        "command"].append("${trialParameters.team}")
    proc = run_chexflow("tune", write(tmp_path, spec), "--state", tmp_path / "s", "--dry-run",
                        check=False)
    assert proc.returncode != 0
    (line,) = proc.stderr.splitlines()
    assert ("spec.trialTemplate.trialParameters team: illegal reference of trial metadata: "
            "${trialSpec.Labels[team]}; failed to fetch Label: team") in line, line


def test_a_value_with_a_quote_breaks_the_trialspec_as_on_katib(tmp_path: Path):
    """Katib substitutes into the trialSpec's JSON text unescaped: `a"b` breaks it."""
    spec = _job(tmp_path, {"command": ["echo", "${trialParameters.px}"]},
                categorical=['a"b', 'a"c'])
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", "--dry-run", check=False)
    assert proc.returncode != 0
    (line,) = proc.stderr.splitlines()
    assert "break the trialSpec as Katib substitutes them" in line, line


@pytest.mark.slow
def test_primary_pod_labels_not_on_the_jobs_pod_leave_the_trial_without_metrics(tmp_path):
    """Katib's webhook wraps and collects only a pod with every primaryPodLabel: a Job whose
    pod lacks them runs (unwrapped) and ends MetricsUnavailable, with the reason."""
    spec = _job(tmp_path, {"command": ["sh", "-c", "echo loss=${trialParameters.px}"]},
                primaryPodLabels={"role": "main"}, pod_labels={"role": "other"})
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", "--no-progress", check=False,
                        timeout=300)
    res = read_json(tmp_path / "s" / "results.json")
    (t,) = res["trials"]
    assert t["status"] == "MetricsUnavailable", proc.stdout
    assert ('Katib injects no metrics collector: spec.trialTemplate.primaryPodLabels '
            '{"role": "main"} are not on the Job\'s pod') in proc.stdout


@pytest.mark.slow
def test_stdout_of_all_but_the_last_command_is_not_collected_as_on_katib(tmp_path: Path):
    """Katib appends `1>/var/log/katib/metrics.log 2>&1` to the joined line: in `a; b` only b's
    output reaches the collector (a's goes to the pod log), so the metric printed by `a` is
    never seen, and the trial is MetricsUnavailable on Katib and here."""
    spec = _job(tmp_path, {"command": ["sh", "-c",
                                       "echo loss=${trialParameters.px}; echo done"]})
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", "--no-progress", check=False,
                        timeout=300)
    res = read_json(tmp_path / "s" / "results.json")
    (t,) = res["trials"]
    assert t["status"] == "MetricsUnavailable", proc.stdout
    metrics_log = tmp_path / "s" / "trials" / t["trial"] / "metrics" / "metrics.log"
    assert metrics_log.read_text() == "done\n"
    log = (tmp_path / "s" / "trials" / t["trial"] / "stdout.log").read_text()
    assert f"loss={t['x']}\n" in log and "done\n" in log  # both shown to the user


def test_cluster_runs_print_the_note_before_contacting_the_cluster(tmp_path: Path):
    """`--cluster` says it first (Katib would run the trials later): here no cluster answers
    (an empty kubeconfig), and the note is out before that error."""
    spec = write(tmp_path, issue_experiment("quoting", quoted=False))
    (tmp_path / "kubeconfig").write_text("")
    proc = run_chexflow("tune", spec, "--cluster", "--dry-run", "--state", tmp_path / "s",
                        check=False, env={"KUBECONFIG": str(tmp_path / "kubeconfig")})
    assert proc.returncode != 0
    assert proc.stdout.startswith("note: spec.trialTemplate.trialSpec container 'main': word 3")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
