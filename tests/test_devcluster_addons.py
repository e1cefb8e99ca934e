"""The local cluster's add-on table (no Kubernetes): each add-on after those it requires, what
is asked resolved with its requirements, the settings cluster.json records rebuilding the same
add-ons, and `cluster status` naming an add-on's processes that never started."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from chexflow.devcluster import addons
from chexflow.devcluster.controlplane import COMPONENTS, LocalCluster
from chexflow.devcluster.realnode import RealNodes
from chexflow.devcluster.supervisor import DevClusterError
from chexflow.devcluster.trainer import Trainer


def test_each_addon_comes_after_those_it_requires():
    order = list(addons.TABLE)
    for name, cls in addons.TABLE.items():
        assert cls.name == name
        for needed in cls.requires:
            assert order.index(needed) < order.index(name), (name, needed)


def test_asking_for_katib_brings_the_real_node_and_kube_proxy_in_table_order():
    assert [a.name for a in addons.named(["katib", "trainer"])] == [
        "real-node", "kube-proxy", "trainer", "katib"]
    two = addons.resolve([RealNodes(count=2), addons.TABLE["katib"]()])
    assert [a.name for a in two] == ["real-node", "kube-proxy", "katib"]
    assert two[0].count == 2  # what was asked is kept, not replaced by the default


def test_unknown_or_repeated_addons_are_refused_in_one_line():
    with pytest.raises(DevClusterError, match="unknown add-on.*registri.*expected one of"):
        addons.named(["registri"])
    with pytest.raises(DevClusterError, match="add-on trainer asked twice"):
        addons.resolve([Trainer(), Trainer()])
    with pytest.raises(DevClusterError, match="cluster.json records add-on 'gone'"):
        addons.from_records([{"name": "gone"}])


def test_recorded_settings_rebuild_the_same_addons(tmp_path):
    asked = addons.resolve([RealNodes(count=3, images=[tmp_path / "base.tar"]), Trainer()])
    records = addons.records(asked)
    assert records[0] == {"name": "real-node", "count": 3, "images": [str(tmp_path / "base.tar")]}
    again = addons.from_records(records)
    assert again == asked


def test_status_names_an_addons_processes_that_never_started(tmp_path, capsys):
    from chexflow.devcluster.commands import cmd_status

    cluster = LocalCluster(tmp_path / "c", nodes=1, die_with_parent=True,
                           addons=[RealNodes(count=2)])
    cluster.ports = {"apiserver": 1}  # save() records the server address
    cluster.log_dir.mkdir(parents=True)
    starter = subprocess.Popen(["/bin/sleep", "600"])  # the `cluster up` still starting it
    cluster.starter = starter.pid
    try:
        cluster.spawn("etcd", ["300"], exe="/bin/sleep")
        assert cmd_status(argparse.Namespace(dir=cluster.state_dir)) == 1
        out = capsys.readouterr().out.splitlines()
        never = [*COMPONENTS[1:], "containerd", "kubelet", "coredns", "containerd-2",
                 "kubelet-2"]
        assert out[-1].endswith(f"not started yet: {', '.join(never)}"), out
    finally:
        starter.kill()
        starter.wait()
        cluster.stop(grace=2)
    assert not Path(cluster.state_dir / "cluster.json").exists()


def test_cluster_up_and_build_have_a_flag_per_addon():
    from tests.conftest import run_chexflow

    for command in ("up", "build"):
        out = run_chexflow("cluster", command, "--help").stdout
        for name in addons.TABLE:
            assert f"--{name}" in out, (command, name)
