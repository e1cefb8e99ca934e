"""An MPIJob rendered by `chexflow mpijob render` trains DenseNet-121 with Horovod across two
real worker pods: the launcher's mpirun reaches the workers' sshd (non-root user, port 2222)
through the hostfile's cluster DNS names."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from chexflow.envs import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]


def _wait_finished(custom, ns: str, name: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = custom.get_namespaced_custom_object("kubeflow.org", "v2beta1", ns, "mpijobs", name)
        for cond in job.get("status", {}).get("conditions", []):
            if cond["type"] in ("Succeeded", "Failed") and cond["status"] == "True":
                return cond
        time.sleep(2)
    raise AssertionError(f"MPIJob {ns}/{name} not finished after {timeout:.0f} s: {job}")


def test_mpijob_trains_densenet_on_two_real_worker_pods(k8s_api, real_namespace, trainer_image):
    from kubernetes import client

    ns, data = real_namespace
    # enough positives of every class in a large validation split: val_auroc is defined
    for cmd in (["data", "synth", "--out", str(data / "raw"), "--images", "64", "--size", "64",
                 "--min-prevalence", "0.3"],
                ["preprocess", "--csv", str(data / "raw" / "Data_Entry_2017.csv"), "--images",
                 str(data / "raw" / "images"), "--out", str(data / "tfrecords"),
                 "--image-size", "64", "--split", "50/40/10"]):
        subprocess.run([*CHEXFLOW, *cmd], check=True, cwd=REPO_ROOT, capture_output=True)
    rendered = subprocess.run(
        [*CHEXFLOW, "mpijob", "render", "--name", "train", "--namespace", ns, "--workers", "2",
         "--gpus-per-worker", "0", "--cpu", "750m", "--memory", "3Gi", "--pvc", "data",
         "--mount-path", "/data", "--image", trainer_image, "--timeout", "900", "--",
         "chexflow", "train", "--launcher", "none", "--data", "/data/tfrecords",
         "--out", "/data/run", "--model", "densenet121", "--image-size", "64",
         "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "4", "--threads", "1"],
        check=True, cwd=REPO_ROOT, capture_output=True, text=True).stdout
    custom = client.CustomObjectsApi(k8s_api)
    core = client.CoreV1Api(k8s_api)
    custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", ns, "mpijobs",
                                           yaml.safe_load(rendered))
    cond = _wait_finished(custom, ns, "train", timeout=900)
    launcher = core.list_namespaced_pod(
        ns, label_selector="training.kubeflow.org/job-name=train,"
                           "training.kubeflow.org/job-role=launcher").items[0]
    log = core.read_namespaced_pod_log(launcher.metadata.name, ns)
    assert cond["type"] == "Succeeded", f"{cond}\n{log[-3000:]}"
    assert launcher.spec.node_name == "chexflow-node"
    # Horovod size 2: one rank in each worker pod, started by mpirun over ssh
    metrics = json.loads((data / "run" / "metrics.json").read_text())
    assert metrics["workers"] == 2 and metrics["model"] == "densenet121", metrics
    assert 0 <= metrics["val_auroc"] <= 1, metrics
    assert f"val_auroc={metrics['val_auroc']:.6g}" in log
