"""`chexflow tune katib/specs/chexnet-random.yaml --cluster` on the real Katib (v0.19.0, on the
local cluster's real node): Katib runs each trial as an MPIJob whose launcher mpiruns
DenseNet-121 training across two real worker pods, its StdOut collector reads val_auroc from the
launcher, and the command writes the local runner's results from what Katib recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chexflow.envs import REPO_ROOT
from tests.cluster.conftest import hostpath_claim

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-random.yaml"
REPLICA = "spec.trialTemplate.trialSpec.spec.mpiReplicaSpecs.{}.template.spec.containers[0]"
LAUNCHER, WORKER = REPLICA.format("Launcher"), REPLICA.format("Worker")


def tiny(image: str) -> list[str]:
    """Tiny trials on the 2-core real node: 2 trials one after the other, no early stopping
    (Katib's medianstop service is not deployed), the trainer image built here, workers without
    a GPU and with little memory."""
    return ["--set", "spec.maxTrialCount=2", "--set", "spec.parallelTrialCount=1",
            "--set", "spec.maxFailedTrialCount=1",
            "--set", "spec.earlyStopping=null",
            "--set", f"{LAUNCHER}.image={image}", "--set", f"{WORKER}.image={image}",
            "--set", f"{WORKER}.resources={{requests: {{cpu: 250m, memory: 1Gi}}, "
                     "limits: {memory: 3Gi}}", *TRIAL_ARGS]


TRIAL_ARGS = ["--trial-arg", "epochs=1", "--trial-arg", "image-size=32",
        "--trial-arg", "steps-per-epoch=3", "--trial-arg", "validation-steps=2",
        "--trial-arg", "warmup-steps=1", "--trial-arg", "weights=none",
        "--trial-arg", "threads=1"]


@pytest.fixture
def katib_data(katib_cluster, katib_namespace, tmp_path) -> Iterator[tuple[str, Path]]:
    """PersistentVolumeClaim `sweep-data` on a fresh host folder (returned) holding
    `chexflow preprocess` output in tfrecords/ (32 px, positives of every class in validation;
    78 training images: one step of the spec's largest batch, 32 x 2 workers, which `chexflow
    train` refuses with fewer)."""
    from kubernetes import client

    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the image's user (uid 1000) writes the trials' runs here
    for cmd in (["data", "synth", "--out", str(tmp_path / "raw"), "--images", "128", "--size",
                 "32", "--min-prevalence", "0.3"],
                ["preprocess", "--csv", str(tmp_path / "raw" / "Data_Entry_2017.csv"),
                 "--images", str(tmp_path / "raw" / "images"), "--out", str(data / "tfrecords"),
                 "--image-size", "32", "--split", "60/35/5"]):
        subprocess.run([*CHEXFLOW, *cmd], check=True, cwd=REPO_ROOT, capture_output=True)
    core = client.CoreV1Api(katib_cluster.api_client())
    pv = hostpath_claim(core, katib_namespace, "sweep-data", data)
    yield "sweep-data", data
    core.delete_persistent_volume(pv)


def tune(cluster, spec: Path, namespace: str, state: Path, *extra: str,
         timeout: float = 1500) -> subprocess.CompletedProcess:
    """`chexflow tune SPEC --cluster` as a user runs it, with KUBECONFIG the Katib cluster's."""
    return subprocess.run(
        [*CHEXFLOW, "tune", str(spec), "--cluster", "--namespace", namespace, "--state",
         str(state), "--poll-interval", "3", "--timeout", str(timeout), *extra],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout + 120,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})


def tune_cluster(cluster, namespace: str, name: str, state: Path,
                 *extra: str) -> subprocess.CompletedProcess:
    """chexnet-random.yaml (Experiment names are unique on the cluster: Katib's suggestion
    controller lists trials by label everywhere)."""
    return tune(cluster, SPEC, namespace, state, "--set", f"metadata.name={name}", *extra)


def _experiments(api, namespace: str) -> list[dict]:
    from kubernetes import client

    return client.CustomObjectsApi(api).list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", namespace, "experiments")["items"]


def test_medianstop_is_refused_with_katibs_message_and_the_way_out(
        katib_cluster, katib_namespace, tmp_path):
    """This Katib lists no early-stopping service: the spec as shipped is refused by Katib's
    webhook in one line that names --set spec.earlyStopping=null, and nothing is created."""
    name = f"chexnet-es-{katib_namespace[-5:]}"
    proc = tune_cluster(katib_cluster, katib_namespace, name, tmp_path / "state",
                        "--set", "spec.maxTrialCount=2", "--set", "spec.maxFailedTrialCount=1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"chexflow tune: error: creating experiment {katib_namespace}/{name}: "
                           'admission webhook "validator.experiment.katib.kubeflow.org" '
                           "denied the request: "), line
    assert ('spec.earlyStopping.algorithmName: Invalid value: "medianstop": unable to get '
            "EarlyStopping config data for algorithm medianstop") in line
    assert line.endswith("; run it without early stopping with --set spec.earlyStopping=null, "
                         "or list that algorithm in katib-config's earlyStopping")
    assert not _experiments(katib_cluster.api_client(), katib_namespace)
    assert not (tmp_path / "state").exists()


def test_an_algorithm_without_a_suggestion_service_is_refused_with_katibs_message(
        katib_cluster, katib_namespace, tmp_path):
    """bayesianoptimization (Katib's service is Python, not deployed here): Katib's webhook
    refuses it; --cluster passes the line on with what to do, and creates nothing."""
    name = f"chexnet-bo-{katib_namespace[-5:]}"
    proc = tune_cluster(katib_cluster, katib_namespace, name, tmp_path / "state", "--dry-run",
                        "--set", "spec.algorithm.algorithmName=bayesianoptimization",
                        "--set", "spec.earlyStopping=null")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert ('spec.algorithm.algorithmName: Invalid value: "bayesianoptimization": unable to get '
            "Suggestion config data for algorithm bayesianoptimization") in line, line
    assert line.endswith("; this Katib has no suggestion service for that algorithm: pick one "
                         "its katib-config lists under suggestions, or add the algorithm's "
                         "service there"), line
    assert not _experiments(katib_cluster.api_client(), katib_namespace)


def test_a_namespace_without_katibs_injection_label_is_refused_with_katibs_message(
        katib_cluster, tmp_path):
    """Without katib.kubeflow.org/metrics-collector-injection=enabled Katib's own webhook
    refuses the Experiment (it would get no metrics): --cluster passes its line on."""
    from kubernetes import client

    core = client.CoreV1Api(katib_cluster.api_client())
    ns = f"k-unlabelled-{tmp_path.name[-5:].lower().strip('-_')}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        proc = tune_cluster(katib_cluster, ns, "chexnet-nolabel", tmp_path / "state", "--dry-run",
                            *tiny("chexflow.local/trainer:unused"))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [
            f"chexflow tune: error: creating experiment {ns}/chexnet-nolabel: admission webhook "
            '"validator.experiment.katib.kubeflow.org" denied the request: Cannot create the '
            f'Experiment "chexnet-nolabel" in namespace "{ns}": the namespace lacks label '
            '"katib.kubeflow.org/metrics-collector-injection: enabled"']
        assert not _experiments(katib_cluster.api_client(), ns)
    finally:
        core.delete_namespace(ns)


def test_chexnet_random_runs_on_real_katib_with_mpijob_trials_on_real_pods(
        katib_cluster, katib_namespace, katib_trainer_image, katib_data, tmp_path):
    from kubernetes import client

    claim, data = katib_data
    name = f"chexnet-random-{katib_namespace[-5:]}"
    state = tmp_path / "state"
    proc = tune_cluster(katib_cluster, katib_namespace, name, state, *tiny(katib_trainer_image),
                        "--volume", f"data={claim}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    check_sweep(client.CustomObjectsApi(katib_cluster.api_client()), katib_namespace, name,
                state, data, proc.stdout)
    same_space_locally(state, tmp_path / "local")


def same_space_locally(cluster_state: Path, local_state: Path) -> None:
    """The same spec and sets through the local runner (same algorithm and seed; trivial
    trials): one reader loads both results, with the same parameter names, in the spec's
    order, the same types, and every value in the spec's space."""
    from chexflow.katib.results import load_results
    from chexflow.katib.spec import load_experiment

    sets = ["spec.maxTrialCount=2", "spec.parallelTrialCount=1", "spec.maxFailedTrialCount=1",
            "spec.earlyStopping=null"]
    local = subprocess.run(
        [*CHEXFLOW, "tune", str(SPEC), "--local", "--state", str(local_state), "--no-progress",
         *(a for s in sets for a in ("--set", s)), "--trial-command",
         "echo val_auroc=0.7 images_per_sec=1 val_loss=0.5"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    spec = load_experiment(SPEC, sets)
    params = [p.name for p in spec.parameters]
    loaded = {"cluster": load_results(cluster_state), "local": load_results(local_state)}
    types = {}
    for where, results in loaded.items():
        assert len(results["trials"]) == 2, where
        for t in results["trials"]:
            assert [k for k in t if k in params] == params, (where, t)
            assert all(p.contains(t[p.name]) for p in spec.parameters), (where, t)
        types[where] = [{k: type(t[k]).__name__ for k in params} for t in results["trials"]]
    assert types["cluster"] == types["local"] == [
        {"lr": "float", "batch-size": "int", "optimizer": "str", "weight-decay": "float"}] * 2


def check_sweep(custom, katib_namespace: str, name: str, state: Path, data: Path,
                stdout: str) -> None:
    """The Experiment Succeeded with two MPIJob trials; the results are Katib's."""
    experiment = custom.get_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "experiments", name)
    status = experiment["status"]
    assert any(c["type"] == "Succeeded" and c["status"] == "True"
               for c in status["conditions"]), status
    assert status["trialsSucceeded"] == 2, status
    assert "earlyStopping" not in experiment["spec"]

    # optimal.json is Katib's status.currentOptimalTrial
    katibs = status["currentOptimalTrial"]
    optimal = json.loads((state / "optimal.json").read_text())
    assert optimal["trial"] == katibs["bestTrialName"]
    assert optimal["experiment"] == name
    assert set(optimal["parameters"]) == {a["name"] for a in katibs["parameterAssignments"]}
    for a in katibs["parameterAssignments"]:
        mine = optimal["parameters"][a["name"]]
        assert mine == (a["value"] if isinstance(mine, str) else pytest.approx(float(a["value"])))
    katib_auroc = next(m for m in katibs["observation"]["metrics"] if m["name"] == "val_auroc")
    assert optimal["metrics"]["val_auroc"] == pytest.approx(float(katib_auroc["max"]))

    # both trials, as Katib recorded them, with the launcher's val_auroc
    results = json.loads((state / "results.json").read_text())
    assert results["condition"]["type"] == "Succeeded"
    assert results["counts"]["Succeeded"] == 2
    trials = custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "trials",
        label_selector=f"katib.kubeflow.org/experiment={name}")["items"]
    assert sorted(t["trial"] for t in results["trials"]) == sorted(
        t["metadata"]["name"] for t in trials)
    for row in results["trials"]:
        assert row["status"] == "Succeeded", row
        assert 0 <= row["val_auroc"] <= 1, row
        # each trial trained in its own run folder on the claim, two Horovod workers
        metrics = json.loads((data / "runs" / "katib" / row["trial"] / "metrics.json").read_text())
        assert metrics["workers"] == 2 and metrics["image_size"] == 32, metrics
        assert row["val_auroc"] == pytest.approx(metrics["val_auroc"], rel=1e-4)  # collected
    assert [t["spec"]["runSpec"]["kind"] for t in trials] == ["MPIJob", "MPIJob"]
    for path in ("results.csv", "results.html", "objective.png", "experiment.json"):
        assert (state / path).stat().st_size > 0
    assert f"experiment {name}: Succeeded" in stdout


def _job_spec(name: str, image: str, script: str, retain: bool = False) -> dict:
    """One-trial Experiment whose trial is a batch Job running `script` (after a pause: Katib's
    collector must find the main process still running); `retain` keeps the trial's Job."""
    return {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment", "metadata": {"name": name},
        "spec": {
            "objective": {"type": "maximize", "objectiveMetricName": "val_auroc"},
            "algorithm": {"algorithmName": "random"},
            "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
            "parallelTrialCount": 1, "maxTrialCount": 1, "maxFailedTrialCount": 1,
            "parameters": [{"name": "lr", "parameterType": "double",
                            "feasibleSpace": {"min": "0.001", "max": "0.1"}}],
            "trialTemplate": {
                "primaryContainerName": "main", "retain": retain,
                "trialParameters": [{"name": "lr", "reference": "lr"}],
                "trialSpec": {"apiVersion": "batch/v1", "kind": "Job", "spec": {
                    "backoffLimit": 0, "template": {"spec": {
                        "restartPolicy": "Never", "containers": [{
                            "name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": ["bash", "-c", f"sleep 3; {script}"]}]}}}}}}}


@pytest.mark.parametrize("case, script, status, counter", [
    ("fails", 'echo "lr=${trialParameters.lr}"; echo no data >&2; exit 3', "Failed",
     "failed=1"),
    ("nometric", 'echo "lr=${trialParameters.lr} and no objective"', "MetricsUnavailable",
     "metrics-unavailable=1"),
])
def test_a_failing_trial_and_one_without_the_metric_are_reported_as_katib_counts_them(
        katib_cluster, katib_namespace, katib_base_image, tmp_path, case, script, status,
        counter):
    import yaml

    name = f"{case}-{katib_namespace[-5:]}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_job_spec(name, katib_base_image, script,
                                             retain=status == "Failed")))
    state = tmp_path / "state"
    proc = tune(katib_cluster, spec, katib_namespace, state, timeout=600)
    out = proc.stdout
    katibs = _experiments(katib_cluster.api_client(), katib_namespace)[0]["status"]
    results = json.loads((state / "results.json").read_text())
    (row,) = results["trials"]
    assert row["status"] == status, (row, out, proc.stderr)
    assert results["counts"][status] == 1
    assert any(line.startswith(f"trial {row['trial']} {status}: lr=") for line in
               out.splitlines()), out
    assert any(line.startswith("trials: ") and counter in line for line in out.splitlines())
    if status == "Failed":  # under its line, the end of the trial pod's log (kubectl logs)
        lines = out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(f"trial {row['trial']}"))
        assert "  | no data" in lines[at + 1:at + 1 + 8], out
    assert results["condition"]["type"] in ("Succeeded", "Failed")
    assert proc.returncode == (0 if results["condition"]["type"] == "Succeeded" else 1)
    key = {"Failed": "trialsFailed", "MetricsUnavailable": "trialMetricsUnavailable"}[status]
    assert katibs[key] == 1, katibs
    assert row["val_auroc"] is None and not (state / "optimal.json").exists()
