"""The fault table's benchmark without a cluster: the rank's command holds the job until the
faults are over (and fails at once when training fails), and the table's arithmetic (epochs
each fault touched, seconds lost against the fault-free epochs)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from chexflow.bench.cluster_faults import FaultRun, rank_command, table


def _rank(tmp_path: Path, train_exit: int) -> tuple[subprocess.Popen, Path]:
    """The rank's command with a stand-in `chexflow` that exits `train_exit` at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chexflow").write_text(f"#!/bin/sh\ntouch {tmp_path}/trained\nexit {train_exit}\n")
    (bin_dir / "chexflow").chmod(0o755)
    gate = tmp_path / "faults-done"
    proc = subprocess.Popen(rank_command("/data/tfrecords", "/data/run", str(gate), 3),
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return proc, gate


def test_the_job_cannot_end_before_the_faults_are_over(tmp_path):
    proc, gate = _rank(tmp_path, 0)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "trained").exists():  # training is over (its stand-in ran)
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(1.5)  # past a poll of the wait that follows: only the gate ends it
        assert proc.poll() is None
        gate.write_text("")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_training_that_fails_fails_the_rank_without_waiting(tmp_path):
    proc, _ = _rank(tmp_path, 3)
    assert proc.wait(timeout=30) == 3


def test_seconds_lost_are_the_touched_epochs_beyond_as_many_fault_free_ones():
    ends = {1: 100.0, 2: 104.0, 3: 108.0, 4: 115.0, 5: 119.0, 6: 123.0, 7: 133.0, 8: 137.0}
    rows = [  # etcd in epoch 4 (4 s more); the apiserver down across epochs 7 and 8; the
        # kubelet after training
        {"fault": "etcd", "at": 109.0, "back": 110.0},
        {"fault": "kube-apiserver", "at": 124.0, "back": 134.0},
        {"fault": "kubelet", "at": 140.0, "back": 141.0}]
    got = table(FaultRun(rows=rows, epoch_ends=ends))
    assert got["median_fault_free_epoch_s"] == 4.0 and got["fault_free_epochs"] == 4
    etcd, apiserver, kubelet = got["faults"]
    assert (etcd["during_epochs"], etcd["epoch_seconds"], etcd["seconds_lost"]) == ([4], 7.0, 3.0)
    assert (apiserver["during_epochs"], apiserver["seconds_lost"]) == ([7, 8], 6.0)
    assert (kubelet["during_epochs"], kubelet["seconds_lost"]) == ([], None)
    assert "at" not in etcd and "back" not in etcd
