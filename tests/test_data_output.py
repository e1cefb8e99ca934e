"""`chexflow preprocess` and `chexflow data synth` output folders: nothing lost, nothing partial.

Outputs are staged beside --out and swapped in on success; --overwrite replaces only what the
previous manifest lists; a killed run is recognised and cleaned up; faults while writing (a full
disk, a read-only file system, ENOSPC injected into one file's writes) end in one line with the
previous output intact. Mounting tmpfs needs root, as the test machine's user is; faults at one
exact point are injected with strace (images/install-system.sh installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chexflow.data.output import staging_dir
from chexflow.runlock import locked_folder
from tests.conftest import CHEXFLOW, run_chexflow
from tests.test_data_faults import one_line_error, rows_of


@pytest.fixture(scope="module")
def synth40(tmp_path_factory) -> Path:
    """`chexflow data synth --images 40 --size 32` (NIH format)."""
    out = tmp_path_factory.mktemp("synth40") / "ds"
    run_chexflow("data", "synth", "--out", out, "--images", 40, "--size", 32)
    return out


def args(ds: Path, out: Path, *extra) -> list:
    return ["preprocess", "--csv", ds / "Data_Entry_2017.csv", "--images", ds / "images",
            "--out", out, "--image-size", 32, "--workers", 1, *extra]


@pytest.fixture(scope="module")
def good(synth40, tmp_path_factory) -> Path:
    """A finished preprocess output (2 shards per split), copied by the tests that change it."""
    out = tmp_path_factory.mktemp("good") / "out"
    run_chexflow(*args(synth40, out, "--images-per-shard", 14))
    return out


@pytest.fixture()
def previous(good, tmp_path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "out"))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder (the lock file aside) with its bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".chexflow.lock"
    }


def leftovers(root: Path) -> list[str]:
    """Temporary files and staging folders anywhere under root."""
    return [p.name for p in root.rglob("*") if p.name.endswith(".tmp") or "staging" in p.name]


def run_with_fault(path: Path, syscalls: str, fault: str, *chexflow_args):
    """`chexflow ARGS` under strace, which makes `syscalls` on `path` fail with `fault`
    (error=ENOSPC, signal=KILL, ...): a real fault at one exact point of a run."""
    return subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-P", str(path), "-e", f"trace={syscalls}",
         "-e", f"inject={syscalls}:{fault}", *CHEXFLOW, *map(str, chexflow_args)],
        capture_output=True, text=True,
    )


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


# --- --overwrite: validate first, replace only what the manifest lists ---

@pytest.mark.slow
def test_refused_overwrite_keeps_previous_output(synth40, previous, tmp_path):
    before = snapshot(previous)
    lists = tmp_path / "lists"
    lists.mkdir()
    names = [r[0] for r in rows_of(synth40 / "Data_Entry_2017.csv")[1:]]
    (lists / "train_val_list.txt").write_text("\n".join(names[:30]) + "\n")
    (lists / "test_list.txt").write_text("\n".join([*names[30:], "99999999_000.png"]) + "\n")
    proc = run_chexflow(*args(synth40, previous, "--overwrite", "--split-lists", lists),
                        check=False)
    one_line_error(proc, "test_list.txt: 1 image(s) not in the CSV", "99999999_000.png")
    assert snapshot(previous) == before
    (previous / "notes.txt").write_text("mine")
    proc = run_chexflow(*args(synth40, previous, "--overwrite"), check=False)
    one_line_error(proc, f"--overwrite: {previous / 'notes.txt'} was not written by chexflow")
    assert snapshot(previous) == {**before, "notes.txt": b"mine"}
    assert not leftovers(tmp_path)


def test_users_tfrecord_in_a_split_folder_is_untouched(synth40, previous):
    before = snapshot(previous)
    (previous / "train" / "mine.tfrecord").write_bytes(b"my own records")
    proc = run_chexflow(*args(synth40, previous, "--overwrite", "--plan-only"), check=False)
    one_line_error(proc, f"{previous / 'train' / 'mine.tfrecord'} was not written by chexflow")
    assert snapshot(previous) == {**before, "train/mine.tfrecord": b"my own records"}


def test_splits_csv_in_a_folder_without_manifest_is_untouched(synth40, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "splits.csv").write_text("image_index,split\nmine.png,train\n")
    proc = run_chexflow(*args(synth40, out, "--overwrite", "--plan-only"), check=False)
    one_line_error(proc, f"--overwrite: {out} holds 'splits.csv' but no manifest.json")
    assert snapshot(out) == {"splits.csv": b"image_index,split\nmine.png,train\n"}
    assert [p.name for p in out.iterdir()] == ["splits.csv"]  # not even a lock file


@pytest.mark.slow
def test_overwrite_replaces_exactly_the_files_the_manifest_listed(synth40, previous):
    old = json.loads((previous / "manifest.json").read_text())
    assert [len(old["splits"][s]["shards"]) for s in ("train", "val", "test")] == [3, 1, 1]
    run_chexflow(*args(synth40, previous, "--overwrite", "--images-per-shard", 1000,
                       "--seed", 4))
    new = json.loads((previous / "manifest.json").read_text())
    assert new["split"]["seed"] == 4
    shards = {sh["path"] for s in new["splits"].values() for sh in s["shards"]}
    assert shards == {f"{s}/{s}-00000-of-00001.tfrecord" for s in ("train", "val", "test")}
    assert set(snapshot(previous)) == {"manifest.json", "rejected.csv", "splits.csv", *shards}
    assert not leftovers(previous.parent)


# --- killed runs and the folder lock ---

@pytest.mark.slow
def test_killed_run_leaves_output_intact_and_next_run_cleans_up(synth40, previous, tmp_path):
    """A run blocked on a FIFO image holds the lock (a second run is refused with its PID);
    killed, it leaves its staging folder with a .tmp shard, which the next run removes."""
    ds = Path(shutil.copytree(synth40, tmp_path / "ds"))
    before = snapshot(previous)
    fifo = ds / "images" / rows_of(ds / "Data_Entry_2017.csv")[1][0]
    fifo.unlink()
    os.mkfifo(fifo)
    run = subprocess.Popen([*CHEXFLOW, *map(str, args(ds, previous, "--overwrite"))],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = staging_dir(previous)
    try:
        deadline = time.time() + 300  # TensorFlow's import is slow on a busy machine
        while not list(staging.rglob("*.tfrecord.tmp")) and time.time() < deadline:
            time.sleep(0.05)
        assert list(staging.rglob("*.tfrecord.tmp")), "the run never reached the FIFO image"
        proc = run_chexflow(*args(ds, previous, "--overwrite", "--plan-only"), check=False)
        one_line_error(proc, f"{previous}: in use by PID {run.pid} (chexflow preprocess)")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    assert snapshot(previous) == before
    assert (staging / ".chexflow-staging").is_file()
    proc = run_chexflow(*args(synth40, previous, "--overwrite", "--plan-only"))
    assert f"removing the staging folder of an interrupted run: {staging}" in proc.stderr
    assert not staging.exists() and not leftovers(tmp_path)
    assert json.loads((previous / "manifest.json").read_text())["plan_only"] is True


@pytest.mark.parametrize("fault", ["signal=KILL", "error=ENOSPC"])
def test_swap_cut_short_is_finished_by_the_next_run(synth40, previous, fault):
    """SIGKILL or ENOSPC injected (strace) into the rename that would put the new manifest.json
    in place: the old manifest and shards are gone, the new CSVs are in, the new manifest is
    staged; the staging folder is kept and the next run finishes the swap."""
    new_manifest = previous / "manifest.json"
    staging = staging_dir(previous)
    proc = run_with_fault(staging / "manifest.json", "rename,renameat,renameat2", fault,
                          *args(synth40, previous, "--overwrite", "--plan-only", "--seed", 9))
    if fault == "signal=KILL":
        assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), proc
    else:
        one_line_error(proc, f"{staging / 'manifest.json'}: No space left on device (ENOSPC); "
                       f"while moving the new outputs into --out: they stay in {staging}")
    assert not new_manifest.exists() and (staging / "manifest.json").exists()
    staged = (staging / "manifest.json").read_bytes()
    proc = run_chexflow(*args(synth40, previous, "--plan-only"), check=False)
    assert f"finishing the staging folder of an interrupted run: {staging}" in proc.stderr
    assert "not empty" in proc.stderr.split("\n")[-2]  # then refused: the finished run's output
    assert new_manifest.read_bytes() == staged
    assert json.loads(staged)["split"]["seed"] == 9
    assert set(snapshot(previous)) == {"manifest.json", "rejected.csv", "splits.csv"}
    assert not staging.exists()


def test_folder_locked_by_another_process_is_refused_with_its_pid(synth40, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with locked_folder(out, "train"):
        proc = run_chexflow(*args(synth40, out, "--plan-only"), check=False)
    one_line_error(proc, f"{out}: in use by PID {os.getpid()} (chexflow train)")
    run_chexflow(*args(synth40, out, "--plan-only"))


# --- faults while writing: one line, no partial file, the previous output intact ---

@pytest.mark.slow
def test_preprocess_into_a_full_100k_tmpfs(synth40, tmp_path):
    with tmpfs(tmp_path / "small", "size=100k") as disk:
        proc = run_chexflow(*args(synth40, disk / "out", "--image-size", 64), check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        last = proc.stderr.strip().split("\n")[-1]
        assert last.startswith("chexflow preprocess: error: ") and last.count("\n") == 0
        assert last.endswith("No space left on device (ENOSPC)") and ".tfrecord.tmp" in last
        assert list(disk.iterdir()) == []  # no .tmp, no manifest.json, no folder

        run_chexflow(*args(synth40, disk / "out", "--plan-only"))
        before = snapshot(disk / "out")
        proc = run_chexflow(*args(synth40, disk / "out", "--image-size", 64, "--overwrite"),
                            check=False)
        assert proc.returncode == 2 and "No space left on device (ENOSPC)" in proc.stderr
        assert snapshot(disk / "out") == before
        assert sorted(p.name for p in disk.iterdir()) == ["out"] and not leftovers(disk)


def test_synth_into_a_full_100k_tmpfs(tmp_path):
    with tmpfs(tmp_path / "small", "size=100k") as disk:
        proc = run_chexflow("data", "synth", "--out", disk / "ds", "--images", 40, "--size", 64,
                            check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        last = proc.stderr.strip().split("\n")[-1]
        assert last.startswith("chexflow data: error: ")
        assert last.endswith("No space left on device (ENOSPC)")
        assert list(disk.iterdir()) == []


def test_read_only_file_system_is_one_line(synth40, tmp_path):
    with tmpfs(tmp_path / "ro", "size=100k,ro") as disk:
        proc = run_chexflow(*args(synth40, disk / "out", "--plan-only"), check=False)
        one_line_error(proc, f"--out {disk / 'out'}: cannot create it (Read-only file system "
                             "(EROFS)); choose a folder you can write")
        proc = run_chexflow("data", "synth", "--out", disk / "ds", "--images", 4, check=False)
        one_line_error(proc, f"--out {disk / 'ds'}: cannot create it (Read-only file system "
                             "(EROFS)); choose a folder you can write")


@pytest.mark.parametrize("name", ["splits.csv", "rejected.csv", "manifest.json"])
def test_disk_full_while_writing_an_output_file(synth40, previous, name):
    """ENOSPC injected (strace) into every write to the staged file: one line naming it; the
    previous output intact, no 0-byte or partial file anywhere."""
    before = snapshot(previous)
    target = staging_dir(previous) / name
    proc = run_with_fault(target, "write", "error=ENOSPC",
                          *args(synth40, previous, "--overwrite", "--plan-only"))
    one_line_error(proc, f"{target}: No space left on device (ENOSPC)")
    assert snapshot(previous) == before
    assert not staging_dir(previous).exists()


def test_permission_denied_on_the_csv_is_one_line(synth40, tmp_path):
    """EACCES injected into opening the CSV (as root, chmod would not deny anything)."""
    csv_path = synth40 / "Data_Entry_2017.csv"
    proc = run_with_fault(csv_path, "openat", "error=EACCES",
                          *args(synth40, tmp_path / "out", "--plan-only"))
    one_line_error(proc, f"{csv_path}: Permission denied (EACCES)")
    assert not (tmp_path / "out").exists()


def decoding_workers(pid: int) -> list[int]:
    """The multiprocessing (spawn) children of process `pid`."""
    ps = subprocess.run(["ps", "-ww", "--ppid", str(pid), "-o", "pid=,args="],
                        capture_output=True, text=True)
    return sorted(int(line.split()[0]) for line in ps.stdout.splitlines()
                  if "multiprocessing.spawn" in line)


@pytest.mark.slow
def test_decoding_worker_killed_ends_the_run_with_one_line(synth40, previous, tmp_path):
    """One of two decoding processes is killed while the other waits on a FIFO image: the run
    ends (it waited forever with multiprocessing.Pool) with one line; the output is intact."""
    ds = Path(shutil.copytree(synth40, tmp_path / "ds"))
    before = snapshot(previous)
    fifo = ds / "images" / rows_of(ds / "Data_Entry_2017.csv")[1][0]
    fifo.unlink()
    os.mkfifo(fifo)
    run = subprocess.Popen([*CHEXFLOW, *map(str, args(ds, previous, "--overwrite",
                                                      "--workers", 2))],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300  # TensorFlow's import is slow on a busy machine
        while len(workers := decoding_workers(run.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, f"no decoding processes; exit code {run.poll()}"
        os.kill(workers[-1], signal.SIGKILL)
        _, err = run.communicate(timeout=60)
    finally:
        for worker in decoding_workers(run.pid):  # none once the run has ended as it should
            os.kill(worker, signal.SIGKILL)
        run.kill()
        run.wait()
    assert run.returncode == 2 and "Traceback" not in err
    assert err.strip().split("\n")[-1] == (
        "chexflow preprocess: error: a process decoding images died (killed, or out of memory); "
        "nothing was written to --out; rerun, with fewer --workers if memory is short"
    )
    assert snapshot(previous) == before and not leftovers(tmp_path)
