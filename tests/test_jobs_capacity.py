"""A job the cluster can never hold ends the wait at once with one line (chexflow.jobs.capacity),
a full cluster only after the grace: the kubernetes backend against RecordedRequestFakeKubeApi
(a recorded-request FAKE API server; tests/cluster/test_cluster_coscheduling.py does it live)."""

from __future__ import annotations

import pytest

from chexflow.jobs import JobSpec
from chexflow.jobs.capacity import never_fits
from chexflow.jobs.diagnosis import SCHEDULING_GRACE_SECONDS
from chexflow.jobs.kubernetes import JobUnschedulable
from chexflow.jobs.spec import ClusterOptions
from tests.recorded_kube_fake import RecordedRequestFakeKubeApi
from tests.test_jobs_kubernetes import backend, unschedulable_pod

GANG_WAITS = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
              "available: 2 No preemption victims found for incoming pod.")


def node(name: str, gpus: int) -> dict:
    return {"metadata": {"name": name},
            "status": {"allocatable": {"cpu": "32", "nvidia.com/gpu": str(gpus)}}}


def worker(job: str, i: int, gpus: int, placed: bool) -> dict:
    status = {"phase": "Running"} if placed else unschedulable_pod(GANG_WAITS)
    return {"metadata": {"name": f"{job}-worker-{i}", "namespace": "team-a",
                         "labels": {"training.kubeflow.org/job-name": job,
                                    "training.kubeflow.org/job-role": "worker"}},
            "spec": {"containers": [{"name": "worker", "image": "i", "resources": {
                "limits": {"nvidia.com/gpu": str(gpus)}}}],
                "nodeName": f"kwok-gpu-{i}" if placed else None},
            "status": status}


def gang(name: str, workers: int, gpus: int) -> tuple[JobSpec, list[dict]]:
    spec = JobSpec(name=name, command=["chexflow", "train"], horovod=True, workers=workers,
                   gpus_per_worker=gpus, timeout_seconds=3600)
    return spec, [worker(name, i, gpus, placed=False) for i in range(workers)]


def test_a_gang_larger_than_the_whole_cluster_ends_at_once_with_one_line():
    spec, pods = gang("big", workers=3, gpus=8)
    fake = RecordedRequestFakeKubeApi(scripts={"big": [["Created"]]}, pods={"big": pods},
                                      nodes=[node("kwok-gpu-0", 8), node("kwok-gpu-1", 8)])
    b, out = backend(fake, options=ClusterOptions(gang_scheduling=True))
    with pytest.raises(JobUnschedulable) as err:
        b.run(spec)
    assert str(err.value) == (
        "MPIJob team-a/big can never be scheduled: its 3 pods ask 3 x 8 = 24 nvidia.com/gpu; "
        "the cluster has 16 in all (2 nodes, at most 8 on one); it was deleted")
    assert b.clock() == 0  # no grace: the first look at the unschedulable pods
    assert ("GET", "/api/v1/nodes") in [(r.method, r.path) for r in fake.requests]
    assert fake.requests[-1].method == "DELETE" and ("team-a", "big") not in fake.jobs


def test_a_gang_that_fits_an_empty_cluster_waits_the_full_cluster_grace():
    spec, pods = gang("later", workers=2, gpus=8)
    fake = RecordedRequestFakeKubeApi(scripts={"later": [["Created"]]}, pods={"later": pods},
                                      nodes=[node("kwok-gpu-0", 8), node("kwok-gpu-1", 8)])
    b, _ = backend(fake, options=ClusterOptions(gang_scheduling=True))
    with pytest.raises(JobUnschedulable, match="cluster is full"):
        b.run(spec)
    assert b.clock() == SCHEDULING_GRACE_SECONDS


def test_without_the_right_to_list_nodes_the_grace_decides_and_the_log_says_so():
    spec, pods = gang("big", workers=3, gpus=8)
    fake = RecordedRequestFakeKubeApi(scripts={"big": [["Created"]]}, pods={"big": pods},
                                      nodes=None)  # 403, as for mpijob/rbac.yaml's account
    b, out = backend(fake, options=ClusterOptions(gang_scheduling=True))
    with pytest.raises(JobUnschedulable, match="cluster is full"):
        b.run(spec)
    assert b.clock() == SCHEDULING_GRACE_SECONDS
    assert ("[big] no Nodes to size the job against (HTTP 403 Forbidden): a pod the cluster "
            f"could never hold is told from a full cluster only after {SCHEDULING_GRACE_SECONDS}s"
            ) in out.getvalue()


@pytest.mark.parametrize("need, per_node, why", [
    ([8, 8, 8], [8, 8, 8, 8], None),
    ([8, 8, 8], [8, 8], "its 3 pods ask 3 x 8 = 24 nvidia.com/gpu; the cluster has 16 in all "
                        "(2 nodes, at most 8 on one)"),
    ([16], [8, 8], "a pod asks 16 nvidia.com/gpu; the cluster has 16 in all (2 nodes, at most 8 "
                   "on one)"),
    ([6, 6, 6], [12, 8], None),
    ([6, 6, 6, 0], [10, 10], "its 3 pods ask 3 x 6 nvidia.com/gpu; the cluster has 20 in all (2 "
                             "nodes, at most 10 on one), room for at most 2 pods of 6"),
    ([4, 4], [], "a pod asks 4 nvidia.com/gpu; the cluster has 0 in all (0 nodes, at most 0 on "
                 "one)"),
], ids=["fits", "more-than-all", "pod-larger-than-any-node", "fits-side-by-side",
        "no-room-side-by-side", "no-gpu-nodes"])
def test_never_fits_says_never_only_when_an_empty_cluster_could_not_hold_the_pods(
        need, per_node, why):
    assert never_fits(need, per_node) == why
