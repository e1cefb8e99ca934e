"""supervise.py on real processes (no Kubernetes): a recorded component that exits is started
again with its exe, arguments and environment, counted and logged; nothing is restarted once a
stop has begun; the stop finds the restarted process through cluster.json."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from chexflow.devcluster import supervise
from chexflow.devcluster.controlplane import LocalCluster, _alive

SLEEP = "/bin/sleep"


def _cluster(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(tmp_path / "c", nodes=1, die_with_parent=True)
    cluster.ports = {"apiserver": 1}  # save() records the server address
    cluster.log_dir.mkdir(parents=True)
    cluster._spawn("kube-scheduler", ["300"], exe=SLEEP, env={"CHEXFLOW_PROBE": "1"})
    cluster._spawn("etcd", ["301"], exe=SLEEP)
    return cluster


def _kill(cluster: LocalCluster, name: str) -> int:
    pid = cluster.processes[name]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid, cluster.processes[name]["exe"]) and time.monotonic() < deadline:
        cluster._reap(pid)
        time.sleep(0.05)
    return pid


def test_exited_components_restart_in_start_order_with_their_args_env_and_a_count(tmp_path):
    cluster = _cluster(tmp_path)
    try:
        old = {n: _kill(cluster, n) for n in ("kube-scheduler", "etcd")}
        attached = LocalCluster.attach(cluster.state_dir)  # as the supervisor process sees it
        assert supervise.dead(attached) == ["etcd", "kube-scheduler"]
        assert supervise.restart_dead(attached) == ["etcd", "kube-scheduler"]
        cluster.check()  # reads the new process ids from cluster.json: nothing is down
        for name, args in (("etcd", ["301"]), ("kube-scheduler", ["300"])):
            proc = cluster.processes[name]
            assert proc["pid"] != old[name] and _alive(proc["pid"], proc["exe"])
            assert proc["args"] == args and proc["restarts"] == 1
            log = (cluster.log_dir / f"{name}.log").read_text()
            assert f"{name} (pid {old[name]}) exited; restart 1 ---" in log
        env = (Path("/proc") / str(cluster.processes["kube-scheduler"]["pid"]) / "environ")
        assert b"CHEXFLOW_PROBE=1" in env.read_bytes().split(b"\0")
        assert supervise.restart_dead(LocalCluster.attach(cluster.state_dir)) == []
    finally:
        cluster.stop(grace=2)
    assert not cluster.running()


def test_nothing_is_restarted_once_a_stop_has_marked_the_folder(tmp_path):
    cluster = _cluster(tmp_path)
    try:
        _kill(cluster, "etcd")
        (cluster.state_dir / supervise.STOPPING_FILE).touch()
        assert supervise.restart_dead(LocalCluster.attach(cluster.state_dir)) == []
    finally:
        cluster.stop(grace=2)
    assert not (cluster.state_dir / supervise.STOPPING_FILE).exists()
    assert not (cluster.state_dir / "cluster.json").exists()


def test_cluster_status_names_the_component_down_its_restarts_and_how_to_recover(
        tmp_path, capsys):
    import argparse

    from chexflow.devcluster.commands import cmd_status

    cluster = _cluster(tmp_path)
    args = argparse.Namespace(dir=cluster.state_dir)
    try:
        assert cmd_status(args) == 0
        out = capsys.readouterr().out
        assert "supervised by nobody" in out
        pid = cluster.processes["etcd"]["pid"]
        assert any(ln.split()[:4] == ["etcd", "running", "(pid", f"{pid})"] for ln in
                   out.splitlines()), out
        _kill(cluster, "kube-scheduler")
        assert cmd_status(args) == 1
        out = capsys.readouterr().out
        assert any(ln.split()[:2] == ["kube-scheduler", "DOWN"] for ln in out.splitlines()), out
        assert (f"down: kube-scheduler; `chexflow cluster down --dir {cluster.state_dir}` then "
                f"`chexflow cluster up --dir {cluster.state_dir}`") in out
    finally:
        cluster.stop(grace=2)
    (cluster.state_dir / "etcd").mkdir()  # a stopped cluster's kept objects
    assert cmd_status(args) == 1
    assert "`chexflow cluster up --dir" in capsys.readouterr().out
