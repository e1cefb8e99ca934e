"""Gang scheduling that really happens: scheduler-plugins' Coscheduling scheduler beside the
default one and mpi-operator with --gang-scheduling, on kwok GPU nodes. Two gang-scheduled
MPIJobs that together need more GPUs than exist: one runs whole, the other waits whole (no
worker of it placed), then runs whole when the first ends. A gang larger than the whole cluster
ends chexflow's wait in seconds with one line (chexflow/jobs/capacity.py). An MPIJob rendered
without --gang-scheduling runs too (mpi-operator gangs it all the same, and the renderer's
minAvailable leaves out the launcher that waits for the workers); a gang that counts that
launcher ends the wait at once with one line saying so. The same pair without gang scheduling:
test_cluster_partial_placement.py.

A cluster of its own: 2 kwok nodes x 8 GPUs; each job asks 3 workers x 4 GPUs (12 of 16).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from chexflow.devcluster import coscheduling, nodes
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.coscheduling import Coscheduling
from chexflow.envs import REPO_ROOT
from chexflow.jobs.kubernetes import JobUnschedulable, KubernetesBackend
from chexflow.jobs.spec import ClusterOptions, JobSpec

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"


@pytest.fixture(scope="module")
def gang_cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("gang"), nodes=2, gpus_per_node=8,
                           die_with_parent=True, addons=[Coscheduling()])
    start = time.monotonic()
    cluster.start(timeout=240)
    print(f"cluster with coscheduling up in {time.monotonic() - start:.1f} s", file=sys.stderr)
    try:
        yield cluster
    finally:
        cluster.stop()


def placed_workers(core, ns: str, job: str) -> list[str]:
    pods = core.list_namespaced_pod(
        ns, label_selector=f"training.kubeflow.org/job-name={job},"
                           "training.kubeflow.org/job-role=worker").items
    return [p.metadata.name for p in pods if p.spec.node_name]


def test_two_gangs_larger_than_the_cluster_one_runs_whole_the_other_waits_whole(gang_cluster):
    from kubernetes import client

    api = gang_cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns = "gangs"
    core.create_namespace({"metadata": {"name": ns}})
    be = KubernetesBackend(namespace=ns, api_client=api, stream=io.StringIO(),
                           options=ClusterOptions(gang_scheduling=True))
    for name in ("gang-a", "gang-b"):
        spec = JobSpec(name=name, command=["chexflow", "train"], horovod=True, workers=3,
                       gpus_per_worker=4, env={nodes.OUTCOME_ENV: "hold"}, timeout_seconds=300)
        be.create(be.render(spec))

    # mpi-operator made a PodGroup per job, whose pods go to the Coscheduling scheduler
    groups = custom.list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns,
                                                  "podgroups")["items"]
    deadline = time.monotonic() + 60
    while len(groups) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        groups = custom.list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns,
                                                      "podgroups")["items"]
    assert sorted((g["metadata"]["name"], g["spec"]["minMember"]) for g in groups) == [
        ("gang-a", 3), ("gang-b", 3)]

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        counts = {job: len(placed_workers(core, ns, job)) for job in ("gang-a", "gang-b")}
        if sorted(counts.values()) == [0, 3]:
            break
        time.sleep(1)
    assert sorted(counts.values()) == [0, 3], counts
    first = max(counts, key=counts.get)
    second = min(counts, key=counts.get)
    pods = core.list_namespaced_pod(
        ns, label_selector=f"training.kubeflow.org/job-name={second}").items
    assert pods and all(p.spec.scheduler_name == coscheduling.SCHEDULER_NAME for p in pods)
    # it stays that way: over three permit timeouts no worker of the second gang is placed
    end = time.monotonic() + 3 * coscheduling.PERMIT_WAITING_SECONDS
    while time.monotonic() < end:
        assert placed_workers(core, ns, second) == []
        assert len(placed_workers(core, ns, first)) == 3
        time.sleep(1)

    # the first job ends and its workers go. Coscheduling has the scheduler retry a waiting gang
    # only on a new pod or a PodGroup change (or the 5-minute flush of unschedulable pods), not
    # when pods are deleted: the PodGroup controller's status update can come before the
    # workers are gone. A change of the waiting PodGroup (an annotation) has it retried now.
    launcher = wait_running_launcher(core, ns, first)
    core.patch_namespaced_pod(launcher, ns, {"metadata": {"annotations": {
        "chexflow.io/kwok-complete": "true"}}})
    deadline = time.monotonic() + 60
    while placed_workers(core, ns, first) and time.monotonic() < deadline:
        time.sleep(1)
    assert placed_workers(core, ns, first) == []
    custom.patch_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", second,
        {"metadata": {"annotations": {"chexflow.io/retry": str(time.time())}}})
    deadline = time.monotonic() + 60
    while len(placed_workers(core, ns, second)) < 3 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(placed_workers(core, ns, second)) == 3
    core.delete_namespace(ns)


def wait_running_launcher(core, ns: str, job: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            ns, label_selector=f"training.kubeflow.org/job-name={job},"
                               "training.kubeflow.org/job-role=launcher").items
        running = [p.metadata.name for p in pods if p.status.phase == "Running"]
        if running:
            return running[0]
        time.sleep(0.5)
    raise AssertionError(f"no Running launcher of {job}")


def test_a_gang_larger_than_the_whole_cluster_ends_in_seconds_with_one_line(gang_cluster):
    """3 workers x 8 GPUs on 2 nodes x 8: Coscheduling can never place the gang; chexflow says
    so from the Nodes' allocatable, not after the full-cluster grace, and deletes the job."""
    from kubernetes import client

    api = gang_cluster.api_client()
    core = client.CoreV1Api(api)
    ns = "gang-never"
    core.create_namespace({"metadata": {"name": ns}})
    be = KubernetesBackend(namespace=ns, api_client=api, poll_seconds=0.5, stream=io.StringIO(),
                           options=ClusterOptions(gang_scheduling=True))
    spec = JobSpec(name="gang-huge", command=["chexflow", "train"], horovod=True, workers=3,
                   gpus_per_worker=8, env={nodes.OUTCOME_ENV: "hold"}, timeout_seconds=300)
    with pytest.raises(JobUnschedulable) as err:
        be.run(spec)
    # "can never be scheduled": from the Nodes' allocatable, not after the full-cluster grace
    assert str(err.value) == (
        "MPIJob gang-never/gang-huge can never be scheduled: its 3 pods ask 3 x 8 = 24 "
        "nvidia.com/gpu; the cluster has 16 in all (2 nodes, at most 8 on one); it was deleted")
    deadline = time.monotonic() + 60
    while core.list_namespaced_pod(ns).items and time.monotonic() < deadline:
        time.sleep(0.5)
    assert core.list_namespaced_pod(ns).items == []
    left = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL)["items"]
    assert [j for j in left if not j["metadata"].get("deletionTimestamp")] == []
    core.delete_namespace(ns)


def _submit(cluster: LocalCluster, ns: str, name: str, *options: str
            ) -> subprocess.CompletedProcess:
    """`chexflow mpijob submit` of 2 workers x 4 GPUs, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "chexflow.cli", "mpijob", "submit", "--name", name,
         "--namespace", ns, "--workers", "2", "--gpus-per-worker", "4", "--timeout", "300",
         *options, "--", "chexflow", "train"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})


def test_an_mpijob_rendered_without_gang_scheduling_runs_on_a_gang_scheduling_cluster(
        gang_cluster):
    """mpi-operator gang-schedules every MPIJob here; one submitted without --gang-scheduling
    gets a PodGroup of its 2 workers (the renderer's minAvailable), runs, and succeeds (before,
    its PodGroup of workers + 1 kept the workers Pending for a launcher that never came)."""
    from kubernetes import client

    api = gang_cluster.api_client()
    ns = "plain"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    proc = _submit(gang_cluster, ns, "plain")
    assert proc.returncode == 0, proc.stderr
    assert "MPIJob/plain succeeded" in proc.stdout, proc.stdout
    pods = client.CoreV1Api(api).list_namespaced_pod(ns).items
    assert all(p.spec.scheduler_name == coscheduling.SCHEDULER_NAME for p in pods), pods
    client.CoreV1Api(api).delete_namespace(ns)


def test_a_gang_that_counts_the_launcher_its_workers_wait_for_is_one_line_at_once(
        gang_cluster):
    """--min-available 3 with 2 workers: the PodGroup waits for the launcher, which mpi-operator
    creates only once the workers are ready; the wait ends with one line saying so."""
    from kubernetes import client

    api = gang_cluster.api_client()
    ns = "gang-short"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    proc = _submit(gang_cluster, ns, "short", "--gang-scheduling", "--min-available", "3")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"chexflow mpijob: error: MPIJob {ns}/short cannot be scheduled: pod "
                           "short-worker-"), line
    assert ("its gang never forms: the gang scheduler's PodGroup waits for 3 pods together, "
            "but only the 2 worker(s) come before the launcher") in line, line
    assert "set runPolicy.schedulingPolicy.minAvailable to 2" in line
    assert "cannot find enough sibling pods" in line and "minMember of group: 3" in line
    client.CoreV1Api(api).delete_namespace(ns)
