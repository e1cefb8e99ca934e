"""The real node's names, addresses, requirements and pause image (no cluster needed)."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile

import pytest

from chexflow.devcluster import realnode


def test_names_differ_per_state_folder_and_fit_linux_limits(tmp_path):
    a, b = realnode.RealNode(tmp_path / "a"), realnode.RealNode(tmp_path / "b")
    assert len({a.bridge, b.bridge}) == len({a.cgroup_root, b.cgroup_root}) == 2
    assert a.run_dir != b.run_dir
    assert len(a.bridge) <= 15  # IFNAMSIZ - 1
    assert len(str(a.containerd_socket)) + len(".ttrpc") < 100  # sun_path


def test_the_kubelets_sockets_fit_sun_path_under_a_deep_state_folder(tmp_path):
    """The kubelet listens on unix sockets below its --root-dir and exits when one cannot bind
    (a path over 108 bytes): it happened under pytest-xdist's deeper tmp_path. The root is a
    short path of its own, named per node, and its sockets fit whatever the state folder."""
    deep = tmp_path / ("d" * 60) / "popen-gw0" / "test_a_second_cluster_runs_bes0" / "second"
    a, b = realnode.RealNode(deep), realnode.RealNode(tmp_path / "b")
    assert a.kubelet_dir != b.kubelet_dir
    args = a.kubelet_args(tmp_path / "config.yaml", tmp_path / "kubeconfig", "198.18.0.1")
    assert f"--root-dir={a.kubelet_dir}" in args
    for sock in ("pod-resources/kubelet.sock", "device-plugins/kubelet.sock",
                 "plugins_registry/csi.example.com-reg.sock"):
        assert len(str(a.kubelet_dir / sock)) <= 108, sock


def test_subnet_is_a_benchmarking_slash24_not_in_use(tmp_path, monkeypatch):
    node = realnode.RealNode(tmp_path)
    monkeypatch.setattr(realnode, "_used_subnets", lambda: set())
    first = node.pick_subnet()
    monkeypatch.setattr(realnode, "_used_subnets", lambda: {first})
    second = node.pick_subnet()
    assert second != first and first.prefixlen == second.prefixlen == 24
    for net in (first, second):
        assert net.subnet_of(ipaddress.ip_network("198.18.0.0/17"))
        assert not any(net.overlaps(ipaddress.ip_network(private)) for private in
                       ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def test_missing_runtime_names_the_debian_package(monkeypatch):
    monkeypatch.setattr(realnode, "CONTAINERD", "/nonexistent/containerd")
    with pytest.raises(realnode.RealNodeError, match="Debian packages containerd: run "
                                                     "images/install-system.sh"):
        realnode.check_requirements()


def test_namespace_annotations_select_and_tolerate_the_real_node():
    ann = realnode.namespace_annotations()
    assert ann["scheduler.alpha.kubernetes.io/node-selector"] == "chexflow.io/node=real"
    tolerations = json.loads(ann["scheduler.alpha.kubernetes.io/defaultTolerations"])
    assert tolerations == [{"key": "chexflow.io/real-node", "value": "true",
                            "effect": "NoSchedule", "operator": "Equal"}]


def test_pause_archive_is_an_oci_layout_with_digests_that_match(tmp_path):
    pause = tmp_path / "pause"
    pause.write_bytes(b"\x7fELF not really")
    pause.chmod(0o755)
    archive = realnode.pause_archive(pause, tmp_path / "pause.tar")
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == realnode.PAUSE_IMAGE
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert tar.getnames() == ["pause"] and tar.getmember("pause").mode & 0o111


def test_an_extra_real_node_has_names_of_its_own_and_the_extra_taint(tmp_path):
    first, second = realnode.RealNode(tmp_path), realnode.RealNode(tmp_path, 1)
    assert (second.name, second.dir.name, second.suffix) == ("chexflow-node-2", "node-2", "-2")
    assert len({first.bridge, second.bridge}) == len({first.cgroup_root, second.cgroup_root}) == 2
    assert first.taints == [realnode.NODE_TAINT]
    assert second.taints == [realnode.NODE_TAINT, realnode.EXTRA_NODE_TAINT]
    args = second.kubelet_args(tmp_path / "c.yaml", tmp_path / "kc", "198.18.5.1")
    assert "--hostname-override=chexflow-node-2" in args
    ann = realnode.namespace_annotations(extra_nodes=True)
    keys = [t["key"] for t in json.loads(ann["scheduler.alpha.kubernetes.io/defaultTolerations"])]
    assert keys == ["chexflow.io/real-node", "chexflow.io/extra-real-node"]


def test_routes_send_the_service_range_and_other_nodes_pod_subnets_through_the_node(tmp_path):
    node = realnode.RealNode(tmp_path, 1)
    node.dir.mkdir(parents=True)
    node.address_file.write_text(json.dumps({"node_ip": "198.18.7.1", "pod_cidr": "198.18.7.0/24",
                                             "routes": []}))
    node.set_routes(["198.19.0.0/16", "198.18.3.0/24", "198.18.7.0/24", "198.18.3.0/24"])
    conf = json.loads((node.dir / "cni" / "10-chexflow.conflist").read_text())
    ipam = conf["plugins"][0]["ipam"]
    assert ipam["routes"] == [{"dst": "198.19.0.0/16", "gw": "198.18.7.1"},
                              {"dst": "198.18.3.0/24", "gw": "198.18.7.1"}]
    assert conf["plugins"][0]["ipMasq"] is False
    assert [n.index for n in realnode.all_nodes(tmp_path)] == []  # no first node folder


def test_every_nodes_containerd_reads_the_registry_hosts_the_registry_add_on_writes(tmp_path):
    import tomllib

    from chexflow.devcluster.registry import hosts_toml

    state = tmp_path / "c"
    nodes = [realnode.RealNode(state, i) for i in (0, 1)]
    try:
        configs = [tomllib.loads(node.containerd_config().read_text()) for node in nodes]
    finally:  # the sockets' folder it makes under /run
        for node in nodes:
            node.run_dir.rmdir()
    for config in configs:
        registry = config["plugins"]["io.containerd.grpc.v1.cri"]["registry"]
        assert registry["config_path"] == str(state.resolve() / "certs.d")
    ca = tmp_path / "ca.crt"
    hosts = tomllib.loads(hosts_toml(state.resolve() / "certs.d", "198.18.0.1:5000", ca)
                          .read_text())
    assert hosts["server"] == "https://198.18.0.1:5000"
    assert hosts["host"]["https://198.18.0.1:5000"] == {"capabilities": ["pull", "resolve"],
                                                       "ca": str(ca)}


def test_the_kubelet_rechecks_pulled_images_but_not_those_loaded_by_hand(tmp_path):
    """KEP-2535: an image pulled with a Secret is checked again for a pod without it, by image
    ID; the side-loaded chexflow.local names of the same image cannot be pulled, so they are
    the allowlist's (a pod of the registry's name without the Secret is still refused)."""
    import yaml

    node = realnode.RealNode(tmp_path / "c")
    node.dir.mkdir(parents=True)
    config = yaml.safe_load(node.kubelet_config(
        {"kubelet": 1, "kubelet_healthz": 2}, "198.18.0.1", tmp_path / "ca.crt").read_text())
    assert config["imagePullCredentialsVerificationPolicy"] == "NeverVerifyAllowlistedImages"
    assert config["preloadedImagesVerificationAllowlist"] == ["chexflow.local/*"]
    assert realnode.PAUSE_IMAGE.startswith("chexflow.local/")
