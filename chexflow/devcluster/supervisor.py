"""The processes of one state folder: spawned with a log and a record each, reaped, started again
when they exit, stopped in reverse start order. The local cluster runs every component through
one Supervisor (controlplane.LocalCluster.supervisor); nothing here knows Kubernetes.

    supervisor = Supervisor(state_dir, record=lambda: {"ready": True})
    supervisor.spawn("etcd", "/path/to/etcd", ["--data-dir=..."])
    supervisor.restart_dead()          # etcd exited: started again as recorded, counted, logged
    supervisor.stop(grace=10)          # SIGTERM, then SIGKILL, the last started first

Records. `STATE_FILE` (cluster.json) holds the owner's `record()` beside `processes` (name ->
pid, exe, args, env, log, restarts; in start order) and this start's `run_id`, rewritten whole
on every change so that readers never see half of it. A component is started again with the
exe, arguments and environment recorded there, its log (`logs/<name>.log`) goes on after a line
saying so, and the record counts its restarts. State survives a restart because it lives on
disk, not in the process: etcd's data folder, containerd's root, the kubelet's folder.

Every process carries `COMPONENT_MARK=<state folder>` in its environment, so a stop also finds a
process started a moment before it was recorded (chexflow.processes.stop_marked); with
`die_with_parent` each gets SIGTERM when the process that spawned it dies.

The lock. A restart pass and a stop each hold the state folder's lock (`LOCK_FILE`), and a stop
marks the folder (`STOPPING_FILE`) first: nothing is restarted while a cluster goes down, two
stops do not overlap, and a stop leaves a later start's processes alone (another `run_id`).

The watcher. `start_watcher` starts `python -m chexflow.devcluster.watcher STATE_DIR PARENT`
(detached; its log logs/supervisor.log, or logs/watcher.log when it only watches): it stops the
cluster if PARENT dies before the cluster is ready (or at all, without `until_ready`), and with
`supervise` it restarts exited components once the cluster is ready, recording itself in
`WATCHER_FILE`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.processes import die_with_parent, stop_marked

STATE_FILE = "cluster.json"
LOCK_FILE = "supervise.lock"
STOPPING_FILE = "stopping"
WATCHER_FILE = "supervisor.json"
# in every process's environment (value: the state folder), so that a stop also finds a
# process started a moment before its start was recorded
COMPONENT_MARK = "CHEXFLOW_DEVCLUSTER"


class DevClusterError(ChexflowError):
    """The local cluster failed to start, or is not running."""


def process_alive(pid: int) -> bool:
    """True when process `pid` exists and is not a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def runs(pid: int, exe: str) -> bool:
    """True when `pid` runs the binary `exe` (guards against a reused process id)."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)") == exe
    except OSError:
        return False


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """The state folder's supervision lock (one restart pass, or a stop, at a time)."""
    with open(Path(state_dir) / LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_state(state_dir: Path) -> dict | None:
    """STATE_FILE as it is now, or None when there is none (stopped, or never started)."""
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def watcher(state_dir: Path) -> dict | None:
    """The supervising watcher recorded for this state folder ({"pid": ...}), if alive."""
    try:
        info = json.loads((Path(state_dir) / WATCHER_FILE).read_text())
        alive = process_alive(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if alive else None


def start_watcher(state_dir: Path, parent: int = 0, supervise: bool = False,
                  until_ready: bool = False) -> int:
    """A detached watcher (chexflow.devcluster.watcher) of the cluster in `state_dir`: it stops
    the cluster if process `parent` (0: none) dies without stopping it, with `until_ready` only
    if it dies before the cluster is ready; with `supervise` it also restarts the components
    that exit once the cluster is ready. Returns its process id."""
    state_dir = Path(state_dir)
    log = state_dir / "logs" / f"{'supervisor' if supervise else 'watcher'}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "chexflow.devcluster.watcher",
                                 str(state_dir), str(parent),
                                 *(["--supervise"] if supervise else []),
                                 *(["--until-ready"] if until_ready else [])], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True).pid


@dataclass
class Supervisor:
    """The processes of `state_dir` (see the module's docstring); `record()` is what the owner
    saves beside them in STATE_FILE, `env` what every process gets beside os.environ."""

    state_dir: Path
    record: Callable[[], dict] = dict
    env: dict[str, str] = field(default_factory=dict)
    die_with_parent: bool = False
    run_id: str = ""
    processes: dict[str, dict] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    # ---- records -------------------------------------------------------------------------------
    def save(self) -> None:
        """Write STATE_FILE: the owner's record, the processes and the start's id."""
        state = {**self.record(), "processes": self.processes, "run_id": self.run_id}
        tmp = self.state_dir / f".{STATE_FILE}.{os.getpid()}"  # readers never see half of it
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / STATE_FILE)

    def refresh(self) -> None:
        """The processes as STATE_FILE records them now: a watcher may have restarted some (new
        process ids, restart counts) since this object last saw them."""
        state = read_state(self.state_dir)
        if state is not None and "processes" in state:
            self.processes = state["processes"]

    def recorded(self) -> bool:
        """True while STATE_FILE records this start (not stopped since, nor started again); the
        processes are read from it."""
        state = read_state(self.state_dir)
        if state is None or state.get("run_id", "") != self.run_id:
            return False
        self.processes = state["processes"]
        return True

    # ---- processes -----------------------------------------------------------------------------
    def spawn(self, name: str, exe: Path | str, args: list[str],
              env: dict[str, str] | None = None) -> int:
        """Start process `name` (`exe` with `args`; `env` beside the others), its output in
        logs/<name>.log, and record it; returns its process id."""
        exe = str(exe)
        log = self.log_dir / f"{name}.log"
        self.refresh()
        with open(log, "ab") as out:
            proc = subprocess.Popen([exe, *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **self.env,
                                         COMPONENT_MARK: str(self.state_dir), **(env or {})},
                                    preexec_fn=die_with_parent() if self.die_with_parent else None)
        self.processes[name] = {"pid": proc.pid, "exe": os.path.realpath(exe), "log": str(log),
                                "args": args, **({"env": env} if env else {})}
        self.save()
        return proc.pid

    def reap(self, pid: int) -> None:
        """Collect the exit status of a child that has exited (no zombie left), if it is one."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    def alive(self, name: str) -> bool:
        """True when the recorded process `name` still runs."""
        proc = self.processes[name]
        return runs(proc["pid"], proc["exe"])

    def dead(self) -> list[str]:
        """The recorded processes that have exited, in start order."""
        return [name for name in self.processes if not self.alive(name)]

    def any_alive(self) -> bool:
        self.refresh()
        return any(self.alive(name) for name in self.processes)

    def restart(self, name: str, reason: str = "exited") -> None:
        """Start process `name` again as recorded (same exe, args, env); count it; log it."""
        old = self.processes[name]
        self.reap(old["pid"])
        count = old.get("restarts", 0) + 1
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(self.log_dir / f"{name}.log", "a") as log:
            log.write(f"\n--- chexflow {stamp}: {name} (pid {old['pid']}) {reason}; "
                      f"restart {count} ---\n")
        self.spawn(name, old["exe"], old["args"], env=old.get("env"))
        self.processes[name]["restarts"] = count
        self.save()

    def renew(self, name: str, reason: str, grace: float = 10) -> None:
        """Stop the running process `name` (SIGTERM, then SIGKILL after `grace` s) and start it
        again as recorded, under the lock: a watcher restarts nothing meanwhile."""
        with locked(self.state_dir):
            self.refresh()
            self._stop_process(self.processes[name], grace)
            self.restart(name, reason)

    def restart_dead(self) -> list[str]:
        """One supervision pass: restart every exited process in start order (etcd before the
        apiserver), unless a stop has begun. Returns the names restarted."""
        with locked(self.state_dir):
            if (self.state_dir / STOPPING_FILE).exists() or not self.recorded():
                return []  # a stop has begun, or ended while this pass waited for the lock
            names = self.dead()
            for name in names:
                self.restart(name)
            return names

    def stop(self, grace: float = 10, cleanup: Callable[[], None] = lambda: None) -> bool:
        """Under the lock, unless STATE_FILE records a later start: mark the folder, stop the
        recorded processes in reverse start order (SIGTERM, then SIGKILL after `grace` s), run
        `cleanup` (what goes beyond the processes), stop any process still carrying the mark,
        remove the record and the mark. False when a later start owns the folder."""
        present = self.state_dir.is_dir()  # else removed under it: its processes still go
        with locked(self.state_dir) if present else contextlib.nullcontext():
            recorded = read_state(self.state_dir)
            if recorded is not None and recorded.get("run_id", "") != self.run_id:
                return False
            if present:
                (self.state_dir / STOPPING_FILE).touch()
            if recorded is not None:
                self.processes = recorded["processes"]
            for name in reversed(list(self.processes)):
                self._stop_process(self.processes[name], grace)
            cleanup()
            stop_marked(COMPONENT_MARK, str(self.state_dir), grace)  # started, not yet recorded
            self.processes = {}
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
            (self.state_dir / STOPPING_FILE).unlink(missing_ok=True)
        return True

    def _stop_process(self, proc: dict, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` s, one recorded process."""
        with contextlib.suppress(ProcessLookupError):
            if not runs(proc["pid"], proc["exe"]):
                return
            os.kill(proc["pid"], signal.SIGTERM)
            end = time.monotonic() + grace
            while runs(proc["pid"], proc["exe"]):
                if time.monotonic() > end:
                    os.kill(proc["pid"], signal.SIGKILL)
                    time.sleep(0.1)
                    break
                self.reap(proc["pid"])
                time.sleep(0.05)
        self.reap(proc["pid"])
