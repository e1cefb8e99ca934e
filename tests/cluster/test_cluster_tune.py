"""`chexflow tune --cluster` against the local apiserver with Katib v0.19.0's Experiment, Trial
and Suggestion CRDs. No Katib controller runs here: each test creates the Trials and writes
Trial and Experiment status as katib-controller writes them (trial_controller_util.go,
experiment status_util.go: conditions, observation, counters, currentOptimalTrial), and checks
what the command sends, prints, writes and deletes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from chexflow.katib.experiment.model import format_value
from chexflow.katib.experiment.spec import load_experiment
from chexflow.katib.local.results import load_results
from chexflow.katib.suggestions.libraries import make_suggester
from tests.katib_configmap_specs import configmap_spec
from tests.rbac_requests import Access, StatusRecorder, granted
from tests.support.katib import in_feasible_space

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"
SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-random.yaml"
NAME = yaml.safe_load(SPEC.read_text())["metadata"]["name"]
SETS = ["spec.maxTrialCount=3", "spec.parallelTrialCount=2"]
SMALL = [a for s in SETS for a in ("--set", s)]
METRICS = "echo val_auroc=0.71 images_per_sec=12 val_loss=0.4"


class Tune:
    """`chexflow tune SPEC --cluster ...` in a subprocess, its stdout read line by line."""

    def __init__(self, *args: str, kubeconfig: Path | None = None, spec: Path = SPEC):
        env = {**os.environ, **({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chexflow.cli", "tune", str(spec), "--cluster", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, text: str, timeout: float = 60) -> None:
        wait_for(f"a line with {text!r} (got {self.lines})",
                 lambda: any(text in x for x in self.lines) or self.proc.poll() is not None,
                 timeout)
        assert any(text in x for x in self.lines), (self.lines, self.proc.stderr.read())

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        err = self.proc.stderr.read() if self.proc.wait(timeout=timeout) is not None else ""
        self.reader.join(timeout=10)
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_for(what: str, check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout:.0f} s")
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def katib_label(request) -> None:
    """The test's namespace carries the label Katib's webhook asks of an Experiment's namespace
    (tune --cluster checks it before anything is sent, as Katib would refuse it)."""
    if "k8s_namespace" not in request.fixturenames:
        return
    from kubernetes import client

    from chexflow.katib.cluster.kubernetes import INJECTION_LABEL

    client.CoreV1Api(request.getfixturevalue("k8s_api")).patch_namespace(
        request.getfixturevalue("k8s_namespace"),
        {"metadata": {"labels": dict([INJECTION_LABEL])}})


class KatibControllerStandIn:
    """Writes what katib-controller writes for one Experiment: Trials (labelled and owned by the
    Experiment, with its objective and the assignment), their conditions and observation, and
    the Experiment's status."""

    def __init__(self, api, ns: str):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.ns = ns

    def experiment(self, timeout: float = 60) -> dict:
        found: list = []

        def created() -> bool:
            found[:] = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                                 PLURAL)["items"]
            return bool(found)
        wait_for("Experiment created", created, timeout)
        return found[0]

    def create_trial(self, exp: dict, name: str, assignment: dict[str, str]) -> None:
        spec = exp["spec"]
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "trials", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial",
            "metadata": {"name": name, "labels": {"katib.kubeflow.org/experiment": NAME},
                         "ownerReferences": [{
                             "apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment",
                             "name": NAME, "uid": exp["metadata"]["uid"], "controller": True,
                             "blockOwnerDeletion": True}]},
            "spec": {"objective": spec["objective"],
                     "parameterAssignments": [{"name": k, "value": v}
                                              for k, v in assignment.items()],
                     "primaryContainerName": spec["trialTemplate"]["primaryContainerName"],
                     "successCondition": spec["trialTemplate"]["successCondition"],
                     "failureCondition": spec["trialTemplate"]["failureCondition"],
                     "metricsCollector": spec["metricsCollectorSpec"]}})
        self.trial_status(name, [("Created", "True", "TrialCreated", "Trial is created")])

    def trial_status(self, name: str, conditions: list[tuple], metrics: dict | None = None,
                     ) -> None:
        status: dict = {"startTime": "2026-11-23T10:00:00Z", "conditions": [
            {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}
        if metrics is not None:
            status["observation"] = {"metrics": [
                {"name": k, "min": lo, "max": hi, "latest": last}
                for k, (lo, hi, last) in metrics.items()]}
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.ns, "trials",
                                                          name, {"status": status})

    def experiment_status(self, **status) -> None:
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.ns, PLURAL, NAME,
                                                          {"status": status})

    def trials(self) -> list[str]:
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                          "trials")["items"]
        return [t["metadata"]["name"] for t in items if not t["metadata"].get("deletionTimestamp")]


CREATED = ("Created", "True", "TrialCreated", "Trial is created")
RUNNING = ("Running", "True", "TrialRunning", "Trial is running")
RAN = ("Running", "False", "TrialRunning", "Trial is running")
FAILED_MESSAGE = ("Trial has failed. Job message: MPIJob kubeflow/chexnet-random-b failed: "
                  "launcher exited 2 (chexflow train: error: --data /mnt/chexflow/x: no "
                  "manifest.json there)")
OBSERVED = {"val_auroc": ("0.61", "0.83", "0.8"), "images_per_sec": ("90", "120", "110.5"),
            "val_loss": ("0.15", "0.3", "0.16")}


def katib_random_assignments(n: int, overrides: list[str]) -> list[dict[str, str]]:
    """The first n assignments of the spec's algorithm (random: hyperopt, random_state 7), as
    strings, as Katib's suggestion service hands them to the Trials."""
    exp = load_experiment(SPEC, overrides)
    suggestions = make_suggester(exp, 7, {}).suggest([], n)
    return [{p.name: format_value(p, s.parameters[p.name]) for p in exp.parameters}
            for s in suggestions]


def optimal_status(assignment: dict[str, str], best: str) -> dict:
    return {"bestTrialName": best,
            "parameterAssignments": [{"name": k, "value": v} for k, v in assignment.items()],
            "observation": {"metrics": [{"name": k, "min": lo, "max": hi, "latest": last}
                                        for k, (lo, hi, last) in OBSERVED.items()]}}


def test_tune_cluster_dry_run_is_accepted_and_creates_nothing(k8s_api, k8s_namespace):
    from kubernetes import client

    tune = Tune("--namespace", k8s_namespace, "--dry-run")
    code, err = tune.finish()
    assert code == 0, err
    assert any("accepted by the API server (dry run)" in x for x in tune.lines)
    items = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, PLURAL)["items"]
    assert items == []


def test_tune_cluster_sends_set_trial_arg_volume_streams_progress_and_writes_results_with_status_written_as_katib_controller_writes_it(  # noqa: E501
        k8s_api, k8s_namespace, tmp_path):
    ns, state = k8s_namespace, tmp_path / "state"
    katib = KatibControllerStandIn(k8s_api, ns)
    tune = Tune("--namespace", ns, "--state", str(state), "--poll-interval", "0.3",
                "--timeout", "300", *SMALL, "--trial-arg", "epochs=1", "--trial-arg",
                "image-size=64", "--volume", "data=run-7-data")
    try:
        exp = katib.experiment()
        # what was sent: --set, --trial-arg in the launcher's command, --volume as the claim
        assert exp["metadata"]["name"] == NAME
        assert exp["spec"]["maxTrialCount"] == 3 and exp["spec"]["parallelTrialCount"] == 2
        replicas = exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["mpiReplicaSpecs"]
        args = replicas["Launcher"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--epochs") + 1] == "1"
        assert args[args.index("--image-size") + 1] == "64"
        for role in ("Launcher", "Worker"):
            volumes = replicas[role]["template"]["spec"]["volumes"]
            assert volumes[0] == {"name": "data",
                                  "persistentVolumeClaim": {"claimName": "run-7-data"}}
        tune.wait_line("trials: running=0 succeeded=0 failed=0 early-stopped=0 "
                       "metrics-unavailable=0")

        a, b, c = (f"{NAME}-{s}" for s in ("a", "b", "c"))
        assignments = katib_random_assignments(3, SETS)
        for name, assignment in zip((a, b), assignments, strict=False):
            katib.create_trial(exp, name, assignment)
            katib.trial_status(name, [CREATED, RUNNING])
        katib.experiment_status(
            conditions=[{"type": "Created", "status": "True", "reason": "ExperimentCreated"},
                        {"type": "Running", "status": "True", "reason": "ExperimentRunning"}],
            trials=2, trialsRunning=2, runningTrialList=[a, b])
        tune.wait_line("trials: running=2 succeeded=0 failed=0")

        katib.trial_status(a, [CREATED, RAN, ("Succeeded", "True", "TrialSucceeded",
                                              "Trial has succeeded")], OBSERVED)
        katib.trial_status(b, [CREATED, RAN, ("Failed", "True", "TrialFailed",
                                              FAILED_MESSAGE)])
        katib.create_trial(exp, c, assignments[2])
        katib.trial_status(c, [CREATED, RUNNING])
        katib.experiment_status(trials=3, trialsRunning=1, trialsSucceeded=1, trialsFailed=1,
                                currentOptimalTrial=optimal_status(assignments[0], a))
        tune.wait_line(f"trial {b} Failed")
        tune.wait_line("trials: running=1 succeeded=1 failed=1 early-stopped=0 "
                       f"metrics-unavailable=0; best so far: {a} val_auroc=0.83")

        katib.trial_status(c, [CREATED, RAN, ("MetricsUnavailable", "True", "MetricsUnavailable",
                                              "Metrics are not available")],
                           {"val_auroc": ("unavailable", "unavailable", "unavailable")})
        katib.experiment_status(
            conditions=[{"type": "Created", "status": "True", "reason": "ExperimentCreated"},
                        {"type": "Running", "status": "False", "reason": "ExperimentRunning"},
                        {"type": "Succeeded", "status": "True",
                         "reason": "ExperimentMaxTrialsReached",
                         "message": "Experiment has succeeded because max trial count has "
                                    "reached"}],
            trialsRunning=0, trialMetricsUnavailable=1)
        code, err = tune.finish()
    finally:
        tune.kill()
    assert code == 0, err
    out = tune.lines
    progress = [x for x in out if x.startswith("trials: ")]
    assert len(progress) == len(set(progress)) == 4  # one line per change, no repeats
    assert progress[-1] == ("trials: running=0 succeeded=1 failed=1 early-stopped=0 "
                            f"metrics-unavailable=1; best so far: {a} val_auroc=0.83")
    ended = [x for x in out if x.startswith(f"trial {NAME}-")]
    assert len(ended) == 3
    assert any(x.startswith(f"trial {b} Failed: ") and x.endswith(f"({FAILED_MESSAGE})")
               for x in ended)
    assert any(x.startswith(f"trial {c} MetricsUnavailable: ")
               and x.endswith("(Metrics are not available)") for x in ended)
    assert f"experiment {NAME}: Succeeded (ExperimentMaxTrialsReached: " in "\n".join(out)

    results = load_results(state)
    assert [(t["trial"], t["status"]) for t in results["trials"]] == [
        (a, "Succeeded"), (b, "Failed"), (c, "MetricsUnavailable")]
    assert results["trials"][1]["message"] == FAILED_MESSAGE
    assert results["where"] == f"on the cluster, namespace {ns}"
    for name in ("results.csv", "results.html", "objective.png", "experiment.json"):
        assert (state / name).stat().st_size > 0, name
    optimal = json.loads((state / "optimal.json").read_text())
    assert optimal["trial"] == a and optimal["experiment"] == NAME
    assert optimal["condition"] == "ExperimentMaxTrialsReached"
    assert optimal["metrics"] == {"val_auroc": 0.83, "val_loss": 0.15, "images_per_sec": 110.5}
    spec = load_experiment(SPEC)
    assert optimal["parameters"] == {p.name: p.typed(assignments[0][p.name])
                                     for p in spec.parameters}


def test_same_spec_locally_and_on_the_cluster_gives_results_one_reader_loads_with_the_same_parameter_names_and_types(  # noqa: E501
        k8s_api, k8s_namespace, tmp_path):
    """Local: the runner's random (hyperopt, random_state 7) with a trial command; cluster: the
    same algorithm and seed's assignments written into Trials as Katib's service hands them
    (strings). Both results.json load with load_results and agree on names, types and space."""
    local = subprocess.run(
        [sys.executable, "-m", "chexflow.cli", "tune", str(SPEC), "--state",
         str(tmp_path / "local"), "--no-progress", *SMALL, "--trial-command", METRICS],
        capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr

    ns = k8s_namespace
    katib = KatibControllerStandIn(k8s_api, ns)
    tune = Tune("--namespace", ns, "--state", str(tmp_path / "cluster"), "--poll-interval",
                "0.3", "--timeout", "300", *SMALL)
    try:
        exp = katib.experiment()
        assignments = katib_random_assignments(3, SETS)
        names = [f"{NAME}-{i}" for i in range(3)]
        for name, assignment in zip(names, assignments, strict=True):
            katib.create_trial(exp, name, assignment)
            katib.trial_status(name, [CREATED, RAN, ("Succeeded", "True", "TrialSucceeded",
                                                     "Trial has succeeded")],
                               {"val_auroc": ("0.71", "0.71", "0.71"),
                                "images_per_sec": ("12", "12", "12"),
                                "val_loss": ("0.4", "0.4", "0.4")})
        katib.experiment_status(
            conditions=[{"type": "Succeeded", "status": "True",
                         "reason": "ExperimentMaxTrialsReached", "message": "max trials"}],
            trials=3, trialsSucceeded=3, currentOptimalTrial={
                "bestTrialName": names[0],
                "parameterAssignments": [{"name": k, "value": v}
                                         for k, v in assignments[0].items()],
                "observation": {"metrics": [{"name": "val_auroc", "min": "0.71",
                                             "max": "0.71", "latest": "0.71"}]}})
        code, err = tune.finish()
    finally:
        tune.kill()
    assert code == 0, err

    spec = load_experiment(SPEC, SETS)
    params = [p.name for p in spec.parameters]
    loaded = {where: load_results(tmp_path / where) for where in ("local", "cluster")}
    for where, results in loaded.items():
        assert len(results["trials"]) == 3, where
        for t in results["trials"]:
            assert [k for k in t if k in params] == params, where
            for p in spec.parameters:
                assert in_feasible_space(p, t[p.name]), (where, p.name, t[p.name])
    types = {where: [{k: type(t[k]).__name__ for k in params} for t in r["trials"]]
             for where, r in loaded.items()}
    assert types["local"] == types["cluster"] == [
        {"lr": "float", "batch-size": "int", "optimizer": "str", "weight-decay": "float"}] * 3
    assert loaded["local"]["trials"][0]["val_auroc"] == loaded["cluster"]["trials"][0][
        "val_auroc"] == pytest.approx(0.71)
    for where in ("local", "cluster"):
        optimal = json.loads((tmp_path / where / "optimal.json").read_text())
        assert set(optimal) == {"trial", "parameters", "metrics", "experiment", "condition"}
        assert list(optimal["parameters"]) == params


@pytest.mark.parametrize("sig, last_line, code", [
    (signal.SIGTERM, "chexflow tune: error: stopped by SIGTERM: deleted experiment {ns}/"
                     f"{NAME} and its trials", 2),
    (signal.SIGINT, "chexflow tune: interrupted", 130),
    (None, "chexflow tune: error: not finished after 8 s: deleted experiment {ns}/"
           f"{NAME} and its trials", 2),
], ids=["sigterm", "ctrl-c", "timeout"])
def test_stopping_tune_cluster_deletes_the_experiment_and_its_trials(
        k8s_api, k8s_namespace, tmp_path, sig, last_line, code):
    ns = k8s_namespace
    katib = KatibControllerStandIn(k8s_api, ns)
    tune = Tune("--namespace", ns, "--poll-interval", "0.3", "--state", str(tmp_path / "s"),
                "--timeout", "8" if sig is None else "300")
    try:
        exp = katib.experiment()
        katib.create_trial(exp, f"{NAME}-a", katib_random_assignments(1, [])[0])
        tune.wait_line("trials: running=0")
        if sig is not None:
            tune.proc.send_signal(sig)
        code_, err = tune.finish()
    finally:
        tune.kill()
    assert code_ == code, err
    assert err.strip().splitlines()[-1] == last_line.format(ns=ns)
    assert "Traceback" not in err
    if sig == signal.SIGINT:
        assert tune.lines[-1] == f"interrupted: deleted experiment {ns}/{NAME} and its trials"

    def gone() -> bool:
        return not katib.custom.list_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL)["items"] and not katib.trials()
    wait_for("Experiment and its Trial deleted (garbage collector)", gone, timeout=60)


def test_tune_cluster_creates_a_specs_configmap_template_and_replaces_it_only_when_asked(
        k8s_api, k8s_namespace, tmp_path):
    """A spec naming ConfigMap chexflow-trial-templates beside it: --cluster creates it in
    --namespace from katib/trial-templates.yaml before the Experiment; one that differs there
    (another Experiment may read it) is refused, after the unified diff, and replaced with
    --update-templates (a key of its own that the ConfigMap has stays)."""
    from kubernetes import client

    ns, core = k8s_namespace, client.CoreV1Api(k8s_api)
    spec = configmap_spec("chexnet-random", tmp_path / "sweep")
    templates = tmp_path / "sweep" / "trial-templates.yaml"
    (shipped,) = [d for d in yaml.safe_load_all(templates.read_text()) if d]
    name = shipped["metadata"]["name"]

    def run(experiment: str, *extra: str, ends: str = "not finished after 3 s") -> list[str]:
        tune = Tune("--namespace", ns, "--state", str(tmp_path / experiment), "--timeout", "3",
                    "--poll-interval", "0.3", "--set", f"metadata.name={experiment}", *extra,
                    spec=spec)
        code, err = tune.finish()
        assert code == 2 and ends in err, err
        return tune.lines

    lines = run("first")
    assert f"ConfigMap {ns}/{name}: created from {templates} (the trial template Katib reads)" \
        in lines, lines
    made = core.read_namespaced_config_map(name, ns)
    assert made.data == shipped["data"] and made.metadata.labels == shipped["metadata"]["labels"]
    core.patch_namespaced_config_map(name, ns, {"data": {"chexnet-mpijob.yaml": "edited\n",
                                                         "mine.yaml": "kept"}})
    lines = run("second", ends=f"ConfigMap {ns}/{name}: chexnet-mpijob.yaml on the cluster "
                               f"differs from {templates} (the diff above)")
    assert lines[:2] == [f"--- ConfigMap {ns}/{name}: chexnet-mpijob.yaml (on the cluster)",
                         f"+++ {templates}: chexnet-mpijob.yaml"], lines
    assert lines[2].startswith("@@ -1 +1,") and "-edited" in lines and \
        "+apiVersion: kubeflow.org/v2beta1" in lines
    assert core.read_namespaced_config_map(name, ns).data["chexnet-mpijob.yaml"] == "edited\n"
    assert not client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL)["items"]  # refused before the Experiment
    lines = run("third", "--update-templates")
    assert f"ConfigMap {ns}/{name}: updated from {templates} (the trial template Katib reads)" \
        in lines, lines
    assert core.read_namespaced_config_map(name, ns).data == {**shipped["data"],
                                                              "mine.yaml": "kept"}
    assert f"ConfigMap {ns}/{name}: as in {templates}" in run("fourth")


def test_tune_cluster_into_a_namespace_without_katibs_label_is_one_line_with_the_command(
        k8s_api, k8s_namespace, tmp_path):
    """Katib refuses an Experiment in a namespace without its label; tune says so first, with
    the kubectl command that adds it, and sends nothing."""
    from kubernetes import client

    from chexflow.katib.cluster.kubernetes import INJECTION_LABEL

    ns = k8s_namespace
    client.CoreV1Api(k8s_api).patch_namespace(ns, {"metadata": {"labels": {
        INJECTION_LABEL[0]: None}}})
    tune = Tune("--namespace", ns, "--state", str(tmp_path / "s"))
    code, err = tune.finish()
    assert code == 2
    assert err.strip().splitlines() == [
        f"chexflow tune: error: namespace {ns} lacks the label {INJECTION_LABEL[0]}: enabled, "
        f"without which Katib refuses an Experiment there: kubectl label namespace {ns} "
        f"{INJECTION_LABEL[0]}=enabled"]
    assert not client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL)["items"]


def test_tune_service_account_from_katib_rbac_yaml_follows_an_experiment_to_a_failed_suggestion_and_nothing_more(  # noqa: E501
        k8s_cluster, k8s_api, k8s_namespace, tmp_path):
    """The tune step's account (katib/rbac.yaml) runs the whole command: create, follow, read
    Trials and the Suggestion (Katib's "Suggestion has failed" gets the Suggestion's reason, as
    katib-controller writes both), delete; it may not touch anything else."""
    from kubernetes import client, utils
    from kubernetes.client.rest import ApiException

    from chexflow.katib.cluster.kubernetes import ClusterSweep, cluster_experiment, run_on_cluster

    ns = k8s_namespace
    docs = [d for d in yaml.safe_load_all((REPO_ROOT / "katib" / "rbac.yaml").read_text()) if d]
    sa = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    utils.create_from_yaml(k8s_api, yaml_objects=docs, namespace=ns)
    as_sa = k8s_cluster.api_client()
    as_sa.set_default_header("Impersonate-User", f"system:serviceaccount:{ns}:{sa}")
    recorder = StatusRecorder(as_sa)

    # as the tune step sends it: its --volume data=PVC inlines the ConfigMap's template (the
    # account writes no ConfigMap)
    exp = cluster_experiment(load_experiment(SPEC, SETS), ns, [], {"data": "run-pvc"})
    assert "configMap" not in exp.raw["spec"]["trialTemplate"]
    lines: list[str] = []
    outcome: dict = {}

    def tune() -> None:
        try:
            outcome["summary"] = run_on_cluster(exp, tmp_path / "state", 120, 0.3, False,
                                                lines.append, api_client=as_sa)
        except Exception as e:  # reported by the assertion below
            outcome["error"] = e
    thread = threading.Thread(target=tune)
    thread.start()
    katib = KatibControllerStandIn(k8s_api, ns)
    katib.create_trial(katib.experiment(), f"{NAME}-a", katib_random_assignments(1, SETS)[0])
    katib.trial_status(f"{NAME}-a", [CREATED, RUNNING])
    katib.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "suggestions", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Suggestion", "metadata": {"name": NAME},
        "spec": {"algorithm": {"algorithmName": "random"}, "requests": 2}})
    katib.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "suggestions", NAME, {
        "status": {"conditions": [{
            "type": "Failed", "status": "True", "reason": "SuggestionFailed",
            "message": "Validation failed: random_state should be great or equal than zero"}]}})
    katib.experiment_status(conditions=[{"type": "Failed", "status": "True",
                                         "reason": "ExperimentFailed",
                                         "message": "Suggestion has failed"}],
                            trials=1, trialsRunning=1)
    thread.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["summary"]["condition"]["message"] == (
        "Suggestion has failed: Validation failed: random_state should be great or equal than "
        "zero")
    assert [t["status"] for t in outcome["summary"]["trials"]] == ["Running"]
    assert any(x.startswith("trials: running=0") for x in lines)

    ClusterSweep(exp, tmp_path / "state", 10, 0.3, lines.append, as_sa).delete()
    wait_for("Experiment deleted", lambda: not katib.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL)["items"])
    # what the command asked for was granted, but the reads it goes on without (katib/rbac.yaml)
    assert set(recorder.refused()) <= {Access("", "namespaces", "get", True),
                                       Access("", "services", "get", True)}
    rbac = REPO_ROOT / "katib" / "rbac.yaml"
    assert recorder.used() - set(recorder.refused()) <= granted(rbac)
    custom, core = client.CustomObjectsApi(as_sa), client.CoreV1Api(as_sa)
    for forbidden in (lambda: core.list_namespaced_secret(ns),
                      lambda: core.list_namespaced_config_map(ns),
                      lambda: custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL),
                      lambda: custom.patch_namespaced_custom_object_status(
                          GROUP, VERSION, ns, PLURAL, NAME, {"status": {}}),
                      lambda: custom.create_namespaced_custom_object(
                          GROUP, "v2beta1", ns, "mpijobs", {"metadata": {"name": "x"}})):
        with pytest.raises(ApiException) as err:
            forbidden()
        assert err.value.status == 403, err.value.body
