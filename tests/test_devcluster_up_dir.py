"""`chexflow cluster up --dir` that cannot be used (a file where the folder goes, a folder under
a file, a read-only file system) is one line, checked before anything starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import CHEXFLOW
from tests.support.folders import read_only_folder


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
    with read_only_folder() as (readonly, reason):
        assert _one_line(_up(readonly)) == (
            f"chexflow cluster: error: --dir {readonly}: cannot write there ({reason}); choose "
            f"a folder you can write")
        assert list(readonly.iterdir()) == []
