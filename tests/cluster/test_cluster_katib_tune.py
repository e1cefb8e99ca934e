"""`chexflow tune SPEC --cluster` on the real Katib (v0.19.0, on the local cluster's real node):
what Katib's webhook refuses, passed on in one line, and batch-Job trials that fail or log no
metric, counted as Katib counts them. The chexnet-random sweep whose MPIJob trials train across
real worker pods runs in test_cluster_katib_pipeline.py, from the tune step's pod."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from tests.katib_configmap_specs import configmap_spec

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-random.yaml"
REPLICA = "spec.trialTemplate.trialSpec.spec.mpiReplicaSpecs.{}.template.spec.containers[0]"
LAUNCHER, WORKER = REPLICA.format("Launcher"), REPLICA.format("Worker")


def tiny(image: str) -> list[str]:
    """Tiny trials on the 2-core real node: 2 trials one after the other, no early stopping
    (medianstop needs 3 succeeded trials before it has a rule), the trainer image built here,
    workers without a GPU and with little memory."""
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


def test_the_shipped_spec_with_medianstop_passes_katibs_webhook(
        katib_cluster, katib_namespace, tmp_path):
    """This Katib lists chexflow's medianstop service (katib-config earlyStoppings): the spec as
    shipped, early stopping included, passes Katib's webhook (a server-side dry run), which
    refuses an early-stopping algorithm katib-config does not list."""
    name = f"chexnet-es-{katib_namespace[-5:]}"
    proc = tune_cluster(katib_cluster, katib_namespace, name, tmp_path / "state", "--dry-run",
                        "--set", "spec.maxTrialCount=2", "--set", "spec.maxFailedTrialCount=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not _experiments(katib_cluster.api_client(), katib_namespace)
    assert "ConfigMap" not in proc.stdout  # the shipped spec carries its template


def test_every_shipped_spec_is_accepted_by_katib_in_any_namespace_as_kubectl_applies_it(
        katib_cluster, katib_namespace):
    """`kubectl apply -n NS -f katib/specs/SPEC.yaml`: each spec names no namespace and carries
    its trial template, so Katib's webhook accepts it in a namespace of the user's (a
    server-side dry run, as `kubectl apply --dry-run=server` sends it)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(katib_cluster.api_client())
    for spec in sorted((REPO_ROOT / "katib" / "specs").glob("*.yaml")):
        (body,) = [d for d in yaml.safe_load_all(spec.read_text()) if d]
        assert "namespace" not in body["metadata"], spec.name
        made = custom.create_namespaced_custom_object("kubeflow.org", "v1beta1",
                                                      katib_namespace, "experiments", body,
                                                      dry_run="All")
        assert made["metadata"]["namespace"] == katib_namespace, spec.name


def test_katib_makes_each_trial_from_the_configmap_template_tune_applies(
        katib_cluster, katib_namespace, tmp_path):
    """A spec naming ConfigMap chexflow-trial-templates in its namespace (as a spec of one's
    own does): `chexflow tune --cluster` creates the ConfigMap beside the Experiment from
    katib/trial-templates.yaml, and Katib's controller makes the trial's MPIJob from it with
    the trial's values put in. Its workers would need GPUs and the data PVC: the test stops at
    the MPIJob (stopping the command deletes the Experiment, its trial and job)."""
    from kubernetes import client

    ns, api = katib_namespace, katib_cluster.api_client()
    spec = configmap_spec("chexnet-random", tmp_path / "sweep", namespace=ns)
    proc = subprocess.Popen(
        [*CHEXFLOW, "tune", str(spec), "--cluster", "--namespace", ns, "--state",
         str(tmp_path / "state"), "--poll-interval", "3", "--set", f"metadata.name=cm-{ns[-5:]}",
         "--set", "spec.maxTrialCount=1", "--set", "spec.parallelTrialCount=1",
         "--set", "spec.maxFailedTrialCount=1", "--set", "spec.earlyStopping=null"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "KUBECONFIG": str(katib_cluster.kubeconfig)})
    custom, jobs, values = client.CustomObjectsApi(api), [], {}
    try:
        deadline = time.monotonic() + 300
        while not jobs and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(3)
            jobs = custom.list_namespaced_custom_object("kubeflow.org", "v2beta1", ns,
                                                        "mpijobs")["items"]
        if jobs:  # the Trial of the same name, while it exists
            trial_obj = custom.get_namespaced_custom_object(
                "kubeflow.org", "v1beta1", ns, "trials", jobs[0]["metadata"]["name"])
            values = {a["name"]: a["value"] for a in trial_obj["spec"]["parameterAssignments"]}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    assert jobs, out + err
    (shipped,) = [d for d in yaml.safe_load_all(
        (REPO_ROOT / "katib" / "trial-templates.yaml").read_text()) if d]
    assert f"ConfigMap {ns}/chexflow-trial-templates: created from" in out, out
    on_cluster = client.CoreV1Api(api).read_namespaced_config_map("chexflow-trial-templates", ns)
    assert on_cluster.data == shipped["data"]
    trial = jobs[0]["metadata"]["name"]
    assert jobs[0]["metadata"]["ownerReferences"][0]["kind"] == "Trial"
    launcher = jobs[0]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    args = launcher["args"]
    assert args[args.index("--out") + 1] == f"/mnt/chexflow/runs/katib/{trial}"
    for flag in ("--lr", "--batch-size", "--optimizer", "--weight-decay"):
        assert args[args.index(flag) + 1] == values[flag[2:]], (args, values)


def test_an_algorithm_without_a_suggestion_service_is_refused_with_katibs_message(
        katib_cluster, katib_namespace, tmp_path):
    """pbt (Katib's own service, not deployed here): Katib's webhook refuses it; --cluster
    passes the line on with what to do, and creates nothing."""
    name = f"chexnet-pbt-{katib_namespace[-5:]}"
    proc = tune_cluster(katib_cluster, katib_namespace, name, tmp_path / "state", "--dry-run",
                        "--set", "spec.algorithm={algorithmName: pbt, algorithmSettings: ["
                                 "{name: n_population, value: '5'}, "
                                 "{name: truncation_threshold, value: '0.2'}]}",
                        "--set", "spec.earlyStopping=null")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert ('spec.algorithm.algorithmName: Invalid value: "pbt": unable to get '
            "Suggestion config data for algorithm pbt") in line, line
    assert line.endswith("; this Katib has no suggestion service for that algorithm: pick one "
                         "its katib-config lists under suggestions, or add the algorithm's "
                         "service there"), line
    assert not _experiments(katib_cluster.api_client(), katib_namespace)


def test_a_namespace_without_katibs_injection_label_is_refused_before_anything_is_written(
        katib_cluster, tmp_path):
    """Without katib.kubeflow.org/metrics-collector-injection=enabled Katib's own webhook
    refuses the Experiment (it would get no metrics): --cluster reads the namespace first and
    says so in one line with the kubectl command that adds the label."""
    from kubernetes import client

    core = client.CoreV1Api(katib_cluster.api_client())
    ns = f"k-unlabelled-{tmp_path.name[-5:].lower().strip('-_')}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        proc = tune_cluster(katib_cluster, ns, "chexnet-nolabel", tmp_path / "state", "--dry-run",
                            *tiny("chexflow.local/trainer:unused"))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        key = "katib.kubeflow.org/metrics-collector-injection"
        assert proc.stderr.splitlines() == [
            f"chexflow tune: error: namespace {ns} lacks the label {key}: enabled, without which "
            f"Katib refuses an Experiment there: kubectl label namespace {ns} {key}=enabled"]
        assert not _experiments(katib_cluster.api_client(), ns)
    finally:
        core.delete_namespace(ns)


def _job_spec(name: str, image: str, script: str, retain: bool = False, pause: int = 3) -> dict:
    """One-trial Experiment whose trial is a batch Job running `script` (after `pause` seconds:
    Katib's collector must find the main process still running); `retain` keeps the trial's
    Job."""
    command = f"sleep {pause}; {script}" if pause else script
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
                            "command": ["bash", "-c", command]}]}}}}}}}


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
