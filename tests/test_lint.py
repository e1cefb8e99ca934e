"""The code stays ruff-clean (pyproject.toml's rules): CI fails on a lint error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

RUFF = Path(sys.executable).parent / "ruff"  # installed in the control environment


def test_ruff_finds_nothing():
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_reports_a_real_error(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "--isolated", "--select", "F401",
                           str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "F401" in proc.stdout
