"""Is a path a folder `chexflow tune` can write in (its state, a trial's volume)? Checked
before any work starts, so an unusable path is one line, not an OSError halfway through."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from chexflow.data.faults import cause
from chexflow.errors import ChexflowError


def check_writable_folder(path: Path, flag: str) -> None:
    """Refuse, in one line naming `flag`, a path that cannot be a folder to write in: a file, a
    path through a file, a folder that cannot be written (read-only, no permission). A folder
    not there yet passes when the nearest folder above it can be written (it is made later)."""
    problem = writable_folder_problem(path)
    if problem is not None:
        raise ChexflowError(f"{flag}: {problem}; choose a folder you can write")


def writable_folder_problem(path: Path) -> str | None:
    """Why `path` cannot be a folder to write in, else None. Writing is tried (a nameless
    temporary file), as permission bits alone say nothing for root or a read-only mount."""
    try:
        existing = Path(os.path.abspath(path))
        while not _exists(existing):
            existing = existing.parent
        if not existing.is_dir():
            return f"{existing} is not a folder"
        with tempfile.TemporaryFile(dir=existing):
            pass
    except ValueError as e:  # a NUL byte in the path
        return f"{path!r} is not a path ({e})"
    except OSError as e:
        return f"cannot write in {existing} ({cause(e)})"
    return None


def _exists(path: Path) -> bool:
    """Whether something (a dangling link too) is at `path`; OSError other than ENOENT/ENOTDIR
    (a name too long, a loop of links) propagates."""
    try:
        path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True
