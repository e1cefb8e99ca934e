"""The cluster's Supervisor and watcher on real processes (no Kubernetes): a recorded component
that exits is started again with its exe, arguments and environment, counted and logged;
nothing is restarted once a stop has begun; the stop finds the restarted process through
cluster.json."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from chexflow.devcluster.controlplane import LocalCluster
from chexflow.devcluster.supervisor import (
    COMPONENT_MARK,
    STOPPING_FILE,
    process_alive,
    runs,
    start_watcher,
)

SLEEP = "/bin/sleep"


def _cluster(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(tmp_path / "c", nodes=1, die_with_parent=True)
    cluster.ports = {"apiserver": 1}  # save() records the server address
    cluster.log_dir.mkdir(parents=True, exist_ok=True)
    cluster.spawn("etcd", ["301"], exe=SLEEP)
    cluster.spawn("kube-scheduler", ["300"], exe=SLEEP, env={"CHEXFLOW_PROBE": "1"})
    return cluster


def _kill(cluster: LocalCluster, name: str) -> int:
    pid = cluster.processes[name]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while runs(pid, cluster.processes[name]["exe"]) and time.monotonic() < deadline:
        cluster.supervisor.reap(pid)
        time.sleep(0.05)
    return pid


def test_exited_components_restart_in_start_order_with_their_args_env_and_a_count(tmp_path):
    cluster = _cluster(tmp_path)
    try:
        old = {n: _kill(cluster, n) for n in ("kube-scheduler", "etcd")}
        attached = LocalCluster.attach(cluster.state_dir)  # as the supervisor process sees it
        assert attached.supervisor.dead() == ["etcd", "kube-scheduler"]
        assert attached.supervisor.restart_dead() == ["etcd", "kube-scheduler"]
        cluster.check()  # reads the new process ids from cluster.json: nothing is down
        for name, args in (("etcd", ["301"]), ("kube-scheduler", ["300"])):
            proc = cluster.processes[name]
            assert proc["pid"] != old[name] and runs(proc["pid"], proc["exe"])
            assert proc["args"] == args and proc["restarts"] == 1
            log = (cluster.log_dir / f"{name}.log").read_text()
            assert f"{name} (pid {old[name]}) exited; restart 1 ---" in log
        env = (Path("/proc") / str(cluster.processes["kube-scheduler"]["pid"]) / "environ")
        assert b"CHEXFLOW_PROBE=1" in env.read_bytes().split(b"\0")
        assert LocalCluster.attach(cluster.state_dir).supervisor.restart_dead() == []
    finally:
        cluster.stop(grace=2)
    assert not cluster.running()


def test_a_running_component_renewed_is_stopped_and_started_again_as_recorded(tmp_path):
    """LocalCluster.renew (an add-on's process that must see what came after it started, as
    Kueue's manager a TrainJob CRD): the old process is gone, the new one has the recorded
    arguments and environment, a restart counted and logged with the reason."""
    cluster = _cluster(tmp_path)
    try:
        old = cluster.processes["kube-scheduler"]["pid"]
        cluster.renew("kube-scheduler", "restarted: probe")
        proc = cluster.processes["kube-scheduler"]
        assert proc["pid"] != old and runs(proc["pid"], proc["exe"])
        assert not runs(old, proc["exe"])
        assert proc["args"] == ["300"] and proc["restarts"] == 1
        env = (Path("/proc") / str(proc["pid"]) / "environ").read_bytes().split(b"\0")
        assert b"CHEXFLOW_PROBE=1" in env
        log = (cluster.log_dir / "kube-scheduler.log").read_text()
        assert f"kube-scheduler (pid {old}) restarted: probe; restart 1 ---" in log
        cluster.check()  # cluster.json records the new process: nothing is down
        assert LocalCluster.attach(cluster.state_dir).supervisor.restart_dead() == []
    finally:
        cluster.stop(grace=2)
    assert not cluster.running()


def test_nothing_is_restarted_once_a_stop_has_marked_the_folder(tmp_path):
    cluster = _cluster(tmp_path)
    try:
        _kill(cluster, "etcd")
        (cluster.state_dir / STOPPING_FILE).touch()
        assert LocalCluster.attach(cluster.state_dir).supervisor.restart_dead() == []
    finally:
        cluster.stop(grace=2)
    assert not (cluster.state_dir / STOPPING_FILE).exists()
    assert not (cluster.state_dir / "cluster.json").exists()


def _ready_cluster(tmp_path: Path) -> LocalCluster:
    """Every component a one-node kwok cluster runs, as sleeping processes, and ready."""
    cluster = _cluster(tmp_path)
    for i, name in enumerate(cluster.components()):
        if name not in cluster.processes:
            cluster.spawn(name, [str(310 + i)], exe=SLEEP)
    cluster.ready = True
    cluster.save()
    return cluster


def test_cluster_status_names_the_component_down_its_restarts_and_how_to_recover(
        tmp_path, capsys):
    import argparse

    from chexflow.devcluster.commands import cmd_status

    cluster = _ready_cluster(tmp_path)
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


def _starter() -> subprocess.Popen:
    """A stand-in for the `chexflow cluster up` that starts a cluster."""
    return subprocess.Popen([SLEEP, "600"])


def _wait(what: str, check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.1)


def test_a_start_whose_starter_is_killed_before_ready_is_stopped_by_its_watcher(tmp_path):
    """What `LocalCluster.start` does first: record the cluster, start a watcher of its own
    process; a SIGKILL of that process before the cluster is ready stops every component,
    also one started but not recorded yet (found by the mark in its environment)."""
    cluster = _cluster(tmp_path)
    starter = _starter()
    cluster.starter = starter.pid
    cluster.save()
    unrecorded = subprocess.Popen([SLEEP, "302"], env={
        **os.environ, COMPONENT_MARK: str(cluster.state_dir)})
    start_watcher(cluster.state_dir, parent=starter.pid, supervise=True, until_ready=True)
    pids = [p["pid"] for p in cluster.processes.values()] + [unrecorded.pid]
    try:
        starter.kill()
        starter.wait()
        _wait("the components stopped", lambda: not any(process_alive(pid) for pid in pids))
        _wait("cluster.json removed", lambda: not (cluster.state_dir / "cluster.json").exists())
    finally:
        cluster.stop(grace=2)
        unrecorded.kill()
        unrecorded.wait()


def test_once_ready_a_detached_cluster_outlives_its_starter_and_stays_supervised(tmp_path):
    cluster = _ready_cluster(tmp_path)
    starter = _starter()
    cluster.starter = starter.pid
    cluster.save()
    start_watcher(cluster.state_dir, parent=starter.pid, supervise=True, until_ready=True)
    try:
        starter.kill()
        starter.wait()
        # a watcher pass after the starter died restarts etcd rather than stopping the cluster
        old = _kill(cluster, "etcd")
        _wait("etcd restarted", lambda: LocalCluster.attach(cluster.state_dir)
              .processes["etcd"]["pid"] != old)
        assert cluster.running() and not cluster.supervisor.dead()
    finally:
        cluster.stop(grace=2)


def test_a_stop_leaves_a_later_start_in_the_same_folder_alone(tmp_path):
    """A watcher's stop that comes after a `cluster up` cleaned the folder and started again
    (a new start id in cluster.json) stops nothing."""
    cluster = _cluster(tmp_path)
    stale = LocalCluster.attach(cluster.state_dir)
    cluster.stop(grace=2)
    again = _cluster(tmp_path)
    again.supervisor.run_id = "later"
    again.save()
    try:
        stale.stop(grace=2)
        assert again.running() and not again.supervisor.dead()
    finally:
        again.stop(grace=2)
    assert not again.running()


def test_status_of_a_start_that_did_not_finish_names_what_never_started(tmp_path, capsys):
    import argparse

    from chexflow.devcluster.commands import cmd_status

    cluster = _cluster(tmp_path)  # etcd and the scheduler only, not ready
    starter = _starter()
    cluster.starter = starter.pid
    cluster.save()
    args = argparse.Namespace(dir=cluster.state_dir)
    try:
        assert cmd_status(args) == 1
        out = capsys.readouterr().out.splitlines()
        assert out[-1].startswith(f"starting: `chexflow cluster up` (pid {starter.pid}) has "
                                  "not finished; not started yet: kube-apiserver, "), out
        starter.kill()
        starter.wait()
        assert cmd_status(args) == 1
        out = capsys.readouterr().out.splitlines()
        for name in ("kube-apiserver", "kube-controller-manager", "kwok", "mpi-operator"):
            assert any(ln.split()[:3] == [name, "NOT", "STARTED"] for ln in out), out
        assert out[-1] == (
            f"its start did not finish: the `chexflow cluster up` that started it (pid "
            f"{starter.pid}) is gone; never started: kube-apiserver, kube-controller-manager, "
            f"kwok, mpi-operator; `chexflow cluster up --dir {cluster.state_dir}` stops what is "
            f"left and starts it again (`chexflow cluster down --dir {cluster.state_dir}` only "
            f"stops it)")
    finally:
        cluster.stop(grace=2)
