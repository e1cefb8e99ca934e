"""`cluster down` then `cluster up` on the same folder with Katib (LocalCluster.stop, start):
a finished Experiment, its Trials and their observations are still there, `chexflow tune` of the
same spec reads them (optimal trial, observations, and the observation logs db-manager keeps in
katib-mysql, whose data folder survives), the images stay in the real node's containerd, and
Katib answers again (its webhook admits a new Experiment).

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
    logs = json.loads((tmp_path / "state" / "observation-logs.json").read_text())
    assert [[float(m["value"]) for m in t["val_auroc"]] for t in logs.values()] == [[0.75]]
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
    # tune of the same spec reads the finished Experiment (nothing created or run again)
    proc = tune(katib_cluster, spec, ns, tmp_path / "read", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exists with this spec" in proc.stdout, proc.stdout
    read = json.loads((tmp_path / "read" / "results.json").read_text())
    assert read["optimal"] == results["optimal"]
    assert [(t["trial"], t["lr"], t["observation"]) for t in read["trials"]] == \
        [(t["trial"], t["lr"], t["observation"]) for t in results["trials"]]
    assert json.loads((tmp_path / "read" / "observation-logs.json").read_text()) == logs
    assert len(_katib(api, ns, "trials")) == 1
    # another spec under the same name: one line
    spec.write_text(yaml.safe_dump(_job_spec(name, katib_base_image, script + "; true")))
    proc = tune(katib_cluster, spec, ns, tmp_path / "other", timeout=120)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "already exists with a different spec" in proc.stderr
    # Katib's webhook (its controller, restarted by the kubelet) admits a new Experiment
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(_job_spec(f"again-{ns[-5:]}", katib_base_image,
                                             'echo "${trialParameters.lr}"')))
    proc = tune(katib_cluster, again, ns, tmp_path / "state2", "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
