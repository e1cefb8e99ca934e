"""`chexflow bench --only real-pods` against the session cluster (--kubeconfig): one local
horovodrun and one MPIJob on the real node, with the same tiny DenseNet-121 training; the report
holds both sides' rates and the MPIJob's start-up split. The goal is not asserted (a benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chexflow.bench.real_pods import LOCAL_PHASES, NAME, POD_PHASES
from chexflow.envs import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]


# the trainer image's build and import, then two tiny DenseNet trainings: 20 min on 2 busy cores
@pytest.mark.timeout(2400)
def test_bench_real_pods_runs_an_mpijob_beside_local_horovodrun(k8s_cluster, k8s_api, tmp_path):
    from kubernetes import client

    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "chexflow.cli", "bench", "--quick", "--only", "real-pods",
         "--repeats", "1", "--kubeconfig", str(k8s_cluster.kubeconfig), "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    (result,) = doc["results"]
    assert result["name"] == NAME
    assert (result["a"], result["b"]) == ("MPIJob on real pods", "horovodrun locally")
    assert len(result["samples_a"]) == len(result["samples_b"]) == 1
    assert min(result["samples_a"] + result["samples_b"]) > 0 and result["ratio"] > 0
    notes = result["notes"]
    assert (notes["workers"], notes["threads_per_worker"], notes["model"]) == (2, 1,
                                                                               "densenet121")
    # the pods' Horovod runs under the launcher's mpirun, the local one under horovodrun --gloo
    assert notes["controllers"] == {"MPIJob on real pods": ["mpi"],
                                    "horovodrun locally": ["gloo"]}
    (pods,) = notes["startup"]["MPIJob on real pods"]
    (local,) = notes["startup"]["horovodrun locally"]
    assert list(pods["phases"]) == list(POD_PHASES)
    assert list(local["phases"]) == list(LOCAL_PHASES)
    assert all(v >= 0 for v in pods["phases"].values()), pods
    assert pods["phases"]["first step"] > 0 and pods["phases"]["rank 0 started"] > 0
    assert sum(pods["phases"].values()) == pytest.approx(pods["to_first_step_s"], abs=0.01)
    assert notes["image"].startswith("chexflow.local/trainer:")
    assert notes["cluster"].startswith("running, from ")
    table = (out / "bench.md").read_text()
    assert f"### {NAME}: start-up (s)" in table and "| **MPIJob on real pods median** |" in table
    assert (out / "bench-real-pods-startup.png").stat().st_size > 0
    # nothing left: the PersistentVolume is gone, the namespace gone or being deleted
    core = client.CoreV1Api(k8s_api)
    assert not [pv.metadata.name for pv in core.list_persistent_volume().items
                if pv.metadata.name.startswith("bench-real-pods-")]
    assert not [ns.metadata.name for ns in core.list_namespace().items
                if ns.metadata.name.startswith("bench-real-pods-")
                and not ns.metadata.deletion_timestamp]
