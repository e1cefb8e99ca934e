"""One chexflow run per folder: a lock on FOLDER/.chexflow.lock, held for the run.

The lock is an flock(2) on the file, so the kernel releases it when the holding process exits,
however it ends (a killed run never leaves a folder locked). The file keeps the holders' PIDs
and commands, which a refused run names in its message.

A launcher and the workers it starts hold one lock together: the launcher takes it exclusively
and shares it (`share`) before starting them; a worker started so joins it shared
(`acquire(folder, ..., shared=joins(folder))`). The folder stays locked until the last of them
exits, so workers that outlive a killed launcher still keep a second run out.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.folders import writable_folder

LOCK_FILE = ".chexflow.lock"
# set by a lock holder for the processes it starts: the lock file they join (shared)
SHARED_ENV = "CHEXFLOW_SHARED_LOCK"


class FolderLocked(ChexflowError):
    """Another live process holds the folder's lock."""


def _alive(line: str) -> bool:
    pid = re.match(r"PID (\d+)", line)
    return pid is None or Path(f"/proc/{pid.group(1)}").exists()


def _refused(fd: int, folder: Path) -> FolderLocked:
    """The refusal naming the holders still alive (all recorded ones if none is seen here)."""
    lines = [s.strip() for s in os.pread(fd, 2000, 0).decode(errors="replace").splitlines()]
    lines = [s for s in lines if s]
    holders = ", ".join([s for s in lines if _alive(s)] or lines) or "another process"
    return FolderLocked(
        f"{folder}: in use by {holders}; wait for it to finish or choose another folder"
    )


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def acquire(folder: Path, command: str, shared: bool = False) -> int:
    """An open fd of FOLDER/.chexflow.lock locked by this process, exclusively (its PID replaces
    the file's content) or shared with the holder that started it (its PID is added); closing
    the fd or exiting releases it. FolderLocked, naming the holders, if it is taken."""
    path = folder / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            error = _refused(fd, folder)
            os.close(fd)
            raise error from None
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed the file as we opened it: lock the one there now
    line = f"PID {os.getpid()} (chexflow {command})\n".encode()
    if shared:
        os.pwrite(fd, line, os.fstat(fd).st_size)
    else:
        os.ftruncate(fd, 0)
        os.pwrite(fd, line, 0)
    return fd


def share(fd: int, folder: Path) -> dict[str, str]:
    """Make this process's exclusive lock one it shares with the processes it starts; returns
    the environment entries that make them join it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # another run took it in the instant the kernel converts the lock
        raise _refused(fd, folder) from None
    return {SHARED_ENV: str((folder / LOCK_FILE).resolve())}


def joins(folder: Path) -> bool:
    """Whether this process was started by the holder of FOLDER's lock to share it."""
    return os.environ.get(SHARED_ENV) == str((folder / LOCK_FILE).resolve())


@contextmanager
def locked_folder(folder: Path, command: str, shared: bool = False) -> Iterator[int]:
    """Create FOLDER if needed and hold its lock while the block runs (yields the lock's fd;
    `shared`: see acquire). The lock file goes at the end unless a process that shared the lock
    still holds it, and so does a folder created here and left empty."""
    folder = Path(folder)
    created = writable_folder(folder, "--out") is not None
    fd = acquire(folder, command, shared)
    try:
        yield fd
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: still shared
            (folder / LOCK_FILE).unlink()
            if created and not any(folder.iterdir()):
                folder.rmdir()
        except OSError:
            pass
        finally:
            os.close(fd)
