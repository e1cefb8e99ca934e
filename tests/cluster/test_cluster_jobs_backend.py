"""chexflow's kubernetes job backend (chexflow.jobs.kubernetes) against the local control plane:
the rendered MPIJob is accepted by the apiserver's CRD schema, mpi-operator runs it on kwok GPU
nodes, and success, failure, timeout and unschedulable outcomes come back to the caller; RBAC
from mpijob/rbac.yaml is enough for it and no more."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from chexflow.devcluster import nodes
from chexflow.devcluster.controlplane import KWOK_POD_LOG
from chexflow.envs import REPO_ROOT
from chexflow.jobs import kubernetes as kubernetes_backend
from chexflow.jobs.kubernetes import KubernetesBackend
from chexflow.jobs.spec import JobFailed, JobSpec, JobTimeout

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
TRAIN = ["python", "-m", "chexflow.cli", "train", "--data", "/data/tfrecords", "--epochs", "1"]


def train_spec(name: str, gpus: int = 4, workers: int = 2, outcome: str | None = None,
               timeout: int = 120, backoff_limit: int | None = None) -> JobSpec:
    env = {nodes.OUTCOME_ENV: outcome} if outcome else {}
    return JobSpec(name=name, command=TRAIN, horovod=True, workers=workers,
                   gpus_per_worker=gpus, env=env, timeout_seconds=timeout,
                   backoff_limit=backoff_limit)


def backend(api, ns: str, **kwargs) -> KubernetesBackend:
    return KubernetesBackend(namespace=ns, api_client=api, poll_seconds=0.5,
                             stream=io.StringIO(), **kwargs)


def test_backend_runs_training_mpijob_to_success(k8s_api, k8s_namespace):
    from kubernetes import client

    ns = k8s_namespace
    # keep everything afterwards so the test can look at what mpi-operator made
    be = backend(k8s_api, ns, delete_policy="never", clean_pod_policy="None")
    result = be.run(train_spec("train-ok"))
    assert result.succeeded and result.resource == "MPIJob/train-ok"
    assert result.log_tail == KWOK_POD_LOG  # the launcher's log, through kwok's kubelet API

    mpijob = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "train-ok")
    assert any(c["type"] == "Succeeded" and c["status"] == "True"
               for c in mpijob["status"]["conditions"])
    launcher = client.BatchV1Api(k8s_api).read_namespaced_job("train-ok-launcher", ns)
    assert launcher.status.succeeded == 1
    workers = client.CoreV1Api(k8s_api).list_namespaced_pod(
        ns, label_selector="training.kubeflow.org/job-role=worker").items
    assert len(workers) == 2
    for pod in workers:
        assert pod.spec.containers[0].resources.limits[nodes.GPU_RESOURCE] == "4"
        assert pod.spec.node_name.startswith("kwok-gpu-")
    assert "created MPIJob" in be.stream.getvalue()


def test_backend_reports_a_failed_launcher_with_status_and_reason(k8s_api, k8s_namespace):
    """One retry (runPolicy.backoffLimit 1): the launcher fails twice; each failed attempt is
    reported as it happens, then the MPIJob's Failed condition with the launcher's log."""
    be = backend(k8s_api, k8s_namespace)
    with pytest.raises(JobFailed) as err:
        be.run(train_spec("train-crash", workers=1, gpus=1, outcome="fail", backoff_limit=1))
    message = str(err.value)
    assert f"MPIJob {k8s_namespace}/train-crash failed" in message
    assert "BackoffLimitExceeded" in message  # (reason: message) from the Failed condition
    assert not isinstance(err.value, JobTimeout)
    assert KWOK_POD_LOG.strip() in err.value.log_tail
    lines = be.stream.getvalue()
    assert "attempt 1 failed in pod train-crash-launcher-" in lines
    assert "(exit code 1: containerFailed)" in lines


def test_backend_timeout_ends_and_cleans_up(k8s_api, k8s_namespace):
    from kubernetes import client

    be = backend(k8s_api, k8s_namespace)
    with pytest.raises(JobTimeout) as err:
        be.run(train_spec("train-slow", workers=1, gpus=1, outcome="hold", timeout=5))
    assert "DeadlineExceeded" in str(err.value)

    def running() -> list[str]:
        pods = client.CoreV1Api(k8s_api).list_namespaced_pod(k8s_namespace).items
        return [p.metadata.name for p in pods
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp]

    # mpi-operator deletes the pods (cleanPodPolicy Running) right after marking it Failed
    deadline = time.monotonic() + 30
    while running() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running() == []


def test_backend_explains_why_an_mpijob_cannot_be_scheduled(k8s_api, k8s_namespace):
    """More GPUs per worker than any node has: at the first unschedulable pod the backend sees
    from the Nodes' allocatable that no node could ever hold it (capacity.py) and fails at once
    with one line, not after the full-cluster grace, and deletes the job."""
    from kubernetes import client

    be = backend(k8s_api, k8s_namespace)
    with pytest.raises(kubernetes_backend.JobUnschedulable) as err:
        be.run(train_spec("train-greedy", workers=1, gpus=16, timeout=600))
    # "can never be scheduled": from the Nodes, not after the scheduler's reason outlived the grace
    assert str(err.value).startswith(
        f"MPIJob {k8s_namespace}/train-greedy can never be scheduled: a pod asks 16 "
        f"{nodes.GPU_RESOURCE}; the cluster has 32 in all (")
    assert "at most 8 on one); it was deleted" in str(err.value)
    left = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, PLURAL)["items"]
    assert [j["metadata"]["name"] for j in left
            if not j["metadata"].get("deletionTimestamp")] == []


def test_launcher_service_account_from_rbac_yaml_can_run_jobs_and_nothing_more(
        k8s_cluster, k8s_api, k8s_namespace):
    from kubernetes import client, utils
    from kubernetes.client.rest import ApiException

    ns = k8s_namespace
    docs = [d for d in yaml.safe_load_all((REPO_ROOT / "mpijob" / "rbac.yaml").read_text()) if d]
    sa = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    utils.create_from_yaml(k8s_api, yaml_objects=docs, namespace=ns)

    as_sa = k8s_cluster.api_client()
    as_sa.set_default_header("Impersonate-User", f"system:serviceaccount:{ns}:{sa}")
    result = backend(as_sa, ns, service_account=sa).run(train_spec("train-as-sa"))
    assert result.succeeded

    core = client.CoreV1Api(as_sa)
    assert core.read_namespace(ns).metadata.name == ns  # whether it is being deleted
    for forbidden in (lambda: core.list_namespaced_secret(ns),
                      lambda: core.read_namespaced_secret("anything", ns),
                      lambda: core.list_node(),
                      lambda: core.read_namespace("default"),
                      lambda: core.patch_node("kwok-gpu-0", {"metadata": {"labels": {"x": "y"}}}),
                      lambda: client.RbacAuthorizationV1Api(as_sa).list_namespaced_role(ns)):
        with pytest.raises(ApiException) as err:
            forbidden()
        assert err.value.status == 403, err.value.body


def test_apiserver_accepts_every_cluster_field_of_a_rendered_mpijob(k8s_api, k8s_namespace):
    """Server-side dry run: the real CRD schema takes the MPIJob with every ClusterOptions field
    and prunes nothing (what it returns is what was sent)."""
    from kubernetes import client

    from chexflow.jobs.render import render_mpijob
    from chexflow.jobs.spec import ClusterOptions, parse_toleration

    options = ClusterOptions(
        node_selector={"pool": "gpu"}, tolerations=[parse_toleration("dedicated=ml:NoSchedule")],
        priority_class="high", image_pull_secrets=["regcred"], gang_scheduling=True,
        volcano_queue="research")
    spec = JobSpec(name="dry", command=TRAIN, horovod=True, workers=2, gpus_per_worker=8,
                   slots_per_worker=8)
    obj = render_mpijob(spec, namespace=k8s_namespace, options=options)
    back = client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, PLURAL, obj, dry_run="All")
    for role in ("Launcher", "Worker"):
        sent = obj["spec"]["mpiReplicaSpecs"][role]["template"]
        got = back["spec"]["mpiReplicaSpecs"][role]["template"]
        assert got["metadata"]["annotations"] == sent["metadata"]["annotations"]
        for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
            assert got["spec"][key] == sent["spec"][key], (role, key)
        assert got["spec"]["containers"][0]["securityContext"] == {
            "runAsUser": 1000, "runAsNonRoot": True}
    assert back["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 2, "queue": "research", "priorityClass": "high"}
    assert back["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    assert back["spec"]["slotsPerWorker"] == 8


def test_a_namespace_deleted_under_a_running_job_is_reported_as_that(k8s_cluster, k8s_api):
    """`chexflow mpijob submit` waits on a running MPIJob (kwok holds its launcher) and its
    namespace is deleted: one line naming the namespace's deletion, not the job's failure
    (mpi-operator marks it Failed, BackoffLimitExceeded, as its pods go)."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    ns = f"doomed-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": ns}})
    submit = subprocess.Popen(
        [sys.executable, "-m", "chexflow.cli", "mpijob", "submit", "--name", "doomed",
         "--namespace", ns, "--workers", "2", "--gpus-per-worker", "4", "--env",
         f"{nodes.OUTCOME_ENV}=hold", "--timeout", "600", "--", *TRAIN],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)})
    try:
        deadline = time.monotonic() + 120
        while not [p for p in core.list_namespaced_pod(
                ns, label_selector="training.kubeflow.org/job-role=launcher").items
                if p.status.phase == "Running"]:
            assert submit.poll() is None, submit.communicate()
            assert time.monotonic() < deadline, "no running launcher in 120 s"
            time.sleep(0.5)
        core.delete_namespace(ns)
        _, err = submit.communicate(timeout=300)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
    assert submit.returncode == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"chexflow mpijob: error: MPIJob {ns}/doomed did not finish: "
                           f"namespace {ns} "), err
    assert "is being deleted while it ran" in line or "was deleted while it ran" in line, line
