"""An MPIJob rendered by `chexflow job render` trains DenseNet-121 with Horovod across two
real worker pods on two real nodes: a second containerd + kubelet + bridge is added to the
session's cluster, the workers must land on different nodes (required pod anti-affinity on the
hostname), the launcher's mpirun reaches each worker's sshd (non-root user, port 2222) by its
hostfile name through the cluster DNS, and the ranks' allreduce crosses from one node's bridge
to the other's through the host.

The image comes as on any cluster: `chexflow images push` puts the trainer in the cluster's
registry (the `registry` add-on: distribution over TLS with a login), the job is rendered from
the references file the push wrote (no --image), `chexflow images pull-secret --apply` makes
the namespace's pull Secret, and each node's containerd pulls the image by digest with it
(nothing is side-loaded into the second node)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from chexflow.devcluster import realnode
from chexflow.envs import REPO_ROOT
from tests.cluster.conftest import generated_tfrecords, hostpath_claim

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"


@pytest.fixture(scope="module")
def second_node(k8s_cluster) -> realnode.RealNode:
    """A second real node on the session cluster, no image loaded. It carries
    realnode.EXTRA_NODE_TAINT, so the other tests' pods never land there."""
    return k8s_cluster.addon("real-node").add_node(k8s_cluster, time.monotonic() + 180)


@pytest.fixture
def two_node_namespace(k8s_api, second_node, tmp_path) -> Iterator[tuple[str, Path]]:
    """A namespace whose pods go to either real node, with a PVC `data` on a host folder (one
    host, so the same hostPath is there on both nodes)."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    ns = f"t-two-nodes-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {
        "name": ns, "annotations": realnode.namespace_annotations(extra_nodes=True)}})
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the image's user (uid 1000) writes here
    pv = hostpath_claim(core, ns, "data", data)
    yield ns, data
    core.delete_namespace(ns)
    core.delete_persistent_volume(pv)


def _wait_finished(custom, core, ns: str, name: str, timeout: float,
                   workers: dict[str, tuple[str, str]]) -> dict:
    """The MPIJob's finished condition; meanwhile `workers` gets each worker pod's node and
    address (cleanPodPolicy Running deletes the workers when the job ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pod in core.list_namespaced_pod(
                ns, label_selector=f"{JOB_LABEL}={name},{ROLE_LABEL}=worker").items:
            if pod.status.pod_ip:
                workers[pod.metadata.name] = (pod.spec.node_name, pod.status.pod_ip)
        job = custom.get_namespaced_custom_object("kubeflow.org", "v2beta1", ns, "mpijobs", name)
        for cond in job.get("status", {}).get("conditions", []):
            if cond["type"] in ("Succeeded", "Failed") and cond["status"] == "True":
                return cond
        time.sleep(2)
    raise AssertionError(f"MPIJob {ns}/{name} not finished after {timeout:.0f} s: {job}")


def test_mpijob_workers_on_two_real_nodes_pull_the_pushed_trainer_by_digest_and_train(
        k8s_api, two_node_namespace, pushed_trainer, second_node):
    from kubernetes import client

    ns, data = two_node_namespace
    env, reference = pushed_trainer
    generated_tfrecords(data)
    subprocess.run([*CHEXFLOW, "images", "pull-secret", "--name", "registry-login",
                    "--namespace", ns, "--apply"], env=env, check=True, cwd=REPO_ROOT,
                   capture_output=True, timeout=60)
    rendered = subprocess.run(
        [*CHEXFLOW, "job", "render", "--name", "spread", "--namespace", ns, "--workers", "2",
         "--gpus-per-worker", "0", "--cpu", "750m", "--memory", "3Gi", "--pvc", "data",
         "--mount-path", "/data", "--image-pull-secret", "registry-login", "--timeout", "900",
         "--", "chexflow", "train", "--launcher", "none", "--data", "/data/tfrecords",
         "--out", "/data/run", "--model", "densenet121", "--image-size", "64",
         "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "4", "--threads", "1"],
        check=True, cwd=REPO_ROOT, capture_output=True, text=True, env=env).stdout
    job = yaml.safe_load(rendered)
    # one worker per node, as a GPU job's whole-node requests would place them
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {JOB_LABEL: "spread", ROLE_LABEL: "worker"}},
            "topologyKey": "kubernetes.io/hostname"}]}}
    custom = client.CustomObjectsApi(k8s_api)
    core = client.CoreV1Api(k8s_api)
    custom.create_namespaced_custom_object("kubeflow.org", "v2beta1", ns, "mpijobs", job)
    workers: dict[str, tuple[str, str]] = {}
    cond = _wait_finished(custom, core, ns, "spread", 900, workers)
    launcher = core.list_namespaced_pod(
        ns, label_selector=f"{JOB_LABEL}=spread,{ROLE_LABEL}=launcher").items[0]
    log = core.read_namespaced_pod_log(launcher.metadata.name, ns)
    assert cond["type"] == "Succeeded", f"{cond}\n{log[-3000:]}"
    assert {node for node, _ in workers.values()} == {realnode.NODE_NAME, second_node.name}
    # each worker's address is in its own node's /24: the ranks' traffic crossed the host
    cidrs = {n.name: ipaddress.ip_network(n.addresses()["pod_cidr"])
             for n in realnode.all_nodes(second_node.state_dir)}
    for node, ip in workers.values():
        assert ipaddress.ip_address(ip) in cidrs[node], workers
    # both nodes pulled the pushed digest from the registry (the second had nothing loaded)
    digest = reference.split("@")[1]
    for pod in (launcher, *core.list_namespaced_pod(ns).items):
        for spec in pod.spec.containers:
            assert spec.image == reference, (pod.metadata.name, spec.image)
    assert launcher.status.container_statuses[0].image_id.endswith(digest), launcher.status
    pulled = [e.message for e in core.list_namespaced_event(ns).items if e.reason == "Pulled"]
    assert any(reference in m and "Successfully pulled" in m for m in pulled), pulled
    repository = reference.split("@")[0].rsplit(":", 1)[0]
    assert f"{repository}@{digest}" in second_node.ctr(
        "images", "list", "--quiet").stdout.split()
    metrics = json.loads((data / "run" / "metrics.json").read_text())
    assert metrics["workers"] == 2 and metrics["model"] == "densenet121", metrics
    assert f"val_auroc={metrics['val_auroc']:.6g}" in log
