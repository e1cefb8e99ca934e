"""Child processes that do not outlive the process that started them.

`die_with_parent` covers a direct child. A child's own children (a shell's program, horovodrun's
workers) are found by a variable in their environment, which they all inherit: `start_reaper`
starts a small process that stops every process marked so when its starter dies (even by
SIGKILL), `stop_marked` stops them at once. A reaper started before its starter holds the lock
of what it guards stops them only if no other live process holds that lock, until `reaper_owns`.
`owned_by_this_process` marks every process started from this one, however deep (through
libraries that start their own, such as kfp.local), and reaps them when this one dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

PR_SET_PDEATHSIG = 1
OWNED = b"owned\n"  # what reaper_owns tells a reaper
OWNER_ENV_PREFIX = "CHEXFLOW_OWNER_"  # + a fresh id: the mark of owned_by_this_process


def die_with_parent(sig: int = signal.SIGTERM):
    """A Popen preexec_fn: the child gets `sig` when its parent dies, even by SIGKILL (Linux
    prctl PR_SET_PDEATHSIG)."""

    def preexec() -> None:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))

    return preexec


def marked(name: str, value: str) -> list[int]:
    """Processes (not this one) whose environment holds NAME=VALUE."""
    marker = f"{name}={value}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def stop_marked(name: str, value: str, grace: float = 5.0) -> int:
    """SIGTERM the processes marked NAME=VALUE, SIGKILL those left after `grace` seconds;
    returns how many there were."""
    pids = marked(name, value)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked(name, value):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and marked(name, value):
            time.sleep(0.1)
        if not marked(name, value):
            break
    return len(pids)


def wait_unmarked(name: str, value: str, seconds: float) -> bool:
    """Wait up to `seconds` for every process marked NAME=VALUE to end; whether they did."""
    deadline = time.monotonic() + seconds
    while marked(name, value):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def owned_by_this_process(grace: float = 10.0, settle: float = 30.0) -> Iterator[str]:
    """While inside, every process started from this one, however deep, carries a mark in its
    environment (a variable of this block's own, so blocks nest); if this process dies, even by
    SIGKILL, a reaper stops them (SIGTERM, SIGKILL after `grace` s). Leaving the block, even by
    an exception, waits up to `settle` s for them to end by themselves (a step finishing what
    it does on SIGTERM or Ctrl-C), then stops what is left. Yields the variable's name."""
    name = OWNER_ENV_PREFIX + uuid.uuid4().hex
    reaper = start_reaper(name, "1", grace)  # before the mark: the reaper does not carry it
    os.environ[name] = "1"
    try:
        yield name
    finally:
        os.environ.pop(name, None)
        try:
            wait_unmarked(name, "1", settle)
        finally:
            end_reaper(reaper, timeout=2 * grace + 30)


def start_reaper(name: str, value: str, grace: float = 5.0,
                 lock: Path | None = None) -> subprocess.Popen:
    """A process that waits for this one to end (its stdin pipe closes, however this one dies),
    then stops the processes marked NAME=VALUE. Close its stdin to end it. With `lock` (a file
    that the one running those processes holds flock'ed), it stops them only if it can take that
    lock (they are a dead run's leftovers), until `reaper_owns` says this one holds it."""
    return subprocess.Popen(
        [sys.executable, "-m", "chexflow.processes", name, value, str(grace),
         *([str(lock)] if lock is not None else [])],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
    )


def reaper_owns(reaper: subprocess.Popen) -> None:
    """Tell the reaper that this process now holds its lock: it stops the marked processes
    however this one ends."""
    reaper.stdin.write(OWNED)
    reaper.stdin.flush()


def end_reaper(reaper: subprocess.Popen, timeout: float = 30.0) -> None:
    """Close the reaper's pipe (it stops what is left marked) and wait for it."""
    with contextlib.suppress(OSError):
        reaper.stdin.close()
    try:
        reaper.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


def _reap(name: str, value: str, grace: float, lock: str | None) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # only the pipe ends it
        signal.signal(sig, signal.SIG_IGN)
    told = b""
    with contextlib.suppress(OSError):
        while chunk := sys.stdin.buffer.read(4096):
            told += chunk
    if lock is None or OWNED in told:
        stop_marked(name, value, grace)
        return
    try:
        fh = open(lock, "a")  # noqa: SIM115 (held while stopping: no new run starts meanwhile)
    except OSError:  # no lock file: nobody runs there
        stop_marked(name, value, grace)
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another live run holds it: its processes are not leftovers
            return
        stop_marked(name, value, grace)


if __name__ == "__main__":
    _reap(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
