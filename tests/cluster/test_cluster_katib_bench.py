"""`chexflow bench --only katib-cluster` against the session's Katib cluster (--kubeconfig): the
same trivial-trial Experiment through the real Katib and through the local runner, each trial
timing itself on the host's clock. The goals are not asserted (a benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chexflow.bench.katib_cluster import KATIB_SIDE, LOCAL_SIDE, NAME
from chexflow.envs import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]


@pytest.mark.timeout(1200)
def test_bench_katib_cluster_times_real_katib_trials_beside_the_local_runner(
        katib_cluster, tmp_path):
    from kubernetes import client

    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "chexflow.cli", "bench", "--quick", "--only", "katib-cluster",
         "--repeats", "1", "--kubeconfig", str(katib_cluster.kubeconfig), "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    start, gap = doc["results"]
    assert start["name"] == f"{NAME}: start to first trial"
    assert gap["name"] == f"{NAME}: trial end to next trial start"
    for result in (start, gap):
        assert (result["a"], result["b"]) == (KATIB_SIDE, LOCAL_SIDE)
        assert len(result["samples_a"]) == len(result["samples_b"]) == 1
        assert result["notes"]["trials_per_sweep"] == 3
        assert result["notes"]["cluster"].startswith("running, from ")
    # every figure is a time the trials measured: positive, Katib's not below the runner's start
    assert min(start["samples_a"] + start["samples_b"] + gap["samples_a"]
               + gap["samples_b"]) > 0
    assert start["samples_a"][0] > start["samples_b"][0]
    assert "katib per-trial overhead: start to first trial" in (out / "bench.md").read_text()
    # nothing left: the bench's namespace is gone or being deleted
    namespaces = client.CoreV1Api(katib_cluster.api_client()).list_namespace().items
    assert not [ns.metadata.name for ns in namespaces if ns.metadata.name.startswith(
        "bench-katib-") and not ns.metadata.deletion_timestamp]
