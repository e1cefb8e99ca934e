"""Every folder a command writes is checked before its work starts (chexflow.folders): a file
in the way or a read-only file system is one line naming the option, and nothing is left
behind. `chexflow compile` and `chexflow slurm render` were OSError tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_chexflow
from tests.test_data_output import tmpfs


def _one_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


@pytest.fixture
def blocker(tmp_path) -> Path:
    """A file where a command expects a folder."""
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


@pytest.fixture
def read_only(tmp_path):
    with tmpfs(tmp_path / "ro", "size=100k,ro") as disk:
        yield disk


def test_compile_into_a_file_or_a_read_only_folder_is_one_line(blocker, read_only, tmp_path):
    cause = "Read-only file system (EROFS)); choose a folder you can write"
    for args, line in [
        (("--out", blocker / "x"), f"--out {blocker / 'x'}: cannot create it (Not a directory "
                                   "(ENOTDIR)); choose a folder you can write"),
        (("--out", blocker), f"--out {blocker}: exists and is not a folder"),
        (("--out", read_only), f"--out {read_only}: cannot write there ({cause}"),
        (("--out", read_only / "p"), f"--out {read_only / 'p'}: cannot create it ({cause}"),
        # the second folder is checked before anything is written into the first
        (("--out", tmp_path / "new" / "p", "--components-out", read_only),
         f"--components-out {read_only}: cannot write there ({cause}"),
    ]:
        proc = run_chexflow("compile", "chexnet-train", *args, check=False)
        assert _one_line(proc) == f"chexflow compile: error: {line}"
    assert not (tmp_path / "new").exists()
    assert list(read_only.iterdir()) == []


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """render only needs a manifest to point at."""
    path = tmp_path / "data"
    path.mkdir()
    (path / "manifest.json").write_text("{}")
    return path


def test_slurm_render_into_a_file_or_a_read_only_folder_is_one_line(
        blocker, read_only, data_dir, tmp_path):
    cause = "Read-only file system (EROFS)); choose a folder you can write"
    for args, line in [
        (("--out", blocker / "run"), f"--out {blocker / 'run'}: cannot create it (Not a "
                                     "directory (ENOTDIR)); choose a folder you can write"),
        (("--out", read_only / "run"), f"--out {read_only / 'run'}: cannot create it ({cause}"),
        (("--out", tmp_path / "run", "--script", read_only / "job.sbatch"),
         f"--script's folder {read_only}: cannot write there ({cause}"),
        (("--out", tmp_path / "run", "--script", data_dir),
         f"--script {data_dir}: a folder; expected the script's file name"),
    ]:
        proc = run_chexflow("slurm", "render", "--data", data_dir, "--python", "python", *args,
                            check=False)
        assert _one_line(proc) == f"chexflow slurm: error: {line}"
    assert not (tmp_path / "run").exists(), "no --out made for a script that cannot be written"


def test_writable_folders_leave_nothing_they_made_when_one_is_refused(tmp_path, blocker):
    from chexflow.folders import FolderError, writable_folder, writable_folders

    made = tmp_path / "a" / "b"
    with pytest.raises(FolderError, match="exists and is not a folder"):
        writable_folders((made, "--out"), (blocker, "--state"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert writable_folder(made, "--out") == tmp_path / "a" and made.is_dir()
    assert writable_folder(made, "--out") is None  # there already
