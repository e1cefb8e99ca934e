"""chexflow.devcluster.kueue without a cluster: which of Kueue's webhooks the local cluster
registers and where the apiserver calls them, and Kueue's Configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chexflow.devcluster import kueue


def kueue_module() -> Path:
    """Kueue's module as build/kueue/go.mod names it, in the Go module cache (skipped when the
    cache does not have it: build.sh downloads it)."""
    import json
    import os
    import subprocess

    proc = subprocess.run(["go", "list", "-m", "-json", "sigs.k8s.io/kueue"], cwd=kueue.KUEUE_DIR,
                          capture_output=True, text=True,
                          env={**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off",
                               "PATH": f"/usr/local/go/bin:{os.environ['PATH']}"})
    folder = json.loads(proc.stdout).get("Dir") if proc.returncode == 0 else None
    if not folder:
        pytest.skip(f"Kueue's module not in the Go module cache: {proc.stderr.strip()[-200:]}")
    return Path(folder)


def hook(name: str, path: str, group: str, resource: str) -> dict:
    return {"name": name, "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                         "path": path}},
            "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": [resource]}]}


def test_only_kueues_own_and_the_integrations_webhooks_are_registered_on_loopback(
        tmp_path: Path):
    """Kueue's own kinds', the MPIJob's and the TrainJob's webhooks, by the kinds their rules
    cover: not the batch Job's, the Pod's, nor another kubeflow.org kind's."""
    manifests = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [hook("mjob.kb.io", "/mutate-batch-v1-job", "batch", "jobs"),
                      hook("mpod.kb.io", "/mutate--v1-pod", "", "pods"),
                      hook("mmpijob.kb.io", "/mutate-kubeflow-org-v2beta1-mpijob",
                           "kubeflow.org", "mpijobs"),
                      hook("mpytorchjob.kb.io", "/mutate-kubeflow-org-v1-pytorchjob",
                           "kubeflow.org", "pytorchjobs"),
                      hook("mtrainjob.kb.io", "/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
                           "trainer.kubeflow.org", "trainjobs"),
                      hook("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload",
                           "kueue.x-k8s.io", "workloads")]},
    ]
    (tmp_path / "webhooks.yaml").write_text(yaml.safe_dump_all(manifests))
    [config] = kueue.webhook_configurations(tmp_path, 9443, "Q0E=")
    assert config["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert [h["name"] for h in config["webhooks"]] == ["mmpijob.kb.io", "mtrainjob.kb.io",
                                                       "mworkload.kb.io"]
    assert config["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-kubeflow-org-v2beta1-mpijob", "caBundle": "Q0E="}
    assert config["webhooks"][1]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
        "caBundle": "Q0E="}


def test_the_modules_own_manifests_give_each_integration_its_mutating_and_validating_webhook(
        tmp_path: Path):
    """In the webhook manifests of the Kueue release build/kueue/go.mod names (its module in the
    Go module cache; skipped without it): each integration's kind has a mutating webhook (the
    one that suspends a queued job) and a validating one, and nothing else of a job kind is
    kept."""
    manifests = kueue_module() / "config" / "components" / "webhook" / "manifests.yaml"
    (tmp_path / "webhooks.yaml").write_text(manifests.read_text())  # as build.sh copies it
    out = kueue.webhook_configurations(tmp_path, 9443, "Q0E=")
    kept = {(doc["kind"], rule["apiGroups"][0], resource)
            for doc in out for h in doc["webhooks"] for rule in h["rules"]
            for resource in rule["resources"] if rule["apiGroups"][0] != kueue.GROUP}
    assert kept == {(kind, group, plural) for group, plural in kueue.INTEGRATIONS.values()
                    for kind in ("MutatingWebhookConfiguration",
                                 "ValidatingWebhookConfiguration")}


def test_kueues_own_cluster_role_grants_its_trainjob_controller_what_it_uses():
    """Kueue runs as the cluster's admin here; where it runs as its manifests deploy it, their
    ClusterRole grants the TrainJob controller the TrainJobs (and status, finalizers), the
    runtimes it reads to size the Workload, and the JobSets it owns."""
    role = yaml.safe_load((kueue_module() / "config/components/rbac/role.yaml").read_text())
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule.get("apiGroups", []) for resource in rule.get("resources", [])
               for verb in rule.get("verbs", [])}
    trainer = "trainer.kubeflow.org"
    needed = {(trainer, "trainjobs", v) for v in ("get", "list", "watch", "update", "patch")}
    needed |= {(trainer, "trainjobs/status", v) for v in ("get", "update", "patch")}
    needed |= {(trainer, r, v) for r in ("trainingruntimes", "clustertrainingruntimes")
               for v in ("get", "list", "watch")}
    needed |= {("jobset.x-k8s.io", "jobsets", v) for v in ("get", "list", "watch")}
    assert needed <= granted


def test_configuration_enables_the_mpijob_and_trainjob_integrations_on_loopback_and_pods_ready(
        tmp_path: Path):
    ports = {"kueue_health": 1, "kueue_metrics": 2, "kueue_webhook": 3}
    config = kueue.configuration(ports, tmp_path)
    # Kueue's names (FrameworkName in pkg/controller/jobs/{mpijob,trainjob})
    assert config["integrations"] == {"frameworks": ["kubeflow.org/mpijob",
                                                     "trainer.kubeflow.org/trainjob"]}
    assert config["webhook"] == {"port": 3, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert config["internalCertManagement"] == {"enable": False}
    # Kueue v0.19 turns waitForPodsReady on when the Configuration names none: it is named here
    assert config["waitForPodsReady"] == {"timeout": "30m", "blockAdmission": False}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:1"
    assert kueue.cache_dir().name.startswith(f"kueue-{kueue.BUILD.version()}-")
