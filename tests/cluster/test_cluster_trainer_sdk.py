"""The Kubeflow SDK on chexflow's TrainJob runtime, as a notebook user drives it:
notebooks/trainer-client.ipynb executed with nbclient on a kernel of the project's one
environment, against the session cluster with Trainer v2 and chexflow's `chexflow-horovod`
runtime (the locally built trainer image). `TrainerClient().train(CustomTrainer(func))` ships a
function that runs chexflow's Horovod worker; the TrainJob's two nodes (the launcher is one)
train DenseNet-121 with Horovod size 2 on real pods, and the SDK reads its status and logs
(JobSet ends the node pods once the launcher completes: the size is read from rank 0's log)."""

from __future__ import annotations

import re

import pytest

from chexflow.envs import REPO_ROOT
from tests.support.notebooks import execute, text_of

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

NOTEBOOK = REPO_ROOT / "notebooks" / "trainer-client.ipynb"


def test_trainer_client_trains_chexflows_densenet_on_two_nodes_from_the_notebook(
        trainer_cluster, k8s_api, real_namespace, tmp_path, monkeypatch):
    from kubernetes import client

    namespace, _ = real_namespace
    monkeypatch.setenv("KUBECONFIG", str(trainer_cluster.kubeconfig))
    text = text_of(execute(NOTEBOOK, tmp_path, timeout=1200, NAMESPACE=namespace, CPU="750m",
                           MEMORY="3Gi"))
    assert "runtime chexflow-horovod: horovod, image chexflow.local/trainer:" in text
    # Trainer v2.3's public ConfigMap is there, so the SDK warns of no missing version
    assert "kubeflow-trainer-public" not in text, text[:3000]
    version = client.CoreV1Api(k8s_api).read_namespaced_config_map(
        "kubeflow-trainer-public", "kubeflow-system").data["kubeflow_trainer_version"]
    assert version == "v2.3.0"
    assert "entrypoint mpirun --hostfile /etc/mpi/hostfile" in text
    # node-1's pod may be gone already: JobSet ends the node pods once the launcher completes
    assert ": Complete, steps [('node-0', 'Succeeded')" in text, text[-3000:]

    jobs = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")["items"]
    (job,) = jobs
    assert job["spec"]["runtimeRef"]["name"] == "chexflow-horovod"
    assert job["spec"]["trainer"]["numNodes"] == 2
    # rank 0's lines (the launcher is node-0): Horovod size 2 over the job's two nodes
    assert re.search(r"train: densenet121 32px, 2 workers \(CPU, .*mpi controller\)", text), \
        text[-3000:]
    assert "final val_auroc=" in text
