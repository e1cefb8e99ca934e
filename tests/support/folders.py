"""A folder nothing can be written in, for the writable-folder checks of every command."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def read_only_folder() -> Iterator[tuple[Path, str]]:
    """An empty folder and the reason a write there fails: as root (whom permission bits do not
    stop, and whose interpreter another user may not run) a read-only bind mount, else mode 555.
    It lives outside pytest's tmp_path so that a non-root run can still reach it."""
    shared = Path(tempfile.mkdtemp(prefix="chexflow-readonly-"))
    folder = shared / "ro"
    folder.mkdir(mode=0o555)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            subprocess.run(["mount", "--bind", folder, folder], check=True)
            subprocess.run(["mount", "-o", "remount,ro,bind", folder], check=True)
        yield folder, ("Read-only file system (EROFS)" if as_root
                       else "Permission denied (EACCES)")
    finally:
        if as_root:
            subprocess.run(["umount", folder], check=False)
        shutil.rmtree(shared)
