"""Kueue admitting TrainJobs (its trainer.kubeflow.org/trainjob integration) in the local cluster,
with TrainJobs submitted by `chexflow job submit --job-kind trainjob --queue`: a TrainJob beyond
its ClusterQueue's free quota stays suspended, with a pending Workload and no pod (Trainer v2.3
makes its JobSet suspended too), and is admitted (Workload Admitted, TrainJob and JobSet
unsuspended, its pods on the flavor's nodes) when the earlier TrainJob ends and frees the quota;
a LocalQueue that does not exist is one line and nothing is created.

This is admission, not training: the pods run on kwok nodes (held running by their environment,
completed on request), in no image. Clusters of their own (2 kwok nodes x 8 GPUs, no real node),
one per order: Kueue first, then Trainer and JobSet added to it while it runs (Kueue's manager
restarted to set up its TrainJob controller: Kueue.joined), and Trainer first, then Kueue.
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
from chexflow.devcluster.trainer import Trainer
from chexflow.envs import REPO_ROOT
from chexflow.jobs.queueing import JOB_UID_LABEL
from chexflow.jobs.trainjob import (
    JOBSET_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINJOB_GROUP,
    TRAINJOB_PLURAL,
    TRAINJOB_VERSION,
)
from tests.cluster.conftest import apply_runtime

pytestmark = pytest.mark.cluster

NODES, GPUS = 2, 8
# the runtime's image and the TrainJobs' (they must agree); kwok nodes pull nothing
IMAGE = "chexflow.local/trainer:kwok"


@pytest.fixture(scope="module", params=["trainer-after-kueue", "kueue-after-trainer"])
def kueue_trainer_cluster(request, tmp_path_factory) -> Iterator[LocalCluster]:
    """Kueue and Trainer, one added to the other's running cluster (LocalCluster.add), both
    orders; chexflow's runtime. Trainer after Kueue restarts Kueue's manager, which sets up its
    TrainJob controller only once the CRD is served; Kueue after Trainer finds it at its start."""
    first, then = (Kueue(), Trainer()) if request.param == "trainer-after-kueue" else \
        (Trainer(), Kueue())
    cluster = LocalCluster(tmp_path_factory.mktemp(request.param), nodes=NODES,
                           gpus_per_node=GPUS, die_with_parent=True, addons=[first])
    start = time.monotonic()
    cluster.start(timeout=240)
    try:
        up = time.monotonic()
        cluster.add(then, timeout=240)
        print(f"cluster with {first.name} up in {up - start:.1f} s; {then.name} added in "
              f"{time.monotonic() - up:.1f} s", file=sys.stderr)
        restarts = cluster.processes["kueue"].get("restarts", 0)
        assert restarts == (1 if then.name == "trainer" else 0), cluster.processes["kueue"]
        apply_runtime(cluster.api_client(), IMAGE)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def queue_namespace(kueue_trainer_cluster) -> Iterator[str]:
    """A fresh namespace with LocalQueue team-a feeding ClusterQueue chexflow."""
    from kubernetes import client

    api = kueue_trainer_cluster.api_client()
    name = f"qt-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    kueue.create_local_queue(api, name, "team-a")
    yield name
    client.CoreV1Api(api).delete_namespace(name)


def submit(cluster: LocalCluster, ns: str, name: str, gpus: int, log: Path,
           queue: str = "team-a") -> subprocess.Popen:
    """`chexflow job submit --job-kind trainjob --queue` of a 2-node TrainJob whose pods kwok
    holds running, in the background, its stderr into `log`."""
    args = [sys.executable, "-m", "chexflow.cli", "job", "submit", "--job-kind", "trainjob",
            "--name", name, "--namespace", ns, "--workers", "2", "--gpus-per-worker",
            str(gpus), "--queue", queue, "--timeout", "300",
            "--env", f"{nodes.OUTCOME_ENV}=hold", "--", "chexflow", "train"]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "CHEXFLOW_TRAINER_IMAGE": IMAGE}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env=env, cwd=REPO_ROOT)


def wait_for(what: str, check, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_queued_trainjob_stays_suspended_without_quota_and_is_admitted_when_quota_frees(
        kueue_trainer_cluster, queue_namespace, tmp_path):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = kueue_trainer_cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = queue_namespace

    def trainjob(name: str) -> dict:
        return custom.get_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, ns,
                                                   TRAINJOB_PLURAL, name)

    def workload(name: str) -> dict | None:
        uid = trainjob(name)["metadata"]["uid"]
        items = custom.list_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, ns, "workloads",
            label_selector=f"{JOB_UID_LABEL}={uid}")["items"]
        return items[0] if items else None

    def condition(wl: dict | None, kind: str) -> dict:
        conds = (wl or {}).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == kind), {})

    def jobset(name: str) -> dict | None:
        try:
            return custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns,
                                                       "jobsets", name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def launcher(name: str):
        pods = core.list_namespaced_pod(
            ns, label_selector=f"{JOBSET_LABEL}={name},{REPLICATED_JOB_LABEL}=launcher").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    # the first TrainJob asks for all 16 GPUs of the ClusterQueue (two nodes x 8: its launcher
    # is one of them) and is admitted; kwok holds its pods running
    first = submit(kueue_trainer_cluster, ns, "first", GPUS, tmp_path / "first.log")
    running = wait_for("the first TrainJob's launcher Running", lambda: launcher("first"))
    assert condition(workload("first"), "Admitted").get("status") == "True"
    # the second one (2 x 1 GPU) must wait: suspended by Kueue's webhook, its Workload pending
    second = submit(kueue_trainer_cluster, ns, "second", 1, tmp_path / "second.log")
    queued = "queued in LocalQueue team-a, position 1 of 1: couldn't assign flavors"
    wait_for("the second TrainJob reported as queued",
             lambda: queued in (tmp_path / "second.log").read_text())
    job = trainjob("second")
    assert job["spec"]["suspend"] is True  # Kueue's webhook set it; chexflow renders none
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    # Kueue's webhook added its runtime patch (this job has none of chexflow's: no volume,
    # node selector or pull secret), through which it sets the admitted flavor's node selector
    assert [p["manager"] for p in job["spec"]["runtimePatches"]] == ["kueue.x-k8s.io/manager"]
    pending = condition(workload("second"), "QuotaReserved")
    assert pending.get("status") == "False", pending
    assert "insufficient unused quota for nvidia.com/gpu" in pending["message"], pending
    assert condition(workload("second"), "Admitted").get("status") != "True"
    # Trainer v2.3 makes the JobSet of a suspended TrainJob suspended too: its Jobs (if JobSet
    # made them yet) suspended, no pod
    held = jobset("second")
    assert held is None or held["spec"]["suspend"] is True, held["spec"]
    jobs = client.BatchV1Api(api).list_namespaced_job(
        ns, label_selector=f"{JOBSET_LABEL}=second").items
    assert all(j.spec.suspend for j in jobs), [(j.metadata.name, j.spec.suspend) for j in jobs]
    assert not core.list_namespaced_pod(ns, label_selector=f"{JOBSET_LABEL}=second").items
    assert second.poll() is None  # still waiting, not failed

    # the first TrainJob's launcher ends (kwok's pod-complete-on-request): the TrainJob is
    # Complete, its Workload Finished, its quota free
    complete = {"metadata": {"annotations": {"chexflow.io/kwok-complete": "true"}}}
    core.patch_namespaced_pod(running.metadata.name, ns, complete)
    assert first.wait(timeout=120) == 0, (tmp_path / "first.log").read_text()
    assert "TrainJob/first succeeded" in first.stdout.read()
    # Kueue admits the second: Workload Admitted, TrainJob unsuspended, JobSet created
    wait_for("the second TrainJob's Workload Admitted",
             lambda: condition(workload("second"), "Admitted").get("status") == "True")
    admitted = workload("second")
    assert admitted["status"]["admission"]["clusterQueue"] == kueue.CLUSTER_QUEUE
    wait_for("the second TrainJob unsuspended", lambda: trainjob("second")["spec"]["suspend"]
             is False)
    created = wait_for("the second TrainJob's JobSet unsuspended",
                       lambda: (jobset("second") or {}).get("spec", {}).get("suspend") is False
                       and jobset("second"))
    assert created["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    running = wait_for("the second TrainJob's launcher Running", lambda: launcher("second"))
    # the admitted flavor's node labels reach the pods through Kueue's runtime patch
    pods = core.list_namespaced_pod(ns, label_selector=f"{JOBSET_LABEL}=second").items
    assert pods and all(p.spec.node_selector.get("type") == "kwok" for p in pods), \
        [p.spec.node_selector for p in pods]
    wait_for("the second TrainJob reported as admitted",
             lambda: "admitted by ClusterQueue chexflow" in (tmp_path / "second.log").read_text())
    core.patch_namespaced_pod(running.metadata.name, ns, complete)
    assert second.wait(timeout=120) == 0, (tmp_path / "second.log").read_text()
    log = (tmp_path / "second.log").read_text()
    assert log.count(queued) == 1  # reported once per change, not at every poll
    assert log.index(queued) < log.index("admitted by ClusterQueue chexflow")
    assert "TrainJob/second succeeded" in second.stdout.read()


def test_a_trainjob_naming_a_localqueue_that_does_not_exist_is_one_line_and_nothing_is_created(
        kueue_trainer_cluster, queue_namespace, tmp_path):
    from kubernetes import client

    proc = submit(kueue_trainer_cluster, queue_namespace, "lost", 1, tmp_path / "lost.log",
                  queue="nope")
    assert proc.wait(timeout=60) == 2
    err = (tmp_path / "lost.log").read_text().strip()
    assert err == (f"chexflow job: error: --queue nope: no LocalQueue nope in namespace "
                   f"{queue_namespace} (there: team-a)")
    jobs = client.CustomObjectsApi(kueue_trainer_cluster.api_client()
                                   ).list_namespaced_custom_object(
        TRAINJOB_GROUP, TRAINJOB_VERSION, queue_namespace, TRAINJOB_PLURAL)
    assert not jobs["items"]
