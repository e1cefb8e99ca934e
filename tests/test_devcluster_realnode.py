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
