"""The code stays ruff-clean (pyproject.toml's rules) and vulture finds no unused code in
chexflow/ (code only tests use included): CI fails on either."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

RUFF = Path(sys.executable).parent / "ruff"  # installed in the control environment
VULTURE = Path(sys.executable).parent / "vulture"


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


def test_vulture_finds_no_unused_code_in_chexflow():
    proc = subprocess.run([str(VULTURE)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vulture_reports_a_function_only_tests_call(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "lib.py").write_text("def used():\n    return 1\n\n\n"
                                             "def only_tested():\n    return 2\n")
    (tmp_path / "pkg" / "main.py").write_text("from pkg.lib import used\n\nprint(used())\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_lib.py").write_text(
        "from pkg.lib import only_tested\n\n\ndef test_it():\n    assert only_tested() == 2\n")
    (tmp_path / "pyproject.toml").write_text('[tool.vulture]\npaths = ["pkg"]\n')
    proc = subprocess.run([str(VULTURE)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "unused function 'only_tested'" in proc.stdout and "'used'" not in proc.stdout
