"""docs/katib.md's first sweeps, run as they stand with the Katib cluster's kubectl in a
namespace other than `kubeflow`: `chexflow images render`, then `kubectl patch --local` of a
shipped spec with katib/patches/first-sweep-*.yaml piped to `kubectl apply`, then `kubectl
wait` for the Experiment. The CPU spec's sweep runs two MPIJob trials and the TrainJob spec's
two TrainJob trials on chexflow's runtime, each training DenseNet-121 with Horovod size 2 on
the real node's pods, to Succeeded; each trial's observation is its run's metrics.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from chexflow.envs import REPO_ROOT
from tests.cluster.conftest import katib_data_claim
from tests.support.docs_blocks import cluster_shell, marked_block

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

TEST = "tests/cluster/test_cluster_katib_docs_kubectl.py"


def run_first_sweep(cluster, namespace: str, image: str, kind: str, tmp_path: Path) -> dict:
    """docs/katib.md's block `kind` run by bash from a folder holding the repository's katib/
    (the block's `rendered/` is written there, not in the repository), with PVC chexflow-data
    holding 160 generated X-rays at 32 px; returns the Experiment and its trials."""
    from kubernetes import client

    api = cluster.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    shared, pv = katib_data_claim(core, namespace, tmp_path / "pvc")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "katib").symlink_to(REPO_ROOT / "katib")
    try:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", marked_block("katib.md", TEST, kind)],
            cwd=tmp_path / "root", capture_output=True, text=True, timeout=1500,
            env=cluster_shell(cluster, namespace, CHEXFLOW_TRAINER_IMAGE=image))
        name = f"first-sweep-{kind}"
        experiment = custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", namespace,
                                                         "experiments", name)
        trials = custom.list_namespaced_custom_object(
            "kubeflow.org", "v1beta1", namespace, "trials",
            label_selector=f"katib.kubeflow.org/experiment={name}")["items"]
    finally:
        core.delete_persistent_volume(pv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"experiment.kubeflow.org/{name} created" in proc.stdout
    assert f"experiment.kubeflow.org/{name} condition met" in proc.stdout
    assert len([line for line in proc.stdout.splitlines() if " Succeeded " in line]) == 2

    assert experiment["status"]["trialsSucceeded"] == 2, experiment["status"]
    for trial in trials:  # each observation is what the run wrote, from the patched command
        metrics = json.loads((shared / "runs" / "katib" / trial["metadata"]["name"]
                              / "metrics.json").read_text())
        assert metrics["workers"] == 2 and metrics["image_size"] == 32, metrics
        observed = {m["name"]: m for m in trial["status"]["observation"]["metrics"]}
        assert float(observed["val_auroc"]["max"]) == pytest.approx(metrics["val_auroc"],
                                                                    rel=1e-4)
    return {"experiment": experiment, "trials": trials}


@pytest.mark.timeout(1800)
def test_the_docs_first_sweep_of_mpijob_trials_runs_verbatim_with_kubectl(
        katib_cluster, katib_namespace, katib_trainer_image, tmp_path):
    assert katib_namespace != "kubeflow"
    sweep = run_first_sweep(katib_cluster, katib_namespace, katib_trainer_image, "mpijob",
                            tmp_path)
    assert [t["spec"]["runSpec"]["kind"] for t in sweep["trials"]] == ["MPIJob", "MPIJob"]
    spec = sweep["experiment"]["spec"]
    assert spec["maxTrialCount"] == 2 and "earlyStopping" not in spec
    (worker,) = spec["trialTemplate"]["trialSpec"]["spec"]["mpiReplicaSpecs"]["Worker"][
        "template"]["spec"]["containers"]
    assert worker["image"] == katib_trainer_image  # rendered: the image the cluster has


@pytest.mark.timeout(1800)
def test_the_docs_first_sweep_of_trainjob_trials_runs_verbatim_with_kubectl(
        katib_trainer, katib_namespace, katib_trainer_image, tmp_path):
    assert katib_namespace != "kubeflow"
    sweep = run_first_sweep(katib_trainer, katib_namespace, katib_trainer_image, "trainjob",
                            tmp_path)
    assert [t["spec"]["runSpec"]["kind"] for t in sweep["trials"]] == ["TrainJob", "TrainJob"]
    trainer = sweep["experiment"]["spec"]["trialTemplate"]["trialSpec"]["spec"]["trainer"]
    assert trainer["image"] == katib_trainer_image
    assert "nvidia.com/gpu" not in trainer["resourcesPerNode"]["limits"]
