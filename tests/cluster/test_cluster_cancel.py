"""Stopping a command that runs a job on the cluster deletes the job: `chexflow mpijob submit`
(the kubernetes backend, as a pipeline step runs it) with a launcher kwok holds running gets
SIGTERM (a KFP run terminated, its pod deleted) or SIGINT (Ctrl-C); the MPIJob and its pods are
gone afterwards and the command says so in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from chexflow.devcluster import nodes
from chexflow.envs import REPO_ROOT

pytestmark = pytest.mark.cluster

SELECTOR = "training.kubeflow.org/job-name=held"


def _wait_for(what: str, check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout:.0f} s")
        time.sleep(0.5)


@pytest.mark.parametrize("sig, line, code", [
    (signal.SIGTERM, "error: stopped by SIGTERM: deleted MPIJob {ns}/held and its pods", 2),
    (signal.SIGINT, "interrupted", 130),
], ids=["sigterm", "ctrl-c"])
def test_stopping_the_submitting_command_deletes_the_mpijob_and_its_pods(
        k8s_cluster, k8s_api, k8s_namespace, sig, line, code):
    from kubernetes import client

    ns = k8s_namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chexflow.cli", "mpijob", "submit", "--name", "held",
         "--namespace", ns, "--workers", "2", "--gpus-per-worker", "1", "--timeout", "600",
         "--env", f"{nodes.OUTCOME_ENV}=hold", "--", "chexflow", "train", "--epochs", "1"],
        cwd=REPO_ROOT, env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def launcher_running() -> bool:
            pods = core.list_namespaced_pod(ns, label_selector=SELECTOR).items
            return any(p.metadata.name.startswith("held-launcher") and p.status.phase == "Running"
                       for p in pods)
        _wait_for("launcher running", launcher_running)
        assert proc.poll() is None  # the launcher is held: the command is still waiting
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == f"chexflow mpijob: {line.format(ns=ns)}"
    assert "Traceback" not in err
    assert f"deleted MPIJob {ns}/held" in err  # the backend's own line before it exits

    def nothing_left() -> bool:
        jobs = custom.list_namespaced_custom_object("kubeflow.org", "v2beta1", ns,
                                                    "mpijobs")["items"]
        return not jobs and not core.list_namespaced_pod(ns).items
    _wait_for("MPIJob and pods gone", nothing_left, timeout=30)
