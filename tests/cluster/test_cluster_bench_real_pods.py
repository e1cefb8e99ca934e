"""`chexflow bench --quick --only real-pods` against the session cluster (--kubeconfig, Trainer
added): one local horovodrun, one MPIJob and one TrainJob on chexflow's runtime on the real
node, with the same tiny DenseNet-121 training (the bench's --quick sizes: 32 px, 4 steps of
4 images); the report holds the rates of both comparisons (MPIJob vs local, TrainJob vs MPIJob)
and each pod side's start-up split. The goals are not asserted (a benchmark): the full-size
figures are docs/benchmarks.md's. The trainer image is the package fixture's (built once for
every real-pods test), so this test's own time is the three trainings."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from chexflow.bench.real_pods import (
    LOCAL_PHASES,
    LOCAL_SIDE,
    NAME,
    POD_PHASES,
    POD_SIDE,
    TRAINJOB_NAME,
    TRAINJOB_SIDE,
)
from chexflow.devcluster.trainer import Trainer
from chexflow.envs import REPO_ROOT
from chexflow.jobs.trainjob import RUNTIME_PLURAL, TRAINJOB_GROUP, TRAINJOB_VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]


@pytest.mark.timeout(1200)
def test_bench_real_pods_runs_an_mpijob_and_a_trainjob_beside_local_horovodrun(
        k8s_cluster, k8s_api, trainer_image, tmp_path):
    from kubernetes import client

    if not k8s_cluster.has("trainer"):
        k8s_cluster.add(Trainer(), timeout=180)
    out = tmp_path / "bench"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "chexflow.cli", "bench", "--quick", "--only", "real-pods",
         "--repeats", "1", "--kubeconfig", str(k8s_cluster.kubeconfig), "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True)
    print(f"bench --quick --only real-pods: {time.monotonic() - start:.0f} s", file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    pods_vs_local, trainjob_vs_mpijob = doc["results"]
    assert pods_vs_local["name"] == NAME and trainjob_vs_mpijob["name"] == TRAINJOB_NAME
    assert (pods_vs_local["a"], pods_vs_local["b"]) == (POD_SIDE, LOCAL_SIDE)
    assert (trainjob_vs_mpijob["a"], trainjob_vs_mpijob["b"]) == (TRAINJOB_SIDE, POD_SIDE)
    # one MPIJob run, the same samples in both comparisons
    assert pods_vs_local["samples_a"] == trainjob_vs_mpijob["samples_b"]
    for result in (pods_vs_local, trainjob_vs_mpijob):
        assert len(result["samples_a"]) == len(result["samples_b"]) == 1
        assert min(result["samples_a"] + result["samples_b"]) > 0 and result["ratio"] > 0
        notes = result["notes"]
        assert (notes["workers"], notes["threads_per_worker"], notes["model"]) == (
            2, 1, "densenet121")
        assert notes["image"].startswith("chexflow.local/trainer:")
        assert notes["cluster"].startswith("running, from ")
    # the pods' Horovod runs under the launcher's mpirun, the local one under the launch's
    # default on CPU (MPI tensor operations under mpirun: setup installs OpenMPI)
    assert pods_vs_local["notes"]["controllers"] == {POD_SIDE: ["mpi"], LOCAL_SIDE: ["mpi"]}
    assert trainjob_vs_mpijob["notes"]["controllers"] == {TRAINJOB_SIDE: ["mpi"],
                                                          POD_SIDE: ["mpi"]}
    startup = {**pods_vs_local["notes"]["startup"], **trainjob_vs_mpijob["notes"]["startup"]}
    (local,) = startup[LOCAL_SIDE]
    assert list(local["phases"]) == list(LOCAL_PHASES)
    for side in (POD_SIDE, TRAINJOB_SIDE):
        (pods,) = startup[side]
        assert list(pods["phases"]) == list(POD_PHASES)
        assert all(v >= 0 for v in pods["phases"].values()), pods
        assert pods["phases"]["first step"] > 0 and pods["phases"]["rank 0 started"] > 0
        assert sum(pods["phases"].values()) == pytest.approx(pods["to_first_step_s"], abs=0.01)
    table = (out / "bench.md").read_text()
    for name, side in ((NAME, POD_SIDE), (TRAINJOB_NAME, TRAINJOB_SIDE)):
        assert f"### {name}: start-up (s)" in table and f"| **{side} median** |" in table
    for png in ("bench-real-pods-startup.png", "bench-trainjob-startup.png"):
        assert (out / png).stat().st_size > 0
    # nothing left: the runtime and PersistentVolume gone, the namespace gone or being deleted
    core = client.CoreV1Api(k8s_api)
    assert not [pv.metadata.name for pv in core.list_persistent_volume().items
                if pv.metadata.name.startswith("bench-real-pods-")]
    assert not [ns.metadata.name for ns in core.list_namespace().items
                if ns.metadata.name.startswith("bench-real-pods-")
                and not ns.metadata.deletion_timestamp]
    runtimes = client.CustomObjectsApi(k8s_api).list_cluster_custom_object(
        TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL)["items"]
    assert not [r for r in runtimes if r["metadata"]["name"].startswith("bench-real-pods-")]
