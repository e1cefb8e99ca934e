"""`cluster down` then `cluster up` on the same folder with Katib (LocalCluster.stop, start):
a finished Experiment, its Trials and their observations are still there, the images stay in
the real node's containerd, and Katib answers again (its webhook admits a new Experiment).

It stops and resumes the package's Katib cluster: the tests after it find the same cluster."""

from __future__ import annotations

import json

import pytest
import yaml

from chexflow.devcluster.realnode import RealNode
from tests.cluster.test_cluster_katib_tune import _job_spec, tune

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]


def _katib(api, ns: str, plural: str) -> list[dict]:
    from kubernetes import client

    return client.CustomObjectsApi(api).list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, plural)["items"]


def test_a_finished_experiment_and_its_trials_are_there_after_down_and_up_on_the_same_folder(
        katib_cluster, katib_namespace, katib_base_image, tmp_path):
    ns = katib_namespace
    name = f"kept-{ns[-5:]}"
    spec = tmp_path / "spec.yaml"
    script = 'echo "lr=${trialParameters.lr}"; echo "val_auroc=0.75"'
    spec.write_text(yaml.safe_dump(_job_spec(name, katib_base_image, script)))
    proc = tune(katib_cluster, spec, ns, tmp_path / "state", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "state" / "results.json").read_text())
    assert results["condition"]["type"] == "Succeeded", results
    before = _katib(katib_cluster.api_client(), ns, "experiments")[0]
    trials = _katib(katib_cluster.api_client(), ns, "trials")

    katib_cluster.stop()
    katib_cluster.start(timeout=600)  # the same state folder: resumed

    api = katib_cluster.api_client()
    (after,) = _katib(api, ns, "experiments")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["currentOptimalTrial"] == before["status"]["currentOptimalTrial"]
    assert after["status"]["trialsSucceeded"] == 1, after["status"]
    kept = {t["metadata"]["name"]: t["status"].get("observation") for t in _katib(api, ns,
                                                                                   "trials")}
    assert kept == {t["metadata"]["name"]: t["status"].get("observation") for t in trials}
    assert RealNode(katib_cluster.state_dir).has_image(katib_base_image)
    # Katib's webhook (its controller, restarted by the kubelet) admits a new Experiment
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(_job_spec(f"again-{ns[-5:]}", katib_base_image,
                                             'echo "${trialParameters.lr}"')))
    proc = tune(katib_cluster, again, ns, tmp_path / "state2", "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
