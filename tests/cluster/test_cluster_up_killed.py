"""A `chexflow cluster up` SIGKILLed while it starts the components leaves nothing running: the
watcher it starts first stops what was started (and `cluster status` does not call the remains
healthy); with the watcher killed too, `cluster status` names what never started and exits 1,
and the next `cluster up` stops the remains itself and starts the cluster asked for.

The kill points are components appearing in the state folder's cluster.json (each is recorded
as it is started), with Kueue and the Coscheduling scheduler asked for, as in the report that
found a killed start looking healthy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexflow.devcluster.supervisor import COMPONENT_MARK, process_alive
from chexflow.envs import REPO_ROOT
from chexflow.processes import marked

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
ASKED = ["--nodes", "1", "--gpus-per-node", "8", "--kueue", "--coscheduling", "--timeout", "300"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CHEXFLOW, "cluster", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)


def _recorded(state: Path) -> dict:
    try:
        return json.loads((state / "cluster.json").read_text())
    except (OSError, ValueError):
        return {}


def _up_until(state: Path, component: str) -> tuple[subprocess.Popen, dict[str, int]]:
    """`cluster up` in a session of its own, as `setsid chexflow cluster up &` is; returns once
    cluster.json records `component`, with every component process recorded so far."""
    up = subprocess.Popen([*CHEXFLOW, "cluster", "up", "--dir", str(state), *ASKED],
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 600
    while component not in seen:
        assert up.poll() is None, f"cluster up ended before {component}: {up.stdout.read()}"
        assert time.monotonic() < deadline, f"{component} not started in 600 s: {seen}"
        seen.update({n: p["pid"] for n, p in _recorded(state).get("processes", {}).items()})
        time.sleep(0.05)
    return up, seen


def _kill(up: subprocess.Popen) -> None:
    up.send_signal(signal.SIGKILL)
    up.wait()
    up.stdout.close()


def _left(state: Path, seen: dict[str, int]) -> list[str]:
    """The components still running: those seen recorded, and any process carrying the
    cluster's mark (started, not yet recorded)."""
    return sorted({n for n, pid in seen.items() if process_alive(pid)}
                  | {f"pid {pid}" for pid in marked(COMPONENT_MARK, str(state))})


def _tail(path: Path) -> str:
    return path.read_text()[-2000:] if path.exists() else "(none)"


def _wait_nothing_left(state: Path, seen: dict[str, int], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while (left := _left(state, seen)) or (state / "cluster.json").exists():
        assert time.monotonic() < deadline, (
            f"{timeout:.0f} s after `cluster up` was killed: {left} still running, cluster.json "
            f"{'there' if (state / 'cluster.json').exists() else 'gone'}; watcher's log: "
            f"{_tail(state / 'logs' / 'supervisor.log')}")
        time.sleep(0.5)


@pytest.mark.parametrize("point", ["etcd", "coscheduling-scheduler", "kueue"])
def test_a_cluster_up_killed_while_it_starts_leaves_nothing_running(tmp_path, point):
    state = tmp_path / "c"
    up, seen = _up_until(state, point)
    try:
        _kill(up)
        _wait_nothing_left(state, seen)
        status = _cli("status", "--dir", str(state))
        assert status.returncode != 0, status.stdout
        again = _cli("up", "--dir", str(state), *ASKED)
        assert again.returncode == 0, again.stderr
        status = _cli("status", "--dir", str(state))
        assert status.returncode == 0, status.stdout
        assert all(f"  {name} " in status.stdout for name in (
            "kueue", "coscheduling-scheduler", "podgroup-controller", "mpi-operator")), \
            status.stdout
    finally:
        _cli("down", "--dir", str(state))
    assert _left(state, seen) == []


def test_with_its_watcher_killed_too_status_names_what_never_started_and_up_cleans_up(
        tmp_path):
    state = tmp_path / "c"
    up, seen = _up_until(state, "kube-apiserver")  # it then waits for the apiserver's /readyz
    try:
        os.kill(json.loads((state / "supervisor.json").read_text())["pid"], signal.SIGKILL)
        _kill(up)
        recorded = _recorded(state)["processes"]
        status = _cli("status", "--dir", str(state))
        assert status.returncode == 1, status.stdout
        lines = status.stdout.splitlines()
        never = [n for n in ("kube-controller-manager", "kube-scheduler", "kwok", "mpi-operator",
                             "coscheduling-scheduler", "podgroup-controller", "kueue")
                 if n not in recorded]
        assert "kueue" in never and "mpi-operator" in never, recorded
        for name in never:
            assert any(ln.split()[:3] == [name, "NOT", "STARTED"] for ln in lines), status.stdout
        assert any(ln.split()[:2] == ["kube-apiserver", "running"] for ln in lines)
        assert lines[-1].startswith(
            f"its start did not finish: the `chexflow cluster up` that started it (pid "
            f"{up.pid}) is gone; never started: {', '.join(never)}; "), lines[-1]
        assert f"`chexflow cluster up --dir {state}` stops what is left" in lines[-1]
        again = _cli("up", "--dir", str(state), *ASKED)
        assert again.returncode == 0, again.stderr
        assert (f"stopping what an unfinished `chexflow cluster up` (pid {up.pid}) left in "
                f"{state}") in again.stderr
        assert not any(process_alive(pid) for pid in seen.values())
        assert _cli("status", "--dir", str(state)).returncode == 0
    finally:
        _cli("down", "--dir", str(state))
