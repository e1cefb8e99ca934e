"""`chexflow images pull-secret --apply` on the session cluster: the registry login of a
containers-auth.json file becomes a kubernetes.io/dockerconfigjson Secret as the kubelet reads
it (`.dockerconfigjson` with `auths.HOST:PORT.auth`), created and, the second time, replaced."""

from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import run_chexflow

pytestmark = [pytest.mark.cluster]

REGISTRY = "registry.example:5000"


def _authfile(tmp_path, password: str):
    path = tmp_path / f"auth-{password}.json"
    auth = base64.b64encode(f"chexflow:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {REGISTRY: {"auth": auth}}}))
    return path, auth


def test_pull_secret_apply_creates_then_replaces_the_dockerconfigjson_secret(
        k8s_cluster, k8s_api, k8s_namespace, tmp_path):
    from kubernetes import client

    env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    for password in ("first", "second"):
        authfile, auth = _authfile(tmp_path, password)
        proc = run_chexflow("images", "pull-secret", "--name", "regcred", "--namespace",
                            k8s_namespace, "--registry", REGISTRY, "--authfile", authfile,
                            "--apply", env=env, timeout=120)
        assert proc.stderr.strip() == (f"Secret {k8s_namespace}/regcred of type "
                                       "kubernetes.io/dockerconfigjson applied")
        secret = client.CoreV1Api(k8s_api).read_namespaced_secret("regcred", k8s_namespace)
        assert secret.type == "kubernetes.io/dockerconfigjson"
        config = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))
        assert config["auths"][REGISTRY]["auth"] == auth
