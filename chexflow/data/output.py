"""Output folders of `chexflow preprocess`, `chexflow data synth` and `chexflow evaluate`: staged,
then swapped in.

A run holds --out's lock (chexflow.runlock; the lock file goes when the run ends) and writes
everything into a staging folder beside it, `.OUT.chexflow-staging` (same filesystem, so moving
a file is a rename). Only when the run succeeded does `commit` write the swap plan into the
staging folder (the files of the previous run to remove, the new files to move in) and carry it
out, manifest.json last. A failed run removes its staging folder and leaves --out exactly as it was.

A killed run's staging folder is recognised as chexflow's by the marker file written into it
first. The next run with the same --out finishes a swap the killed run had begun (its plan is
in the staging folder) or else discards the folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

from chexflow.data import faults
from chexflow.data.records import DataError
from chexflow.data.split import SPLITS
from chexflow.runlock import LOCK_FILE, locked_folder

MARKER = ".chexflow-staging"  # written first: this folder is chexflow's staging folder
PLAN = ".chexflow-swap.json"  # written last: the run succeeded; what the swap removes and adds
MANIFEST = "manifest.json"
OWN_FILES = (MANIFEST, "rejected.csv", "splits.csv")


def staging_dir(out: Path) -> Path:
    """`.NAME.chexflow-staging` beside OUT (for `--out .` too: beside the current folder)."""
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name}.chexflow-staging"


def manifest_files(out: Path) -> set[str]:
    """The files (relative to OUT) that OUT/manifest.json says chexflow wrote."""
    path = out / MANIFEST
    with faults.reported(path):
        text = path.read_text()
    try:
        manifest = json.loads(text)
        shards = [
            (split, shard["path"])
            for split, entry in manifest["splits"].items()
            for shard in entry["shards"]
        ]
        manifest["manifest_version"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DataError(f"{path}: not a manifest chexflow wrote") from None
    for split, rel in shards:
        if split not in SPLITS or not re.fullmatch(rf"{split}/[^/]+\.tfrecord", str(rel)):
            raise DataError(f"{path}: lists {rel!r}, which is not a chexflow shard path")
    return {*OWN_FILES, *(rel for _, rel in shards)}


def previous_outputs(out: Path, overwrite: bool) -> list[str]:
    """The files of an earlier run that a new run into OUT replaces (relative to OUT).

    OUT must be empty, or with --overwrite hold only what its manifest.json lists (in split
    folders and beside it); anything else, or files with no manifest, is refused by name.
    """
    if not out.exists():
        return []
    if not out.is_dir():
        raise DataError(f"--out {out}: exists and is not a directory")
    entries = sorted(p for p in out.iterdir() if p.name != LOCK_FILE)
    if not entries:
        return []
    if not overwrite:
        raise DataError(
            f"--out {out}: not empty ({len(entries)} entries); pass --overwrite to replace "
            f"chexflow's outputs there (the files its manifest.json lists)"
        )
    if not (out / MANIFEST).is_file():
        raise DataError(
            f"--overwrite: {out} holds {entries[0].name!r} but no {MANIFEST}, so nothing there "
            f"is known to be chexflow's; move it away or choose an empty --out"
        )
    listed = manifest_files(out)
    found = []
    for entry in entries:
        paths = sorted(entry.rglob("*")) if entry.is_dir() and entry.name in SPLITS else [entry]
        for path in paths:
            rel = path.relative_to(out).as_posix()
            if rel not in listed:
                raise DataError(
                    f"--overwrite: {path} was not written by chexflow (not listed in "
                    f"{out / MANIFEST}); move it away or choose an empty --out"
                )
            found.append(rel)
    return found


class StagedOutput:
    """`with StagedOutput(out, command) as stage:` write into stage.dir, then stage.commit()."""

    def __init__(self, out: Path, command: str):
        self.out = out
        self.dir = staging_dir(out)
        self.command = command
        self._staged = False
        self._stack = ExitStack()

    def __enter__(self) -> StagedOutput:
        try:
            self._stack.enter_context(locked_folder(self.out, self.command))
            self._recover()
            with faults.reported(self.dir):
                self.dir.mkdir()
                self._staged = True
                (self.dir / MARKER).write_text(f"staging folder of chexflow {self.command}\n")
        except BaseException:
            self._close(failed=True)
            raise
        return self

    def __exit__(self, exc_type, _exc, _tb) -> None:
        self._close(failed=exc_type is not None)

    def commit(self, replaces: list[str]) -> None:
        """Swap the staged files into OUT; `replaces` are the previous run's files to remove."""
        added = sorted(
            p.relative_to(self.dir).as_posix()
            for p in self.dir.rglob("*")
            if p.is_file() and p.name != MARKER
        )
        plan = json.dumps({"remove": replaces, "add": added})
        with faults.reported(self.dir / PLAN):
            (self.dir / f"{PLAN}.tmp").write_text(plan)
            (self.dir / f"{PLAN}.tmp").replace(self.dir / PLAN)
        self._swap()

    def _swap(self) -> None:
        """Carry out the staged plan; safe to repeat after a kill or a fault at any point of it
        (a failed swap keeps the staging folder, and the next run finishes it)."""
        plan = json.loads((self.dir / PLAN).read_text())
        added = sorted(plan["add"], key=lambda rel: rel == MANIFEST)  # the manifest last
        try:
            if (self.dir / MANIFEST).exists():  # not moved yet: OUT's manifest is the old one
                (self.out / MANIFEST).unlink(missing_ok=True)
            for rel in set(plan["remove"]) - set(added):
                (self.out / rel).unlink(missing_ok=True)
            for rel in added:
                if (self.dir / rel).exists():
                    (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
                    (self.dir / rel).replace(self.out / rel)
            for split in SPLITS:
                folder = self.out / split
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        except faults.FAULTS as e:
            raise DataError(
                f"{faults.error(self.out, e)}; while moving the new outputs into --out: they "
                f"stay in {self.dir}, and the next run with this --out finishes moving them"
            ) from None
        self._remove_staging()

    def _recover(self) -> None:
        """Finish or discard the staging folder a killed run left (this run holds the lock)."""
        if not self.dir.exists():
            return
        if not (self.dir / MARKER).is_file():
            raise DataError(
                f"{self.dir}: in the way of chexflow's staging folder, but not one chexflow "
                f"made (no {MARKER} in it); move it away"
            )
        finish = (self.dir / PLAN).is_file()
        print(
            f"chexflow {self.command}: {'finishing' if finish else 'removing'} the staging "
            f"folder of an interrupted run: {self.dir}",
            file=sys.stderr,
        )
        if finish:
            self._swap()
        else:
            self._remove_staging()

    def _remove_staging(self) -> None:
        with faults.reported(self.dir):
            shutil.rmtree(self.dir)

    def _close(self, failed: bool) -> None:
        """Remove the staging folder of a failed run (unless its swap had begun: the next run
        finishes that); unlock (locked_folder also removes an OUT it created and left empty)."""
        with self._stack:
            if failed and self._staged and self.dir.exists() and not (self.dir / PLAN).exists():
                self._remove_staging()
