"""chexflow.devcluster.kueue without a cluster: which of Kueue's webhooks the local cluster
registers and where the apiserver calls them, and Kueue's Configuration."""

from __future__ import annotations

from pathlib import Path

import yaml

from chexflow.devcluster import kueue


def hook(name: str, path: str, group: str, resource: str) -> dict:
    return {"name": name, "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                         "path": path}},
            "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": [resource]}]}


def test_only_kueues_own_and_the_mpijob_webhooks_are_registered_on_loopback(tmp_path: Path):
    manifests = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [hook("mjob.kb.io", "/mutate-batch-v1-job", "batch", "jobs"),
                      hook("mpod.kb.io", "/mutate--v1-pod", "", "pods"),
                      hook("mmpijob.kb.io", "/mutate-kubeflow-org-v2beta1-mpijob",
                           "kubeflow.org", "mpijobs"),
                      hook("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload",
                           "kueue.x-k8s.io", "workloads")]},
    ]
    (tmp_path / "webhooks.yaml").write_text(yaml.safe_dump_all(manifests))
    [config] = kueue.webhook_configurations(tmp_path, 9443, "Q0E=")
    assert config["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert [h["name"] for h in config["webhooks"]] == ["mmpijob.kb.io", "mworkload.kb.io"]
    assert config["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-kubeflow-org-v2beta1-mpijob", "caBundle": "Q0E="}


def test_configuration_enables_only_the_mpijob_integration_on_loopback_and_names_pods_ready(
        tmp_path: Path):
    ports = {"kueue_health": 1, "kueue_metrics": 2, "kueue_webhook": 3}
    config = kueue.configuration(ports, tmp_path)
    assert config["integrations"] == {"frameworks": ["kubeflow.org/mpijob"]}
    assert config["webhook"] == {"port": 3, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert config["internalCertManagement"] == {"enable": False}
    # Kueue v0.19 turns waitForPodsReady on when the Configuration names none: it is named here
    assert config["waitForPodsReady"] == {"timeout": "30m", "blockAdmission": False}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:1"
    assert kueue.cache_dir().name.startswith(f"kueue-{kueue.BUILD.version()}-")
