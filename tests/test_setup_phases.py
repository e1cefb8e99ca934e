"""images/phase.sh's records and the setup's wall clock that `make test` prints from them."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO, _setup_wall


def test_two_phases_side_by_side_count_once_in_the_setups_wall_clock(tmp_path):
    times = tmp_path / "setup-times.tsv"
    env = {**os.environ, "CHEXFLOW_SETUP_TIMES": str(times)}
    phase = str(REPO / "images" / "phase.sh")
    first = subprocess.Popen([phase, "short", "sleep", "0.5"], env=env)
    subprocess.run([phase, "long", "sleep", "1.5"], env=env, check=True)
    assert first.wait() == 0
    failed = subprocess.run([phase, "failing", "false"], env=env)
    assert failed.returncode == 1
    rows = [line.split("\t") for line in times.read_text().splitlines()]
    assert [(r[0], r[2]) for r in rows] == [("short", "0"), ("long", "0"), ("failing", "1")]
    assert all(len(r) == 5 for r in rows)
    assert all(float(r[4]) >= 0 for r in rows)  # the machine's busy core-seconds meanwhile
    wall, total = _setup_wall(rows), sum(float(r[1]) for r in rows)
    assert 1.5 <= wall < total  # the short sleep ran inside the long one: counted once
    assert _setup_wall([r[:3] for r in rows]) == total  # rows without a start: summed


def test_a_busy_phase_records_the_cpu_it_kept_busy(tmp_path):
    """BUSY (the 5th column) is the machine's busy core-seconds from /proc/stat: a phase
    spinning one core for a second counts about a second of it."""
    times = tmp_path / "setup-times.tsv"
    spin = "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass"
    subprocess.run([str(REPO / "images" / "phase.sh"), "spin", "python3", "-c", spin],
                   env={**os.environ, "CHEXFLOW_SETUP_TIMES": str(times)}, check=True)
    (row,) = [line.split("\t") for line in times.read_text().splitlines()]
    assert float(row[4]) >= 0.9, row
