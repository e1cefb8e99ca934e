"""`chexflow tune` faced with bad flags and specs, and trial commands Katib changes: every flag
is checked (one line) before a trial starts; a dry run shows the commands a run executes; a
key given twice in a spec or template is refused as Kubernetes refuses it; a File collector's
path inside a `sh -c` string is rewritten, quoted for the shell; a command ending with a
newline (Katib loses its metrics) is refused up front; `loss=nan` is said to be no number."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from chexflow.envs import REPO_ROOT
from tests.conftest import CHEXFLOW, read_json, run_chexflow
from tests.katib_configmap_specs import configmap_spec
from tests.support.folders import read_only_folder as read_only

ONCE = "(YAML allows a key once; kubectl apply -f would silently keep the last: keep one)"
SPECS = REPO_ROOT / "katib" / "specs"
ONE_TRIAL = ["--set", "spec.maxTrialCount=1", "--set", "spec.parallelTrialCount=1"]


def job_experiment(container: dict, collector: dict | None = None) -> dict:
    """A batch-Job Experiment run by optuna (multivariate-tpe, seeded: the same suggestions in
    a dry run and a run): x in [0.1, 0.9] reaches the container as ${trialParameters.px};
    the volume `data` (an emptyDir) is mounted at /data."""
    return {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
        "metadata": {"name": "flags", "namespace": "default"},
        "spec": {
            "objective": {"type": "minimize", "objectiveMetricName": "loss"},
            "algorithm": {"algorithmName": "multivariate-tpe",
                          "algorithmSettings": [{"name": "random_state", "value": "7"}]},
            "parallelTrialCount": 1, "maxTrialCount": 2, "maxFailedTrialCount": 1,
            "parameters": [{"name": "x", "parameterType": "double",
                            "feasibleSpace": {"min": "0.1", "max": "0.9"}}],
            **({"metricsCollectorSpec": collector} if collector else {}),
            "trialTemplate": {
                "primaryContainerName": "main",
                "trialParameters": [{"name": "px", "reference": "x"}],
                "trialSpec": {"apiVersion": "batch/v1", "kind": "Job", "spec": {
                    "backoffLimit": 0, "template": {"spec": {
                        "restartPolicy": "Never",
                        "volumes": [{"name": "data", "emptyDir": {}}],
                        "containers": [{
                            "name": "main", "image": "python:3.11-slim",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            **container}]}}}}}}}


def sh_experiment(script: str, collector: dict | None = None) -> dict:
    """job_experiment whose container runs `sh -c SCRIPT`."""
    return job_experiment({"command": ["sh", "-c"], "args": [script]}, collector)


def write(tmp_path: Path, doc: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, width=1000))
    return path


def tune(spec: Path, *extra, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_chexflow("tune", spec, "--no-progress", *extra, check=False, timeout=300,
                        cwd=cwd)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line of a refused `chexflow tune` (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("chexflow tune: error: "), lines[0]
    return lines[0].removeprefix("chexflow tune: error: ")


def trials(state: Path) -> list[dict]:
    return read_json(state / "state.json")["trials"]


@pytest.fixture
def read_only_folder() -> Iterator[Path]:
    """An empty folder nothing can be written in (tests.support.folders)."""
    with read_only() as (folder, _):
        yield folder


# ---- 1. every flag is checked before a trial starts ----------------------------------------

@pytest.mark.parametrize("flags, expected", [
    pytest.param(["--timeout=nan"], "--timeout nan: must be in (0, 1000000000] seconds",
                 id="timeout-nan"),
    pytest.param(["--timeout=-5"], "--timeout -5.0: must be in (0, 1000000000] seconds",
                 id="timeout-negative"),
    pytest.param(["--timeout=inf"], "--timeout inf: must be in (0, 1000000000] seconds",
                 id="timeout-inf"),
    pytest.param(["--timeout=1e300"], "--timeout 1e+300: must be in (0, 1000000000] seconds",
                 id="timeout-huge"),
    pytest.param(["--timeout=soon"], "--timeout 'soon': expected a number of seconds in "
                 "(0, 1000000000]", id="timeout-garbage"),
    pytest.param(["--poll-interval=0"], "--poll-interval 0.0: must be in (0, 1000000000] "
                 "seconds", id="poll-interval-zero"),
    pytest.param(["--trial-arg", "epochs"], "--trial-arg 'epochs': expected NAME=VALUE (NAME an "
                 "option name of letters, digits, '_', '.' and '-'; VALUE not empty), e.g. "
                 "epochs=1", id="trial-arg-no-value"),
    pytest.param(["--volume", "data"], "--volume 'data': expected NAME=DIR (a trialSpec volume "
                 "and the local folder it is)", id="volume-no-folder"),
])
def test_a_bad_flag_is_one_line_and_no_trial_starts(tmp_path, flags, expected):
    """`--timeout nan` meant no timeout and `--timeout -5` started a trial: each flag is now
    refused, naming it and its range, before the trial command (which would leave a file) or
    the state folder is made."""
    marker = tmp_path / "trial-ran"
    spec = write(tmp_path, sh_experiment("echo loss=${trialParameters.px}"))
    proc = tune(spec, "--state", tmp_path / "s", "--trial-command", f"touch {marker}; "
                "echo loss=${trialParameters.px}", *flags)
    assert one_error_line(proc) == expected
    assert not marker.exists() and not (tmp_path / "s").exists()


def test_a_cluster_namespace_that_is_no_name_is_refused_before_the_cluster_is_asked(tmp_path):
    spec = write(tmp_path, sh_experiment("echo loss=${trialParameters.px}"))
    (tmp_path / "kubeconfig").write_text("")
    proc = run_chexflow("tune", spec, "--cluster", "--namespace", "Team_A", "--state",
                        tmp_path / "s", check=False,
                        env={"KUBECONFIG": str(tmp_path / "kubeconfig")})
    assert one_error_line(proc) == ("--namespace 'Team_A': not a namespace name (lower case "
                                    "letters, digits and '-', at most 63)")


# ---- 2. a state folder that cannot be written ----------------------------------------------

@pytest.mark.slow
def test_a_state_folder_that_cannot_be_written_is_one_line(tmp_path, read_only_folder):
    """A file, a path through a file, a read-only folder, and the default state folder
    (runs/tune/NAME) under a read-only working folder were an OSError traceback."""
    marker = tmp_path / "trial-ran"
    spec = write(tmp_path, sh_experiment("echo loss=${trialParameters.px}"))
    command = ["--trial-command", f"touch {marker}; echo loss=${{trialParameters.px}}"]
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    ro = read_only_folder
    reason = ("Read-only file system (EROFS)" if os.geteuid() == 0
              else "Permission denied (EACCES)")
    cases = [
        (["--state", blocker], f"--state {blocker}: {blocker} is not a folder"),
        (["--state", blocker / "s"], f"--state {blocker / 's'}: {blocker} is not a folder"),
        (["--state", ro / "s"], f"--state {ro / 's'}: cannot write in {ro} ({reason})"),
        ([], f"the state folder runs/tune/flags (--state): cannot write in {ro} ({reason})"),
    ]
    for flags, expected in cases:
        proc = tune(spec, *command, *flags, cwd=read_only_folder)
        assert one_error_line(proc) == f"{expected}; choose a folder you can write"
    assert not marker.exists() and list(read_only_folder.iterdir()) == []
    assert blocker.read_text() == "not a folder"


# ---- 3. a dry run shows what a run executes; a malformed --trial-arg ------------------------

@pytest.mark.slow
def test_a_dry_run_shows_exactly_the_command_a_run_executes(tmp_path):
    """`--dry-run` printed the template's `--epochs 5` although a run applies
    `--trial-arg epochs=1`: it now prints the command line the run records and executes."""
    spec = write(tmp_path, job_experiment(
        {"command": ["echo", "loss=${trialParameters.px}", "--epochs", "5"]}))
    state = tmp_path / "s p"  # a space: the local folders are quoted in the command line
    dry = tune(spec, "--state", state, "--dry-run", "--trial-arg", "epochs=1", *ONE_TRIAL)
    assert dry.returncode == 0, dry.stderr
    (entry,) = [json.loads(ln) for ln in dry.stdout.splitlines() if ln.startswith("{")]
    assert not state.exists()  # a dry run makes nothing
    run = tune(spec, "--state", state, "--trial-arg", "epochs=1", *ONE_TRIAL)
    assert run.returncode == 0, run.stdout + run.stderr
    (trial,) = trials(state)
    assert trial["parameters"] == entry["parameters"] and trial["status"] == "Succeeded"
    assert trial["command"] == [entry["command"].replace("flags-next1", trial["name"])]
    assert " --epochs 1 " in entry["command"] and "--epochs 5" not in entry["command"]
    assert trial["logs"]["loss"] == [pytest.approx(entry["parameters"]["x"])]


@pytest.mark.parametrize("item", ["garbage", "=1", "epochs=", "two words=1"])
def test_a_malformed_trial_arg_is_refused_up_front(tmp_path, item):
    spec = write(tmp_path, job_experiment(
        {"command": ["echo", "loss=${trialParameters.px}", "--epochs", "5"]}))
    line = one_error_line(tune(spec, "--state", tmp_path / "s", "--dry-run",
                               "--trial-arg", item))
    assert line.startswith(f"--trial-arg {item!r}: expected NAME=VALUE"), line


# ---- 4. a volume the trial template lacks ----------------------------------------------------

def test_a_volume_the_template_lacks_is_refused_locally_naming_its_volumes(tmp_path):
    spec = write(tmp_path, sh_experiment("echo loss=${trialParameters.px}"))
    for flags in (["--dry-run"], []):
        line = one_error_line(tune(spec, "--state", tmp_path / "s", "--volume",
                                   f"nosuchvol={tmp_path}", *flags))
        assert line == (f"{spec}: --volume nosuchvol={tmp_path}: spec.trialTemplate.trialSpec "
                        "has no volume 'nosuchvol' (its volumes: data)")
    assert not (tmp_path / "s").exists()


# ---- 5. a key given twice ------------------------------------------------------------------

def test_a_key_given_twice_in_a_spec_is_refused_with_both_lines(tmp_path):
    text = yaml.safe_dump(sh_experiment("echo loss=${trialParameters.px}"), sort_keys=False)
    lines = text.splitlines()
    at = lines.index("  maxTrialCount: 2")
    lines.insert(at + 1, "  maxTrialCount: 50")  # PyYAML kept the last: 50 trials
    spec = tmp_path / "exp.yaml"
    spec.write_text("\n".join(lines) + "\n")
    line = one_error_line(tune(spec, "--state", tmp_path / "s", "--dry-run"))
    assert line == (f"{spec}: line {at + 2}: mapping key \"maxTrialCount\" already defined at "
                    f"line {at + 1} {ONCE}")


def test_a_key_given_twice_in_a_configmap_or_its_template_is_refused_with_both_lines(tmp_path):
    """In the template text of the ConfigMap's data, the lines are the file's."""
    spec = configmap_spec("chexnet-random", tmp_path / "sweep")
    lines = (REPO_ROOT / "katib" / "trial-templates.yaml").read_text().splitlines()
    image = next(i for i, ln in enumerate(lines) if ln.strip().startswith("image: "))
    name = next(i for i, ln in enumerate(lines) if ln.startswith("  name: "))
    for at, extra, key in ((image, lines[image].replace("image: ", "image: other-"), "image"),
                           (name, "  name: other", "name")):
        edited = tmp_path / "templates.yaml"
        edited.write_text("\n".join([*lines[:at + 1], extra, *lines[at + 1:]]) + "\n")
        line = one_error_line(tune(spec, "--trial-templates", edited, "--state",
                                   tmp_path / "s", "--dry-run"))
        where = ("ConfigMap kubeflow/chexflow-trial-templates (chexnet-mpijob.yaml): "
                 if key == "image" else "")
        assert line == (f"{edited}: {where}line {at + 2}: mapping key \"{key}\" already defined "
                        f"at line {at + 1} {ONCE}")


# ---- 6. a collector's path inside a `sh -c` string ------------------------------------------

@pytest.mark.slow
def test_a_file_collector_path_in_a_sh_c_string_is_rewritten_and_quoted(tmp_path):
    """The File collector's path written unquoted, in double quotes and in single quotes of a
    `sh -c` script became the trial's local folder nowhere (the trial wrote to the container
    path and failed); with a state folder whose name has a space and a quote."""
    path = "/chexflow-test-metrics/out/metrics.log"
    spec = write(tmp_path, sh_experiment(
        f"sleep 1; echo loss=${{trialParameters.px}} > {path} && echo \"wrote {path}\" && "
        f"cat '{path}'",
        collector={"collector": {"kind": "File"},
                   "source": {"fileSystemPath": {"path": path, "kind": "File"}}}))
    state = tmp_path / "st ate's"
    proc = tune(spec, "--state", state, *ONE_TRIAL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (trial,) = trials(state)
    assert trial["status"] == "Succeeded", trial["message"]
    local = state / "trials" / trial["name"] / "metrics" / "metrics.log"
    assert local.read_text() == f"loss={trial['parameters']['x']}\n"
    log = (state / "trials" / trial["name"] / "stdout.log").read_text().splitlines()
    assert log[1:] == [f"wrote {local}", f"loss={trial['parameters']['x']}"]


# ---- 7. a command ending with a newline ------------------------------------------------------

@pytest.mark.parametrize("kind, why", [
    ("StdOut", "its redirection `1>/var/log/katib/metrics.log 2>&1` becomes a line of its own, "
     "the trial's output is never collected and the trial ends MetricsUnavailable"),
    ("File", "its `&& echo completed > ...` becomes a line of its own, which sh refuses "
     "(Syntax error: \"&&\" unexpected) after the trial ran, and the trial fails"),
])
def test_a_command_ending_with_a_newline_is_refused_saying_why_and_how(tmp_path, kind, why):
    """A YAML block scalar `|` ends the script with a newline; Katib appends its words after it
    (wrapWorkerContainer), so they are a line of their own: the trial ran and its metrics
    were lost, with no hint. The spec check says so before anything runs."""
    collector = {"collector": {"kind": kind}}
    if kind == "File":
        collector["source"] = {"fileSystemPath": {"path": "/out/metrics.log", "kind": "File"}}
    text = yaml.safe_dump(sh_experiment("SCRIPT", collector), sort_keys=False)
    item = next(ln for ln in text.splitlines() if ln.strip() == "- SCRIPT")
    indent = " " * (len(item) - len(item.lstrip()) + 2)
    spec = tmp_path / "exp.yaml"
    spec.write_text(text.replace(f"{item}\n", f"{item[:-len('SCRIPT')]}|\n"
                                               f"{indent}echo loss=${{trialParameters.px}}\n"))
    container = yaml.safe_load(spec.read_text())["spec"]["trialTemplate"]["trialSpec"]["spec"][
        "template"]["spec"]["containers"][0]
    assert container["args"] == ["echo loss=${trialParameters.px}\n"]  # what `|` gives
    line = one_error_line(tune(spec, "--state", tmp_path / "s", "--dry-run"))
    assert line == (f"{spec}: spec.trialTemplate.trialSpec container 'main': args[0]: ends with "
                    "a newline (a YAML block scalar `|` keeps one): Katib's metrics collector "
                    f"appends its words to the command after it, so {why}; write `|-` to drop "
                    "the final newline")


# ---- 8. a metric printed as nan --------------------------------------------------------------

@pytest.mark.parametrize("how", ["trialSpec", "--trial-command"])
def test_a_metric_printed_as_nan_is_said_to_be_no_number(tmp_path, how):
    """`loss=nan` matches Katib's metricsFormat with an empty value, no number: the trial has
    no objective, and says what was printed instead of "never reported"."""
    spec = write(tmp_path, sh_experiment("sleep 1; echo epoch=1 loss=nan ${trialParameters.px}"))
    extra = ["--trial-command", "sleep 1; echo epoch=1 loss=nan"] if how != "trialSpec" else []
    proc = tune(spec, "--state", tmp_path / "s", *ONE_TRIAL, *extra)
    (trial,) = trials(tmp_path / "s")
    assert trial["status"] == "MetricsUnavailable", proc.stdout
    assert trial["message"] == ("objective metric loss was printed as 'nan', not a number "
                                "Katib's metrics collector can parse")
    assert f"({trial['message']})" in proc.stdout


# ---- the property: any value of any flag -----------------------------------------------------

@pytest.mark.slow
def test_any_flag_value_is_accepted_or_refused_in_one_line_before_any_trial(tmp_path):
    """Over tune's flags (valid values, out of range, nan/inf, garbage): `chexflow tune
    --dry-run` either accepts them (exit 0) or refuses them in one line (exit 2), never with a
    traceback, and never makes the state folder or starts a trial."""
    spec = write(tmp_path, sh_experiment("echo loss=${trialParameters.px}"))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    folder = tmp_path / "data"
    folder.mkdir()
    marker = tmp_path / "trial-ran"
    garbage = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
    number = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.integers(-10**12, 10**12).map(str), garbage)
    path = st.one_of(st.sampled_from([str(blocker), str(blocker / "s"), "/proc/x", "",
                                      str(folder), str(tmp_path / "new" / "deep")]), garbage)
    flag = st.one_of(
        st.tuples(st.sampled_from(["--timeout", "--poll-interval"]), number),
        st.tuples(st.just("--trial-arg"), st.one_of(garbage, st.builds(
            "{}={}".format, st.sampled_from(["epochs", "lr", "", "a b", "--x"]), garbage))),
        st.tuples(st.just("--set"), st.builds(
            "{}={}".format, st.sampled_from([
                "spec.parallelTrialCount", "spec.maxTrialCount", "spec.maxFailedTrialCount",
                "spec.parameters[0].feasibleSpace.max", "spec.objective.goal", "spec.nothing",
                "metadata.name", "spec.algorithm.algorithmName"]), number)),
        st.tuples(st.just("--volume"), st.builds(
            "{}={}".format, st.sampled_from(["data", "nosuchvol", ""]), path)),
        st.tuples(st.just("--state"), path),
    )

    outcomes = []

    # each example is a `chexflow tune` process: no shrinking (minutes of processes; a failing
    # example is short already), a fixed sequence of examples
    @settings(max_examples=30, derandomize=True, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.lists(flag, min_size=1, max_size=3))
    def check(flags):
        state = tmp_path / "state"
        argv = [f"{name}={value}" for name, value in flags]
        if not any(name == "--state" for name, _ in flags):
            argv.append(f"--state={state}")
        proc = subprocess.run(
            [*CHEXFLOW, "tune", str(spec), "--dry-run", "--trial-command",
             f"touch {marker}; echo loss=1", *argv],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert "Traceback" not in proc.stderr, (argv, proc.stderr)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (argv, proc.stderr)
            assert lines[0].startswith("chexflow tune: error: "), (argv, proc.stderr)
        assert not marker.exists() and not state.exists(), argv
        outcomes.append(proc.returncode)

    check()
    assert {0, 2} <= set(outcomes), outcomes  # the examples reached both answers


def test_a_worker_count_set_without_its_gang_is_refused_naming_both(tmp_path: Path):
    """`--set` of Worker.replicas alone leaves the shipped minAvailable above the workers: on a
    gang-scheduling cluster the Trial would wait forever, so the spec check refuses it."""
    worker = "spec.trialTemplate.trialSpec.spec.mpiReplicaSpecs.Worker.replicas"
    proc = run_chexflow("tune", SPECS / "chexnet-random.yaml", "--dry-run", "--state",
                        tmp_path / "s", "--set", f"{worker}=1", check=False)
    assert proc.returncode == 2, proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert "schedulingPolicy.minAvailable: a gang of 2 pods" in line
    assert "Worker.replicas 1" in line and "set minAvailable to 1" in line
    ok = run_chexflow("tune", SPECS / "chexnet-random.yaml", "--dry-run", "--state",
                      tmp_path / "s", "--set", f"{worker}=1", "--set",
                      "spec.trialTemplate.trialSpec.spec.runPolicy.schedulingPolicy"
                      ".minAvailable=1")
    assert "--batch-size" in ok.stdout
