"""Kueue in the local cluster, with MPIJobs submitted by `chexflow mpijob submit --queue`: a job
beyond its ClusterQueue's quota waits suspended and is reported as queued, then runs when the
earlier job ends; a queue that does not exist and a job larger than the whole quota are each one
line and a non-zero exit.

A cluster of its own (2 kwok nodes x 8 GPUs, no real node, Kueue v0.19 built from its Go module
on first use): its ClusterQueue `chexflow` holds 16 nvidia.com/gpu.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chexflow.devcluster import kueue, nodes
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.kueue import Kueue

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
NODES, GPUS = 2, 8


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("kueue"), nodes=NODES, gpus_per_node=GPUS,
                           die_with_parent=True, addons=[Kueue()])
    start = time.monotonic()
    cluster.start(timeout=240)
    print(f"cluster with Kueue up in {time.monotonic() - start:.1f} s; kueue resident "
          f"{cluster.memory('kueue')['VmRSS']:.0f} MiB", file=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def queue_namespace(kueue_cluster) -> Iterator[str]:
    """A fresh namespace with LocalQueue team-a feeding ClusterQueue chexflow."""
    from kubernetes import client

    api = kueue_cluster.api_client()
    name = f"q-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    kueue.create_local_queue(api, name, "team-a")
    yield name
    client.CoreV1Api(api).delete_namespace(name)


def submit(cluster: LocalCluster, ns: str, name: str, workers: int, log: Path,
           queue: str = "team-a", hold: bool = False) -> subprocess.Popen:
    """`chexflow mpijob submit` in the background, its stderr into `log`."""
    args = [sys.executable, "-m", "chexflow.cli", "mpijob", "submit", "--name", name,
            "--namespace", ns, "--workers", str(workers), "--gpus-per-worker", str(GPUS),
            "--queue", queue, "--timeout", "120",
            *(["--env", f"{nodes.OUTCOME_ENV}=hold"] if hold else []), "--", "chexflow", "train"]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env=env)


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_queued_mpijob_waits_suspended_then_runs_when_the_earlier_job_ends(
        kueue_cluster, queue_namespace, tmp_path):
    from kubernetes import client

    api = kueue_cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = queue_namespace
    first = submit(kueue_cluster, ns, "first", 2, tmp_path / "first.log", hold=True)

    def launcher(job: str):
        pods = core.list_namespaced_pod(
            ns, label_selector=f"training.kubeflow.org/job-name={job},"
                               "training.kubeflow.org/job-role=launcher").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    running = wait_for("the first job's launcher Running", lambda: launcher("first"))
    # the first job holds all 16 GPUs of the ClusterQueue: the second one (8) must wait
    second = submit(kueue_cluster, ns, "second", 1, tmp_path / "second.log", hold=True)
    queued = "queued in LocalQueue team-a, position 1 of 1: couldn't assign flavors"
    wait_for("the second job reported as queued",
             lambda: queued in (tmp_path / "second.log").read_text())
    job = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "second")
    assert job["spec"]["runPolicy"]["suspend"] is True  # Kueue's webhook suspended it
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert not core.list_namespaced_pod(
        ns, label_selector="training.kubeflow.org/job-name=second").items
    assert "insufficient unused quota for nvidia.com/gpu" in (tmp_path / "second.log").read_text()
    assert second.poll() is None  # still waiting, not failed

    # the first job's launcher ends (kwok stage pod-complete-on-request): its quota is freed
    complete = {"metadata": {"annotations": {"chexflow.io/kwok-complete": "true"}}}
    core.patch_namespaced_pod(running.metadata.name, ns, complete)
    assert first.wait(timeout=90) == 0, (tmp_path / "first.log").read_text()
    # Kueue admits the second job, which now runs on the freed GPUs
    running = wait_for("the second job's launcher Running", lambda: launcher("second"))
    workers = core.list_namespaced_pod(
        ns, label_selector="training.kubeflow.org/job-name=second,"
                           "training.kubeflow.org/job-role=worker").items
    assert [p.spec.node_name.startswith("kwok-gpu-") for p in workers] == [True]
    wait_for("the second job reported as admitted",
             lambda: "admitted by ClusterQueue chexflow" in (tmp_path / "second.log").read_text())
    core.patch_namespaced_pod(running.metadata.name, ns, complete)
    assert second.wait(timeout=90) == 0, (tmp_path / "second.log").read_text()
    log = (tmp_path / "second.log").read_text()
    assert log.count(queued) == 1  # reported once per change, not at every poll
    assert log.index(queued) < log.index("admitted by ClusterQueue chexflow")
    assert "MPIJob/second succeeded" in second.stdout.read()


def test_a_queue_that_does_not_exist_is_one_line_and_nothing_is_created(
        kueue_cluster, queue_namespace, tmp_path):
    from kubernetes import client

    proc = submit(kueue_cluster, queue_namespace, "lost", 1, tmp_path / "lost.log",
                  queue="nope")
    assert proc.wait(timeout=60) == 2
    err = (tmp_path / "lost.log").read_text().strip()
    assert err == (f"chexflow mpijob: error: --queue nope: no LocalQueue nope in namespace "
                   f"{queue_namespace} (there: team-a)")
    jobs = client.CustomObjectsApi(kueue_cluster.api_client()).list_namespaced_custom_object(
        GROUP, VERSION, queue_namespace, PLURAL)
    assert not jobs["items"]


def test_a_job_larger_than_the_whole_quota_fails_at_once_with_kueues_reason(
        kueue_cluster, queue_namespace, tmp_path):
    from kubernetes import client

    proc = submit(kueue_cluster, queue_namespace, "huge", 3, tmp_path / "huge.log")  # 24 GPUs
    assert proc.wait(timeout=90) == 2
    err = (tmp_path / "huge.log").read_text()
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"chexflow mpijob: error: MPIJob {queue_namespace}/huge cannot be "
                           "admitted: queued in LocalQueue team-a")
    assert "nvidia.com/gpu" in last and "> maximum capacity (16)" in last
    assert "Traceback" not in err
    custom = client.CustomObjectsApi(kueue_cluster.api_client())
    wait_for("the MPIJob deleted", lambda: not custom.list_namespaced_custom_object(
        GROUP, VERSION, queue_namespace, PLURAL)["items"], timeout=30)


def deprecated_kueue_requests(cluster: LocalCluster) -> list[str]:
    """The apiserver's apiserver_requested_deprecated_apis series of group kueue.x-k8s.io: each
    a deprecated Kueue API someone has asked this apiserver for since it started."""
    response = cluster.api_client().call_api("/metrics", "GET", _preload_content=False)[0]
    return [line for line in response.data.decode().splitlines()
            if line.startswith("apiserver_requested_deprecated_apis{")
            and 'group="kueue.x-k8s.io"' in line]


def test_chexflow_and_kueue_ask_for_no_deprecated_kueue_api(
        kueue_cluster, queue_namespace, tmp_path):
    """Kueue v0.19 serves v1beta1 deprecated beside v1beta2, its storage version: the queues the
    cluster made at its start and in this namespace, and a job submitted with --queue (its
    LocalQueue checked, its Workload followed to admission), are all asked for as v1beta2."""
    proc = submit(kueue_cluster, queue_namespace, "current", 1, tmp_path / "current.log")
    assert proc.wait(timeout=90) == 0, (tmp_path / "current.log").read_text()
    assert "admitted by ClusterQueue chexflow" in (tmp_path / "current.log").read_text()
    assert deprecated_kueue_requests(kueue_cluster) == []
