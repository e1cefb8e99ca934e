"""chexflow-launcher, the account of mpijob/rbac.yaml and mpijob/rbac-cluster.yaml, as the
pipeline steps use it: chexflow's kubernetes backend, authenticated as a pod of that account is
(a token from the TokenRequest API), runs an MPIJob, a Kubeflow Trainer TrainJob and a batch Job
to success on the local cluster's kwok nodes (pods without processes: what RBAC decides is the
same). Every request's status is recorded: a 403, even one the backend goes on after (a watch,
a log), fails the test."""

from __future__ import annotations

import copy
import io

import pytest
import yaml

from chexflow.devcluster.nodes import HOLD_LABEL
from chexflow.devcluster.trainer import Trainer
from chexflow.envs import REPO_ROOT
from chexflow.jobs.kubernetes import KubernetesBackend
from chexflow.jobs.spec import JobSpec
from chexflow.jobs.trainjob import (
    NODE,
    RUNTIME_PLURAL,
    TRAINJOB_GROUP,
    TRAINJOB_VERSION,
    horovod_runtime,
)
from tests.rbac_requests import StatusRecorder, granted

pytestmark = pytest.mark.cluster

RBAC, CLUSTER_RBAC = REPO_ROOT / "mpijob" / "rbac.yaml", REPO_ROOT / "mpijob" / "rbac-cluster.yaml"
RUNTIME = "chexflow-horovod-rbac"  # a runtime of this test's own, deleted after it


@pytest.fixture(scope="module")
def kwok_runtime(k8s_cluster):
    """The session cluster with Trainer and JobSet, and chexflow's runtime under another name
    whose node pods kwok keeps running (as sshd would) until the launcher's pod completes."""
    from kubernetes import client

    if not k8s_cluster.has("trainer"):
        k8s_cluster.add(Trainer(), timeout=180)
    body = copy.deepcopy(horovod_runtime())
    body["metadata"]["name"] = RUNTIME
    for rjob in body["spec"]["template"]["spec"]["replicatedJobs"]:
        if rjob["name"] == NODE:
            rjob["template"]["spec"]["template"]["metadata"]["labels"][HOLD_LABEL] = "true"
    custom = client.CustomObjectsApi(k8s_cluster.api_client())
    custom.create_cluster_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL, body)
    yield RUNTIME
    custom.delete_cluster_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL, RUNTIME)


def apply(api, path, namespace: str) -> list[dict]:
    """The file's objects created (cluster-scoped ones kept if there); returns them."""
    from kubernetes import utils

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        try:
            utils.create_from_dict(api, doc, namespace=namespace)
        except utils.FailToCreateError as e:
            if any(getattr(x, "status", None) != 409 for x in e.api_exceptions):
                raise
    return docs


def token_client(admin, namespace: str, account: str):
    """An ApiClient authenticated as a pod of `account` is: a token of the TokenRequest API,
    no client certificate."""
    from kubernetes import client

    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.configuration.host, admin.configuration.ssl_ca_cert
    cfg.api_key, cfg.api_key_prefix = {"authorization": token}, {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def test_launcher_account_runs_an_mpijob_a_trainjob_and_a_batch_job_without_a_403(
        k8s_api, k8s_namespace, kwok_runtime):
    from kubernetes import client

    ns = k8s_namespace
    apply(k8s_api, RBAC, ns)
    cluster_docs = apply(k8s_api, CLUSTER_RBAC, ns)
    try:
        as_sa = token_client(k8s_api, ns, "chexflow-launcher")
        recorder = StatusRecorder(as_sa)

        def backend(**kw) -> KubernetesBackend:
            return KubernetesBackend(namespace=ns, api_client=as_sa, poll_seconds=0.5,
                                     stream=io.StringIO(), service_account="chexflow-launcher",
                                     **kw)

        horovod = {"command": ["chexflow", "train"], "horovod": True, "workers": 2,
                   "timeout_seconds": 120}
        results = [backend().run(JobSpec(name="rbac-mpijob", gpus_per_worker=1, **horovod)),
                   backend(job_kind="trainjob", runtime=kwok_runtime).run(
                       JobSpec(name="rbac-trainjob", **horovod)),
                   backend().run(JobSpec(name="rbac-job", command=["chexflow", "evaluate"],
                                         timeout_seconds=120))]
    finally:
        rbac = client.RbacAuthorizationV1Api(k8s_api)
        for doc in cluster_docs:
            kind = "cluster_role_binding" if doc["kind"] == "ClusterRoleBinding" else \
                "cluster_role"
            getattr(rbac, f"delete_{kind}")(doc["metadata"]["name"])
    assert [r.resource for r in results] == ["MPIJob/rbac-mpijob", "TrainJob/rbac-trainjob",
                                             "Job/rbac-job"]
    assert recorder.refused() == []
    assert recorder.used() <= granted(RBAC, CLUSTER_RBAC)
