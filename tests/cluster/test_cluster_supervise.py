"""The local cluster keeps itself running and keeps its objects (kwok nodes only, no real node):
a detached `chexflow cluster up` is supervised (etcd and the scheduler SIGKILLed are restarted
with their arguments, counted, logged; `chexflow cluster status` says so and names a component
that stays down); `cluster down` then `cluster up` on the same folder resumes the objects,
`--fresh` starts empty."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.supervisor import runs
from chexflow.envs import REPO_ROOT

pytestmark = pytest.mark.cluster

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*CHEXFLOW, "cluster", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, check=check)


def _configmap(state: Path, name: str):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(LocalCluster.attach(state).api_client())
    try:
        return core.read_namespaced_config_map(name, "default").data
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _wait_restarted(state: Path, name: str, old_pid: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = json.loads((state / "cluster.json").read_text())["processes"][name]
        if proc["pid"] != old_pid and runs(proc["pid"], proc["exe"]):
            return proc
        time.sleep(0.5)
    raise AssertionError(f"{name} not restarted in {timeout:.0f} s; "
                         f"{(state / 'logs' / 'supervisor.log').read_text()[-2000:]}")


def test_detached_cluster_restarts_killed_components_and_resumes_its_objects(tmp_path):
    from kubernetes import client

    state = tmp_path / "c"
    up = ["up", "--dir", str(state), "--nodes", "1", "--gpus-per-node", "0", "--timeout", "240"]
    _cli(*up)
    try:
        cluster = LocalCluster.attach(state)
        core = client.CoreV1Api(cluster.api_client())
        core.create_namespaced_config_map("default", {"metadata": {"name": "kept"},
                                                      "data": {"k": "v"}})
        for name in ("etcd", "kube-scheduler"):
            old = LocalCluster.attach(state).processes[name]
            os.kill(old["pid"], signal.SIGKILL)
            new = _wait_restarted(state, name, old["pid"])
            assert new["args"] == old["args"] and new["restarts"] == 1, new
            assert "restart 1 ---" in (state / "logs" / f"{name}.log").read_text()
        # etcd kept its data folder: the object written before its restart is there
        deadline = time.monotonic() + 60
        while (data := _safe_configmap(state, "kept")) is None and time.monotonic() < deadline:
            time.sleep(1)
        assert data == {"k": "v"}
        status = _cli("status", "--dir", str(state))
        assert "supervised by pid" in status.stdout, status.stdout
        assert [ln.split()[-1] for ln in status.stdout.splitlines()
                if ln.split()[:1] == ["etcd"]] == ["1"], status.stdout
        # without its supervisor, a killed component stays down and status says how to recover
        supervisor = json.loads((state / "supervisor.json").read_text())["pid"]
        os.kill(supervisor, signal.SIGKILL)
        os.kill(LocalCluster.attach(state).processes["kwok"]["pid"], signal.SIGKILL)
        time.sleep(1)
        status = _cli("status", "--dir", str(state), check=False)
        assert status.returncode == 1, status.stdout
        assert "down: kwok;" in status.stdout and "cluster up --dir" in status.stdout
        server = LocalCluster.attach(state).server
        _cli("down", "--dir", str(state))
        status = _cli("status", "--dir", str(state), check=False)
        assert status.returncode == 1 and "resumes it" in status.stdout, status.stdout
        # resume: the same folder, the objects are back
        _cli(*up)
        assert LocalCluster.attach(state).server == server  # the same port: kubeconfigs hold
        assert _configmap(state, "kept") == {"k": "v"}
        _cli("down", "--dir", str(state))
        _cli(*up, "--fresh")
        assert _configmap(state, "kept") is None
    finally:
        _cli("down", "--dir", str(state), check=False)


def _safe_configmap(state: Path, name: str):
    """The ConfigMap's data, or None while the apiserver is still reconnecting to etcd."""
    try:
        return _configmap(state, name)
    except Exception:  # noqa: BLE001 - a 5xx or a reset connection while etcd restarts
        return None
