"""The local cluster's real node (containerd + kubelet + CNI + CoreDNS) runs real pods."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexflow.devcluster import realnode
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.images import base_archive

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]


def _pod(name: str, image: str, command: list[str], **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "nodeSelector": realnode.node_selector(),
                     "tolerations": [realnode.pod_toleration()],
                     "containers": [{"name": "main", "image": image, "command": command,
                                     "imagePullPolicy": "Never"}], **spec}}


def _wait_phase(core, ns: str, name: str, phases: set[str], timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, ns)
        if pod.status.phase in phases:
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {ns}/{name} still {pod.status.phase}: {pod.status}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def base_image(k8s_cluster) -> str:
    """The debootstrapped Debian base, loaded into the real node's containerd."""
    image = base_archive()
    realnode.RealNode(k8s_cluster.state_dir).import_image(image.archive)
    return image.ref


def test_real_pod_runs_to_succeeded_and_its_log_comes_through_the_apiserver(
        k8s_api, k8s_namespace, base_image):
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(k8s_namespace, _pod("echo", base_image, ["sh", "-c", "echo ok"]))
    pod = _wait_phase(core, k8s_namespace, "echo", {"Succeeded", "Failed"})
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.spec.node_name == realnode.NODE_NAME
    assert ipaddress.ip_address(pod.status.pod_ip) in realnode.POD_SUPERNET
    assert core.read_namespaced_pod_log("echo", k8s_namespace) == "ok\n"


def test_cluster_dns_resolves_services_and_headless_pod_names_from_a_pod(
        k8s_api, k8s_namespace, base_image):
    """As mpi-operator's hostfile needs: `<pod>.<headless service>.<ns>.svc` resolves."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    ns = k8s_namespace
    svc = core.create_namespaced_service(ns, {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "none"}, "ports": [{"port": 80}]}})
    core.create_namespaced_service(ns, {
        "metadata": {"name": "workers"},
        "spec": {"clusterIP": "None", "selector": {"app": "worker"},
                 "ports": [{"port": 2222}]}})
    worker = _pod("worker-0", base_image, ["sleep", "300"], hostname="worker-0",
                  subdomain="workers")
    worker["metadata"]["labels"] = {"app": "worker"}
    core.create_namespaced_pod(ns, worker)
    worker_ip = _wait_phase(core, ns, "worker-0", {"Running"}).status.pod_ip
    lookup = (f"getent hosts web.{ns}.svc.cluster.local; "
              f"for i in $(seq 30); do getent hosts worker-0.workers.{ns}.svc && exit 0; "
              "sleep 1; done; exit 1")
    core.create_namespaced_pod(ns, _pod("lookup", base_image, ["sh", "-c", lookup]))
    pod = _wait_phase(core, ns, "lookup", {"Succeeded", "Failed"})
    log = core.read_namespaced_pod_log("lookup", ns)
    assert pod.status.phase == "Succeeded", log
    assert f"{svc.spec.cluster_ip} " in log
    assert ipaddress.ip_address(svc.spec.cluster_ip) in ipaddress.ip_network("198.19.0.0/16")
    assert f"{worker_ip} " in log and f"worker-0.workers.{ns}.svc" in log


def test_gpu_pods_go_to_kwok_nodes_and_untolerating_pods_never_to_the_real_node(
        k8s_api, k8s_namespace, base_image):
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    gpu = _pod("gpu", base_image, ["true"])
    del gpu["spec"]["nodeSelector"]
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    core.create_namespaced_pod(k8s_namespace, gpu)
    plain = _pod("no-toleration", base_image, ["true"])
    del plain["spec"]["tolerations"]
    core.create_namespaced_pod(k8s_namespace, plain)
    deadline = time.monotonic() + 60
    while not core.read_namespaced_pod("gpu", k8s_namespace).spec.node_name:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert core.read_namespaced_pod("gpu", k8s_namespace).spec.node_name.startswith("kwok-gpu-")
    while True:
        pod = core.read_namespaced_pod("no-toleration", k8s_namespace)
        cond = {c.type: c for c in pod.status.conditions or []}.get("PodScheduled")
        if cond and cond.status == "False":
            break
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert pod.spec.node_name is None and "untolerated taint" in cond.message


def _host_state(node: realnode.RealNode) -> dict:
    procs = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    return {"bridge": Path(f"/sys/class/net/{node.bridge}").exists(),
            "mounts": node.mounts(),
            "processes": [p for p in procs.splitlines()
                          if str(node.state_dir) in p or str(node.run_dir) in p],
            "run_dir": node.run_dir.exists() or node.kubelet_dir.exists(),
            "cgroups": [str(d) for d in node._cgroup_dirs()]}


def _size(folder: Path) -> int:
    return sum(f.lstat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def test_a_second_cluster_runs_beside_and_cluster_down_leaves_nothing_behind_nor_its_images(
        k8s_cluster, tmp_path, base_image):
    from kubernetes import client

    first = realnode.RealNode(k8s_cluster.state_dir)
    second = LocalCluster(tmp_path / "second", nodes=1, gpus_per_node=0, die_with_parent=True,
                          addons=[realnode.RealNodes(images=[base_archive().archive])])
    second.start(timeout=240)
    node = realnode.RealNode(second.state_dir)
    try:
        assert node.bridge != first.bridge
        assert node.addresses()["pod_cidr"] != first.addresses()["pod_cidr"]
        core = client.CoreV1Api(second.api_client())
        core.create_namespaced_pod("default", _pod("sleeper", base_image, ["sleep", "600"]))
        _wait_phase(core, "default", "sleeper", {"Running"})
        running = _host_state(node)
        assert running["bridge"] and running["mounts"] and running["processes"]
        assert running["cgroups"] and running["run_dir"]
        # the node's pods weigh what the machine's cores weigh against the host's processes
        shares = Path("/sys/fs/cgroup/cpu", node.cgroup_root.lstrip("/"), "cpu.shares")
        assert int(shares.read_text()) == realnode.NODE_CPU_SHARES == (os.cpu_count() or 1) * 1024
        # the base image, loaded and unpacked for the pod, is most of the folder
        assert _size(node.dir / "containerd" / "root") > 100e6
    finally:
        down = subprocess.run([sys.executable, "-m", "chexflow.cli", "cluster", "down", "--dir",
                               str(second.state_dir)], capture_output=True, text=True,
                              timeout=300)
    assert down.returncode == 0, down.stderr
    assert "its nodes' images removed" in down.stderr, down.stderr
    _wait_clean(node, timeout=5)
    assert _size(second.state_dir) < 100e6
    assert not (node.dir / "containerd" / "root").exists()


def _wait_clean(node: realnode.RealNode, timeout: float) -> None:
    clean = {"bridge": False, "mounts": [], "processes": [], "run_dir": False, "cgroups": []}
    deadline = time.monotonic() + timeout
    while (state := _host_state(node)) != clean:
        assert time.monotonic() < deadline, state
        time.sleep(0.5)


KILLED_STARTER = """
import sys, time
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.realnode import RealNodes
cluster = LocalCluster(sys.argv[1], nodes=1, gpus_per_node=0, die_with_parent=True,
                       addons=[RealNodes(images=[sys.argv[2]])])
cluster.start(timeout=240)
print("up", flush=True)
time.sleep(3600)
"""


def test_a_killed_starter_leaves_no_process_mount_cgroup_or_bridge(tmp_path, base_image):
    """SIGKILL to the process that started the cluster: its watcher stops everything."""
    from kubernetes import client, config

    state = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_STARTER, str(state),
                             str(base_archive().archive)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        core = client.CoreV1Api(config.new_client_from_config(str(state / "kubeconfig")))
        core.create_namespaced_pod("default", _pod("sleeper", base_image, ["sleep", "600"]))
        _wait_phase(core, "default", "sleeper", {"Running"})
    finally:
        proc.kill()
        proc.wait()
    _wait_clean(realnode.RealNode(state), timeout=60)
