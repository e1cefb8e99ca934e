"""Without gang scheduling, two MPIJobs that together need more GPUs than exist deadlock: each
holds some of its workers' GPUs, neither has all its workers, so mpi-operator creates neither
launcher (launcherCreationPolicy WaitForWorkersReady) and the held GPUs sit idle; it holds until
the jobs are deleted. test_cluster_coscheduling.py shows the same pair gang-scheduled.

A cluster of its own: 4 kwok nodes x 8 GPUs, the default scheduler only; each job asks 3 workers
x 8 GPUs (a whole node each: 6 nodes' worth for the pair). Which workers the scheduler meets
first is up to mpi-operator's and the scheduler's timing; the test makes it deterministic with a
scheduling gate on every worker, lifted in the interleaved order a0, b0, a1, b1, a2, b2 that two
jobs submitted together commonly get: the first four take the four nodes, the last two wait.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Iterator

import pytest

from chexflow.devcluster import nodes
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.jobs.kubernetes import KubernetesBackend
from chexflow.jobs.spec import JobSpec

pytestmark = pytest.mark.cluster

NODES, GPUS, WORKERS = 4, 8, 3
HOLD_SECONDS = 20
JOBS = ("job-a", "job-b")
GATE = "chexflow.io/arrival-order"


@pytest.fixture(scope="module")
def default_cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("nogang"), nodes=NODES, gpus_per_node=GPUS,
                           die_with_parent=True)
    start = time.monotonic()
    cluster.start(timeout=240)
    print(f"cluster up in {time.monotonic() - start:.1f} s", file=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.stop()


def workers(core, ns: str, job: str) -> list:
    return core.list_namespaced_pod(
        ns, label_selector=f"training.kubeflow.org/job-name={job},"
                           "training.kubeflow.org/job-role=worker").items


def unschedulable(pod) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in (pod.status.conditions if pod.status else None) or [])


def wait_for(what: str, check, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f}s: {what}")
        time.sleep(0.5)
    return result


def test_two_mpijobs_without_gang_scheduling_deadlock_in_partial_placement(default_cluster):
    from kubernetes import client

    api = default_cluster.api_client()
    core = client.CoreV1Api(api)
    ns = "nogang"
    core.create_namespace({"metadata": {"name": ns}})
    be = KubernetesBackend(namespace=ns, api_client=api, stream=io.StringIO())
    for job in JOBS:
        obj = be.render(JobSpec(name=job, command=["chexflow", "train"], horovod=True,
                                workers=WORKERS, gpus_per_worker=GPUS,
                                env={nodes.OUTCOME_ENV: "hold"}, timeout_seconds=300))
        # no gang: mpi-operator here runs without --gang-scheduling and ignores minAvailable
        assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": WORKERS}
        obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["schedulingGates"] = [
            {"name": GATE}]
        be.create(obj)

    def pod(name: str):
        return core.read_namespaced_pod(name, ns)

    def split() -> dict[str, int]:
        return {job: sum(1 for p in workers(core, ns, job) if p.spec.node_name) for job in JOBS}

    wait_for("both jobs' workers created, gated", lambda: all(
        len(workers(core, ns, job)) == WORKERS for job in JOBS))
    assert all(p.spec.scheduling_gates for job in JOBS for p in workers(core, ns, job))
    # the scheduler meets the two jobs' workers interleaved: a0, b0, a1, b1, then a2 and b2
    for i in range(WORKERS):
        for job in JOBS:
            name = f"{job}-worker-{i}"
            core.patch_namespaced_pod(name, ns, [{"op": "remove", "path": "/spec/schedulingGates"}])
            if i < WORKERS - 1:
                wait_for(f"{name} placed", lambda name=name: pod(name).spec.node_name)
    wait_for("the last workers unschedulable", lambda: all(
        unschedulable(pod(f"{job}-worker-{WORKERS - 1}")) for job in JOBS))

    # the deadlock: all 4 nodes' GPUs held, neither job whole, no launcher, for HOLD_SECONDS
    end = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < end:
        assert split() == {"job-a": 2, "job-b": 2}
        held = {p.spec.node_name for job in JOBS for p in workers(core, ns, job)
                if p.spec.node_name}
        assert held == {f"kwok-gpu-{i}" for i in range(NODES)}
        launchers = core.list_namespaced_pod(
            ns, label_selector="training.kubeflow.org/job-role=launcher").items
        assert launchers == []
        time.sleep(1)
    waiting = [p for job in JOBS for p in workers(core, ns, job) if not p.spec.node_name]
    assert len(waiting) == 2 and all(unschedulable(p) for p in waiting)
    message = next(c.message for c in waiting[0].status.conditions if c.type == "PodScheduled")
    assert f"Insufficient {nodes.GPU_RESOURCE}" in message, message
    print(f"deadlocked for {HOLD_SECONDS} s: 2 of 3 workers each; {waiting[0].metadata.name}: "
          f"{message}", file=sys.stderr)

    # cleaned up: both deleted, their pods gone
    for job in JOBS:
        be.delete("MPIJob", job)
    wait_for("the jobs' pods deleted", lambda: core.list_namespaced_pod(ns).items == [])
    core.delete_namespace(ns)
