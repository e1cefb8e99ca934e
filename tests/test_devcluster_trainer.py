"""Trainer v2 and JobSet in the local cluster: the build's cache key (build/trainer/build.sh and
chexflow.devcluster.trainer agree), the configurations the local processes get, and the modules'
webhook manifests as installed (kustomize's patches applied, pointed at 127.0.0.1)."""

from __future__ import annotations

import subprocess

import pytest

from chexflow.devcluster import trainer
from chexflow.devcluster.binaries import required_version


def test_cache_key_is_the_one_build_sh_computes(tmp_path, monkeypatch):
    monkeypatch.setenv("CHEXFLOW_K8S_CACHE", str(tmp_path))
    script = trainer.BUILD_SCRIPT.read_text()
    key_lines = [line for line in script.splitlines()
                 if line.startswith(("version_of()", "trainer_version=", "jobset_version=",
                                     "key=", "dest="))]
    assert len(key_lines) == 5
    out = subprocess.run(["bash", "-c", f"cd {trainer.TRAINER_DIR} && "
                          + "\n".join(key_lines) + '\necho "$dest"'],
                         capture_output=True, text=True, check=True,
                         env={"CHEXFLOW_K8S_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path)}).stdout.strip()
    assert out == str(trainer.cache_dir())
    assert trainer.cache_dir().name.startswith("trainer-v2.3.0-")
    assert required_version(trainer.TRAINER_DIR / "jobset" / "go.mod",
                            "sigs.k8s.io/jobset") == "v0.12.0"


def test_configurations_keep_every_server_on_loopback_without_leader_election():
    ports = {name: 1000 + i for i, name in enumerate(trainer.PORTS)}
    js = trainer.jobset_configuration(ports, trainer.TRAINER_DIR)
    tr = trainer.trainer_configuration(ports)
    assert js["webhook"] == {"port": ports["jobset_webhook"], "host": "127.0.0.1",
                             "certDir": str(trainer.TRAINER_DIR)}
    assert tr["webhook"] == {"port": ports["trainer_webhook"], "host": "127.0.0.1"}
    for cfg, name in ((js, "jobset"), (tr, "trainer")):
        assert cfg["health"]["healthProbeBindAddress"] == f"127.0.0.1:{ports[name + '_health']}"
        assert cfg["leaderElection"] == {"leaderElect": False}
        assert cfg["metrics"]["bindAddress"] == "0"
    assert js["internalCertManagement"] == {"enable": False}
    assert tr["certManagement"] == {"enable": False}


def test_json_patch_replaces_adds_and_refuses_other_ops():
    doc = {"metadata": {"name": "a"}, "webhooks": [{"x": 1}, {"x": 2}]}
    trainer._json_patch(doc, [{"op": "replace", "path": "/webhooks/1", "value": {"x": 3}},
                              {"op": "replace", "path": "/metadata/name", "value": "b"},
                              {"op": "add", "path": "/webhooks/0/objectSelector", "value": {}},
                              {"op": "add", "path": "/webhooks/-", "value": {"x": 4}},
                              {"op": "add", "path": "/webhooks/0", "value": {"x": 0}}])
    assert doc == {"metadata": {"name": "b"},
                   "webhooks": [{"x": 0}, {"x": 1, "objectSelector": {}}, {"x": 3}, {"x": 4}]}
    with pytest.raises(trainer.TrainerError, match="unsupported op 'remove'"):
        trainer._json_patch(doc, [{"op": "remove", "path": "/metadata"}])


@pytest.mark.slow
def test_webhooks_from_the_built_manifests_call_loopback_and_select_jobset_pods():
    bin_dir = trainer.ensure_binaries()  # built once (cached by content), as the cluster tests do
    js = trainer.webhook_configurations(bin_dir, "jobset", 9443, "Q0E=")
    tr = trainer.webhook_configurations(bin_dir, "trainer", 9444, "Q0E=")
    names = {d["metadata"]["name"] for d in js + tr}
    assert names == {"jobset-mutating", "jobset-validating", "trainer-mutating",
                     "trainer-validating"}
    for doc, port in [(d, 9443) for d in js] + [(d, 9444) for d in tr]:
        for hook in doc["webhooks"]:
            assert hook["clientConfig"]["url"].startswith(f"https://127.0.0.1:{port}/")
            assert hook["clientConfig"]["caBundle"] == "Q0E="
    # Trainer's validating patch: objects labelled webhook-validation=disabled opt out
    (validating,) = [d for d in tr if d["metadata"]["name"] == "trainer-validating"]
    assert validating["webhooks"][0]["objectSelector"]["matchExpressions"][0]["key"] == \
        "trainer.kubeflow.org/webhook-validation"
    pod_hooks = [h for d in js for h in d["webhooks"] if h["clientConfig"]["url"].endswith(
        "--v1-pod")]
    assert len(pod_hooks) == 2  # JobSet's kustomize patch: only pods of a JobSet
    for hook in pod_hooks:
        assert hook["objectSelector"]["matchExpressions"][0]["key"] == \
            "jobset.sigs.k8s.io/jobset-name"
