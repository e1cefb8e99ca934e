"""`chexflow tune --cluster` without a cluster: what it sends (--set, --trial-arg, --volume
NAME=PVC, or a one-line refusal) and how it reads Katib's Trial and Experiment objects into the
local runner's results. The objects here are shaped as Katib v0.19.0's controller writes them
(trial_controller_util.go, experiment status_util.go); tests/cluster/test_cluster_tune.py does
the same against the apiserver with Katib's CRDs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chexflow.errors import ChexflowError
from chexflow.katib.cluster.kubernetes import (
    ClusterError,
    cluster_experiment,
    failure_line,
    optimal_from_status,
    parse_claims,
    progress_line,
    trial_records,
)
from chexflow.katib.experiment.spec import load_experiment
from chexflow.katib.experiment.trialspec import render_trial_spec
from chexflow.katib.local.results import load_results, write_results
from tests.conftest import run_chexflow
from tests.katib_configmap_specs import configmap_spec
from tests.support.katib import local_command

SPEC = Path(__file__).resolve().parent.parent / "katib" / "specs" / "chexnet-random.yaml"
TRIAL_ARGS = ["epochs=1", "image-size=64", "weights=none", "steps-per-epoch=2",
              "data=/srv/r1/data"]  # outside the volume: the same path locally


def pod_specs(exp) -> dict[str, dict]:
    replicas = exp.raw["spec"]["trialTemplate"]["trialSpec"]["spec"]["mpiReplicaSpecs"]
    return {role: r["template"]["spec"] for role, r in replicas.items()}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cluster_sets_trial_args_in_the_trialspec_as_a_local_trial_gets_them(tmp_path):
    exp = load_experiment(SPEC, ["spec.maxTrialCount=3"])
    sent = cluster_experiment(exp, "team-a", TRIAL_ARGS, {})
    assert sent.raw["metadata"]["namespace"] == "team-a" and sent.namespace == "team-a"
    assert sent.raw["spec"]["maxTrialCount"] == 3  # --set
    launcher = pod_specs(sent)["Launcher"]["containers"][0]
    assert launcher["command"] == ["mpirun"]
    cluster_argv = launcher["command"] + launcher["args"]
    params = {"lr": 0.001, "batch-size": "16", "optimizer": "adam", "weight-decay": 1e-5}
    local_argv, _ = local_command(exp, render_trial_spec(exp, "t1", params), {}, tmp_path,
                                  TRIAL_ARGS)
    for name in ("--epochs", "--image-size", "--weights", "--steps-per-epoch", "--data"):
        assert flag(cluster_argv, name) == flag(local_argv, name), name
    assert flag(cluster_argv, "--epochs") == "1" and flag(cluster_argv, "--weights") == "none"
    # the trial's parameters are still Katib's to substitute
    assert flag(cluster_argv, "--lr") == "${trialParameters.learningRate}"
    assert exp.raw["spec"]["trialTemplate"] != sent.raw["spec"]["trialTemplate"]  # a copy


def test_cluster_volume_is_the_claim_in_every_trial_pod():
    sent = cluster_experiment(load_experiment(SPEC), None, [], parse_claims(["data=run-7-data"]))
    for role, pod in pod_specs(sent).items():
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["data"] == {"name": "data",
                                   "persistentVolumeClaim": {"claimName": "run-7-data"}}, role
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert sent.namespace == "default"  # the spec names none, nor does the call


@pytest.mark.parametrize("trial_args, claims, message", [
    ([], ["data=/srv/data"], "--volume data=/srv/data: '/srv/data' is not a "
                             "PersistentVolumeClaim name"),
    ([], ["data"], "--volume 'data': expected NAME=PVC with --cluster"),
    ([], ["scratch=x"], "--volume scratch=x: spec.trialTemplate.trialSpec has no volume "
                        "'scratch' (its volumes: data, dshm)"),
    (["epochs"], [], "--trial-arg 'epochs': expected NAME=VALUE"),
    (["lr=0.1"], [], f"with --trial-arg lr=0.1: {SPEC}: spec.trialTemplate.trialParameters[0]"
                     ".name: parameter name: learningRate in spec.trialParameters not found in "
                     "spec.trialTemplate"),  # Katib's rule: the trialParameter is now unused
])
def test_cluster_refuses_what_it_cannot_apply_in_one_line(trial_args, claims, message):
    with pytest.raises(ChexflowError) as err:
        cluster_experiment(load_experiment(SPEC), None, trial_args, parse_claims(claims))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_cluster_sends_the_configmap_template_by_reference_and_inlines_it_when_changed(
        tmp_path):
    """A spec naming ConfigMap chexflow-trial-templates: as written, the Experiment sent names
    the ConfigMap (Katib reads it); with --namespace the ConfigMap kept beside the Experiment
    moves with it. --trial-arg/--volume change the template: it is sent inlined as trialSpec,
    the ConfigMap's template as it was."""
    exp = load_experiment(configmap_spec("chexnet-random", tmp_path))
    sent = cluster_experiment(exp, "team-a", [], {})
    assert sent.raw["spec"]["trialTemplate"]["configMap"] == {
        "configMapName": "chexflow-trial-templates", "configMapNamespace": "team-a",
        "templatePath": "chexnet-mpijob.yaml"}
    assert "trialSpec" not in sent.raw["spec"]["trialTemplate"]
    assert sent.config_map is exp.config_map and sent.trial_spec == exp.config_map.trial_spec
    changed = cluster_experiment(exp, "team-a", ["epochs=1"], {})
    template = changed.raw["spec"]["trialTemplate"]
    assert "configMap" not in template and changed.config_map is None
    launcher = pod_specs(changed)["Launcher"]["containers"][0]
    assert flag(launcher["args"], "--epochs") == "1"
    original = exp.config_map.trial_spec["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert flag(original["template"]["spec"]["containers"][0]["args"], "--epochs") == "5"
    assert "configMap" in exp.raw["spec"]["trialTemplate"]  # the loaded spec is unchanged


def test_cluster_refuses_trial_args_when_the_configmap_is_not_in_the_repository(tmp_path):
    """A spec naming a ConfigMap that is not beside it: sent as written Katib reads the
    cluster's ConfigMap; --trial-arg cannot change a template chexflow cannot read."""
    path = configmap_spec("chexnet-random", tmp_path, with_templates=False)
    exp = load_experiment(path)
    assert exp.config_map is None and exp.trial_spec == {}
    assert cluster_experiment(exp, None, [], {}).raw["spec"]["trialTemplate"]["configMap"]
    with pytest.raises(ClusterError) as err:
        cluster_experiment(exp, None, ["epochs=1"], {})
    assert str(err.value) == (
        f"{path}: spec.trialTemplate.configMap: --trial-arg and --volume change the trial "
        "template, but ConfigMap kubeflow/chexflow-trial-templates (chexnet-mpijob.yaml) is in "
        f"none of {path.parent / 'trial-templates.yaml'}, {tmp_path / 'trial-templates.yaml'}"
        ": give its file with --trial-templates FILE")


@pytest.mark.parametrize("args, line", [
    (["--trial-command", "echo val_auroc=0.5"],
     "chexflow tune: error: --trial-command: runs trials as local shell commands; on a cluster "
     "Katib runs the trialSpec (change its command with --trial-arg)"),
    (["--volume", "data=/srv/data"],
     "chexflow tune: error: --volume data=/srv/data: '/srv/data' is not a PersistentVolumeClaim "
     "name (lower case letters, digits, '-' and '.'); with --cluster a volume is a claim, not a "
     "folder"),
])
def test_tune_cluster_cli_refuses_options_it_cannot_apply(args, line, tmp_path):
    """Refused before any cluster is contacted (KUBECONFIG points nowhere)."""
    proc = run_chexflow("tune", SPEC, "--cluster", *args, check=False,
                        env={"KUBECONFIG": str(tmp_path / "none")})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]


def katib_trial(name: str, created: str, params: dict[str, str], conditions: list[tuple],
                metrics: dict[str, tuple[str, str, str]] | None = None) -> dict:
    """A Trial as Katib's controllers leave it: labels, assignments, conditions, observation."""
    status: dict = {"startTime": created, "conditions": [
        {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}
    if metrics is not None:
        status["observation"] = {"metrics": [
            {"name": k, "min": lo, "max": hi, "latest": last}
            for k, (lo, hi, last) in metrics.items()]}
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {"katib.kubeflow.org/experiment": "chexnet-random"}},
            "spec": {"parameterAssignments": [{"name": k, "value": v}
                                              for k, v in params.items()]},
            "status": status}


CREATED = ("Created", "True", "TrialCreated", "Trial is created")
RUN_DONE = ("Running", "False", "TrialRunning", "Trial is running")
PARAMS = [{"lr": "0.0003", "batch-size": "16", "optimizer": "adam", "weight-decay": "2e-05"},
          {"lr": "0.002", "batch-size": "8", "optimizer": "sgd", "weight-decay": "1e-06"},
          {"lr": "0.0001", "batch-size": "32", "optimizer": "adam", "weight-decay": "1e-04"}]


def katib_trials() -> list[dict]:
    return [
        # listed out of creation order, as a list call may return them
        katib_trial("chexnet-random-b", "2026-11-23T10:02:00Z", PARAMS[1], [
            CREATED, RUN_DONE, ("Failed", "True", "TrialFailed. Job reason: MPIJobFailed",
                                "Trial has failed. Job message: launcher exited 2")]),
        katib_trial("chexnet-random-a", "2026-11-23T10:01:00Z", PARAMS[0], [
            CREATED, RUN_DONE, ("Succeeded", "True", "TrialSucceeded", "Trial has succeeded")],
            {"val_auroc": ("0.61", "0.83", "0.8"), "images_per_sec": ("90", "120", "110.5"),
             "val_loss": ("0.15", "0.3", "0.16")}),
        katib_trial("chexnet-random-c", "2026-11-23T10:03:00Z", PARAMS[2], [
            CREATED, RUN_DONE, ("MetricsUnavailable", "True", "MetricsUnavailable",
                                "Metrics are not available")],
            {"val_auroc": ("unavailable", "unavailable", "unavailable")}),
    ]


def test_katib_trials_read_as_katib_counts_them():
    recs = trial_records(katib_trials())
    assert [(r.name, r.index, r.status) for r in recs] == [
        ("chexnet-random-a", 0, "Succeeded"), ("chexnet-random-b", 1, "Failed"),
        ("chexnet-random-c", 2, "MetricsUnavailable")]
    assert recs[1].message == "Trial has failed. Job message: launcher exited 2"
    assert recs[0].observation["val_auroc"] == {"min": 0.61, "max": 0.83, "latest": 0.8}
    assert recs[2].observation == {}  # "unavailable" is no value


def experiment_status(best: str, params: dict[str, str]) -> dict:
    return {"status": {
        "conditions": [{"type": "Succeeded", "status": "True",
                        "reason": "ExperimentMaxTrialsReached",
                        "message": "Experiment has succeeded because max trial count has "
                                   "reached"}],
        "trialsSucceeded": 1, "trialsFailed": 1, "trialMetricsUnavailable": 1,
        "currentOptimalTrial": {
            "bestTrialName": best,
            "parameterAssignments": [{"name": k, "value": v} for k, v in params.items()],
            "observation": {"metrics": [
                {"name": "val_auroc", "min": "0.61", "max": "0.83", "latest": "0.8"},
                {"name": "images_per_sec", "min": "90", "max": "120", "latest": "110.5"},
                {"name": "val_loss", "min": "0.15", "max": "0.3", "latest": "0.16"}]}}}}


def test_cluster_results_are_written_by_the_local_writers(tmp_path):
    exp = load_experiment(SPEC)
    obj = experiment_status("chexnet-random-a", PARAMS[0])
    assert progress_line(exp, obj) == (
        "trials: running=0 succeeded=1 failed=1 early-stopped=0 metrics-unavailable=1; "
        "best so far: chexnet-random-a val_auroc=0.83")
    best = optimal_from_status(exp, obj)
    assert best == {"trial": "chexnet-random-a",
                    "parameters": {"lr": 0.0003, "batch-size": 16, "optimizer": "adam",
                                   "weight-decay": 2e-05},
                    "metrics": {"val_auroc": 0.83, "images_per_sec": 110.5, "val_loss": 0.15}}
    write_results(exp, tmp_path, trial_records(katib_trials()), obj["status"]["conditions"],
                  best, where="on the cluster, namespace kubeflow")
    for name in ("results.json", "results.csv", "results.html", "objective.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    results = load_results(tmp_path)
    assert results["counts"]["Failed"] == results["counts"]["MetricsUnavailable"] == 1
    assert [t["status"] for t in results["trials"]] == ["Succeeded", "Failed",
                                                        "MetricsUnavailable"]
    assert results["trials"][0]["val_auroc"] == 0.83 and results["trials"][2]["val_auroc"] is None
    assert json.loads((tmp_path / "optimal.json").read_text()) == {
        **best, "experiment": "chexnet-random", "condition": "ExperimentMaxTrialsReached"}
    assert "on the cluster, namespace kubeflow" in (tmp_path / "results.html").read_text()


def test_tune_namespace_without_cluster_is_refused(tmp_path):
    proc = run_chexflow("tune", SPEC, "--namespace", "team-a", "--state", tmp_path / "s",
                        check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "chexflow tune: error: --namespace: applies to --cluster only (a local sweep has none)"]
    assert not (tmp_path / "s").exists()


def test_set_null_removes_early_stopping_from_what_is_sent():
    """`--set spec.earlyStopping=null`: the spec runs without early stopping (a cluster whose
    katib-config lists no medianstop service refuses the field)."""
    exp = load_experiment(SPEC, ["spec.earlyStopping=null", "spec.maxTrialCount=2",
                                 "spec.maxFailedTrialCount=1"])
    assert exp.early_stopping is None
    sent = cluster_experiment(exp, "team-a", [], {})
    assert "earlyStopping" not in sent.raw["spec"] and sent.raw["spec"]["maxTrialCount"] == 2
    assert "earlyStopping" in load_experiment(SPEC).raw["spec"]


class _Experiments:
    """CustomObjectsApi's Experiment calls, answered from a dict (name -> object)."""

    def __init__(self, objects: dict[str, dict]):
        self.objects, self.created = objects, []

    def get_namespaced_custom_object(self, group, version, ns, plural, name):
        from kubernetes.client.rest import ApiException

        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects[name]

    def create_namespaced_custom_object(self, group, version, ns, plural, body, dry_run=None):
        self.created.append(body)


def test_tune_cluster_follows_an_experiment_of_the_same_spec_and_refuses_another(tmp_path):
    from kubernetes import client

    from chexflow.katib.cluster.kubernetes import SPEC_ANNOTATION, ClusterSweep
    from tests.support.reference import reference_dir

    spec = reference_dir() / "katib-examples" / "random.yaml"
    exp = cluster_experiment(load_experiment(spec, ["spec.maxTrialCount=20"]), "team-a", [], {})
    sweep = ClusterSweep(exp, tmp_path, 10, 0.1, print, client.ApiClient())
    sweep.api = api = _Experiments({})
    assert sweep.create(dry_run=False) is None  # none there: created, with its spec's mark
    (body,) = api.created
    assert body["metadata"]["annotations"][SPEC_ANNOTATION] == exp.fingerprint()
    assert SPEC_ANNOTATION not in (exp.raw["metadata"].get("annotations") or {})  # a copy

    api.objects[exp.name] = body  # as `cluster up` after `down` finds it
    assert sweep.create(dry_run=False) is body and len(api.created) == 1  # followed, not sent

    other = cluster_experiment(load_experiment(spec, ["spec.maxTrialCount=30"]), "team-a", [], {})
    sweep = ClusterSweep(other, tmp_path, 10, 0.1, print, client.ApiClient())
    sweep.api = api
    with pytest.raises(ClusterError) as e:
        sweep.create(dry_run=False)
    assert str(e.value) == (f"experiment team-a/{exp.name} already exists with a different spec "
                            "(or one not created by `chexflow tune`); delete it or change "
                            "metadata.name")
    assert len(api.created) == 1


def test_trial_args_go_into_a_trainjob_trials_trainer_command_as_into_a_local_trial(tmp_path):
    """chexnet-random-trainjob.yaml: --trial-arg changes the TrainJob's spec.trainer.command
    (what chexflow's runtime runs in the launcher), the same flags a local trial gets."""
    spec = SPEC.parent / "chexnet-random-trainjob.yaml"
    exp = load_experiment(spec, ["spec.maxTrialCount=3"])
    sent = cluster_experiment(exp, "team-a", TRIAL_ARGS, {})
    trainer = sent.raw["spec"]["trialTemplate"]["trialSpec"]["spec"]["trainer"]
    cluster_argv = trainer["command"] + trainer.get("args", [])  # Trainer: the container's
    assert cluster_argv[0] == "mpirun"
    params = {"lr": 0.001, "batch-size": "16", "optimizer": "adam", "weight-decay": 1e-5}
    local_argv, _ = local_command(exp, render_trial_spec(exp, "t1", params), {}, tmp_path,
                                  TRIAL_ARGS)
    for name in ("--epochs", "--image-size", "--weights", "--steps-per-epoch", "--data"):
        assert flag(cluster_argv, name) == flag(local_argv, name), name
    assert flag(cluster_argv, "--lr") == "${trialParameters.learningRate}"


def test_a_failed_attempt_is_reported_by_its_ranks_error_line_not_mpiruns_last_words():
    """The TrainJob sweep's launcher (Katib's StdOut collector) ended with mpirun's warning
    after the rank's one-line error: the error is the line `tune --cluster` shows."""
    log = "\n".join([
        "I1126 09:07:01.123456      12 main.go:142] epoch=1 val_auroc=0.5",
        "chexflow train: error: 31 training images are fewer than one step of 16 x 2 workers",
        "--------------------------------------------------------------------------",
        "WARNING: The environment variable LD_LIBRARY_PATH was specified with -x but is not set.",
        "--------------------------------------------------------------------------", ""])
    assert failure_line(log) == ("chexflow train: error: 31 training images are fewer than one "
                                 "step of 16 x 2 workers")
    assert failure_line("I1126 09:07:01.123456      12 main.go:142] sh: 1: boom: not found\n") \
        == "sh: 1: boom: not found"
    assert failure_line("\n \n") == ""
