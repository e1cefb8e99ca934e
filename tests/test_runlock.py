"""The run-folder lock: one holder, or a launcher and the workers it starts together; the
refusal names the live holders' PIDs; a killed holder never leaves the folder locked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexflow.errors import ChexflowError
from chexflow.runlock import LOCK_FILE, FolderLocked, acquire, locked_folder

# holds FOLDER's lock; with "share", shares it with a child that joins it (CODE: this program);
# each prints its PID and sleeps
HOLDER = """
import os, subprocess, sys, time
from pathlib import Path
from chexflow.errors import ChexflowError
from chexflow.runlock import acquire, joins, share
folder = Path(sys.argv[1])
fd = acquire(folder, "holder", shared=joins(folder))
if sys.argv[2:] == ["share"]:
    env = {**os.environ, **share(fd, folder)}
    child = subprocess.Popen([sys.executable, "-c", CODE, sys.argv[1]], env=env)
print(os.getpid(), flush=True)
time.sleep(600)
"""


def _start(folder: Path, *extra: str) -> subprocess.Popen:
    code = f"CODE = {HOLDER!r}\n{HOLDER}"
    return subprocess.Popen([sys.executable, "-c", code, str(folder), *extra],
                            stdout=subprocess.PIPE, text=True)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    holder = _start(tmp_path)
    try:
        pid = int(holder.stdout.readline())
        with pytest.raises(FolderLocked, match=rf"in use by PID {pid} \(chexflow holder\)"):
            acquire(tmp_path, "second")
    finally:
        holder.kill()
        holder.wait()
    os.close(acquire(tmp_path, "third"))  # the kernel released the killed holder's lock


def test_workers_keep_the_lock_after_their_launcher_is_killed(tmp_path):
    launcher = _start(tmp_path, "share")
    pids = []
    try:
        pids = sorted({int(launcher.stdout.readline()) for _ in range(2)})
        child = next(p for p in pids if p != launcher.pid)
        with pytest.raises(FolderLocked) as refused:
            acquire(tmp_path, "second")
        assert f"PID {launcher.pid} (chexflow holder)" in str(refused.value)
        assert f"PID {child} (chexflow holder)" in str(refused.value)
        launcher.kill()
        launcher.wait()
        with pytest.raises(FolderLocked) as refused:  # the child alone still holds it
            acquire(tmp_path, "second")
        assert f"in use by PID {child} (chexflow holder);" in str(refused.value)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.close(acquire(tmp_path, "second"))
    finally:
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_locked_folder_leaves_no_lock_file_and_no_empty_folder_it_created(tmp_path):
    with locked_folder(tmp_path / "new", "t"):
        assert (tmp_path / "new" / LOCK_FILE).is_file()
    assert not (tmp_path / "new").exists()
    with locked_folder(tmp_path / "kept", "t"):
        (tmp_path / "kept" / "result.json").write_text("{}")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["result.json"]  # no lock file
    (tmp_path / "file").write_text("x")
    with pytest.raises(ChexflowError, match="exists and is not a folder"), \
            locked_folder(tmp_path / "file", "t"):
        pass
