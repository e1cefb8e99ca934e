"""The folders a command writes into: made if needed and checked writable before any work starts,
with one line naming the option and the folder when they cannot be (every command's --out,
--dir, --state, ... goes through `writable_folder`); and new folders of their own per run
(`new_folder`), which two runs started in the same second never share."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from chexflow.errors import ChexflowError


class FolderError(ChexflowError):
    """A folder a command must write into is not one it can write."""


def os_cause(e: OSError) -> str:
    """What an OSError says, in words: `Read-only file system (EROFS)`."""
    if e.errno:
        return f"{os.strerror(e.errno)} ({errno.errorcode.get(e.errno, e.errno)})"
    return e.strerror or str(e) or type(e).__name__


def writable_folder(path: Path | str, option: str) -> Path | None:
    """Make PATH (and the folders above it) unless it is there, and check that a file can be
    created in it (a nameless file, gone when closed); returns the topmost folder made here, or
    None. FolderError naming `option` ("--out", "--state", ...) and PATH when it cannot be: a
    file in the way, a read-only file system, no permission (nothing made is left then)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FolderError(f"{option} {path}: exists and is not a folder")
    top = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        remove_made(path, top)
        raise FolderError(f"{option} {path}: cannot create it ({os_cause(e)}); choose a folder "
                          "you can write") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        remove_made(path, top)
        raise FolderError(f"{option} {path}: cannot write there ({os_cause(e)}); choose a "
                          "folder you can write") from None
    return top


def check_writable_folder(path: Path | str, option: str) -> None:
    """Refuse, naming `option`, a PATH that cannot become a folder to write in, making nothing
    (a dry run's check): a file in the way or on the path, or a nearest existing folder above it
    where no file can be created (read-only, no permission: writing is tried, since permission
    bits say nothing for root or a read-only mount)."""
    try:
        existing = Path(os.path.abspath(path))
        while not _exists(existing):
            existing = existing.parent
        if not existing.is_dir():
            raise FolderError(f"{option}: {existing} is not a folder; choose a folder you can "
                              "write")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except ValueError as e:  # a NUL byte in the path
        raise FolderError(f"{option}: {path!r} is not a path ({e})") from None
    except OSError as e:
        raise FolderError(f"{option}: cannot write in {existing} ({os_cause(e)}); choose a "
                          "folder you can write") from None


def _exists(path: Path) -> bool:
    """Whether something (a dangling link too) is at `path`; an OSError other than ENOENT or
    ENOTDIR (a name too long, a loop of links) propagates."""
    try:
        path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def writable_folders(*folders: tuple[Path | str, str]) -> None:
    """`writable_folder` for each (PATH, OPTION), all before any work: when one fails, the
    folders made for those before it are removed again."""
    made: list[tuple[Path, Path | None]] = []
    try:
        for path, option in folders:
            made.append((Path(path), writable_folder(path, option)))
    except FolderError:
        for path, top in reversed(made):
            remove_made(path, top)
        raise


def remove_made(path: Path, top: Path | None) -> None:
    """Remove the empty folders from PATH up to TOP, those `writable_folder` made (none when TOP
    is None; a folder something was written into stays)."""
    if top is None:
        return
    for folder in [path, *path.parents]:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == top:
            return


def new_folder(parent: Path, stem: str, option: str = "--out") -> Path:
    """PARENT/STEM made now, or PARENT/STEM-2, -3, ... when another run made that one first (each
    is created exclusively: two runs never get the same folder)."""
    writable_folder(parent, option)
    n = 1
    while True:
        folder = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1
        except OSError as e:
            raise FolderError(f"{option} {parent}: cannot create {folder.name} there "
                              f"({os_cause(e)}); choose a folder you can write") from None
