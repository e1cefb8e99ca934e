"""`chexflow tune --cluster` against the local apiserver with the real Katib Experiment CRD: the
Experiment is created as written, and the command's waiting and optimal-trial reading work on
status written here (no Katib controller runs; the test plays its part)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from chexflow.envs import REPO_ROOT

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"
SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-random.yaml"


def tune(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "chexflow.cli", "tune", str(SPEC), "--cluster",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ})


def test_tune_cluster_dry_run_is_accepted_and_creates_nothing(k8s_api, k8s_namespace):
    from kubernetes import client

    proc = tune("--namespace", k8s_namespace, "--dry-run")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "accepted by the API server (dry run)" in out
    items = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, PLURAL)["items"]
    assert items == []


def test_tune_cluster_creates_experiment_waits_and_reads_optimal_trial(
        k8s_api, k8s_namespace, tmp_path):
    from kubernetes import client

    custom = client.CustomObjectsApi(k8s_api)
    ns, state = k8s_namespace, tmp_path / "state"
    name = yaml.safe_load(SPEC.read_text())["metadata"]["name"]
    proc = tune("--namespace", ns, "--state", str(state), "--poll-interval", "0.5",
                "--timeout", "120")
    try:
        deadline = time.monotonic() + 60
        while True:
            found = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            if found or proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert found, f"no Experiment created; tune exited {proc.poll()}"
        exp = found[0]
        assert exp["metadata"]["name"] == name
        assert exp["spec"]["algorithm"]["algorithmName"] == "random"
        assert exp["spec"]["objective"]["objectiveMetricName"] == "val_auroc"
        assert [p["name"] for p in exp["spec"]["parameters"]] == [
            "lr", "batch-size", "optimizer", "weight-decay"]
        time.sleep(1.5)  # tune keeps polling while the Experiment is running
        assert proc.poll() is None

        # What Katib's controller would write when the experiment ends.
        best = f"{name}-k7x2q9"
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, {
            "status": {
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "ExperimentCreated"},
                    {"type": "Succeeded", "status": "True", "reason": "ExperimentGoalReached",
                     "message": "Experiment has succeeded because Objective goal has reached"}],
                "trialsSucceeded": 5, "trialsRunning": 0, "trialsFailed": 1,
                "currentOptimalTrial": {
                    "bestTrialName": best,
                    "parameterAssignments": [
                        {"name": "lr", "value": "0.00031"}, {"name": "batch-size", "value": "16"},
                        {"name": "optimizer", "value": "adam"},
                        {"name": "weight-decay", "value": "0.00002"}],
                    "observation": {"metrics": [
                        {"name": "val_auroc", "min": "0.61", "max": "0.8512", "latest": "0.84"},
                        {"name": "val_loss", "min": "0.152", "max": "0.3", "latest": "0.16"},
                        {"name": "images_per_sec", "min": "90", "max": "120",
                         "latest": "110.5"}]},
                },
            }})
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Succeeded (ExperimentGoalReached)" in out
    optimal = json.loads((state / "optimal.json").read_text())
    assert optimal["trial"] == best and optimal["experiment"] == name
    assert optimal["metrics"] == {"val_auroc": 0.8512, "val_loss": 0.152, "images_per_sec": 110.5}
    assert optimal["parameters"]["optimizer"] == "adam"
    assert optimal["parameters"]["lr"] == pytest.approx(0.00031)
    assert json.loads((state / "experiment.json").read_text())["status"]["trialsSucceeded"] == 5
