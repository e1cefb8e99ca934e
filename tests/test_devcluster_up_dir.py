"""`chexflow cluster up --dir` that cannot be used (a file where the folder goes, a folder under
a file, a read-only file system) is one line, checked before anything starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import CHEXFLOW


def _up(state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CHEXFLOW, "cluster", "up", "--dir", str(state), "--nodes", "1"],
                          capture_output=True, text=True, timeout=120)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_file_where_the_state_folder_goes_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert _one_line(_up(blocker)) == (
        f"chexflow cluster: error: --dir {blocker}: exists and is not a folder")
    assert _one_line(_up(blocker / "c")) == (
        f"chexflow cluster: error: --dir {blocker / 'c'}: cannot write there (Not a directory "
        f"(ENOTDIR)); choose a folder you can write")
    assert blocker.read_text() == "not a folder"


def test_a_read_only_state_folder_is_one_line_and_nothing_is_written(tmp_path):
    # as root, permission bits stop nothing: a read-only bind mount; else mode 555
    shared = Path(tempfile.mkdtemp(prefix="chexflow-readonly-"))
    readonly = shared / "cluster"
    readonly.mkdir(mode=0o555)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            subprocess.run(["mount", "--bind", readonly, readonly], check=True)
            subprocess.run(["mount", "-o", "remount,ro,bind", readonly], check=True)
        reason = "Read-only file system (EROFS)" if as_root else "Permission denied (EACCES)"
        assert _one_line(_up(readonly)) == (
            f"chexflow cluster: error: --dir {readonly}: cannot write there ({reason}); choose "
            f"a folder you can write")
        assert list(readonly.iterdir()) == []
    finally:
        if as_root:
            subprocess.run(["umount", readonly], check=False)
        shutil.rmtree(shared)
