"""Fault injection on the supervised local cluster while an MPIJob trains DenseNet-121 on real
pods: etcd, kube-apiserver, kube-scheduler, mpi-operator, the kubelet and containerd are
SIGKILLed one at a time; the supervisor restarts each with its recorded arguments, and the job
must still end Succeeded with every epoch in a whole metrics.json.

The job's rank waits, after training, until the last fault is over (chexflow.bench.
cluster_faults.train_under_faults): the job cannot end before the faults, whatever the
machine's speed. The seconds each fault cost are the benchmark's (`chexflow bench --only
cluster-faults`, which writes the table docs/bench/cluster-faults.json holds), not asserted here.

The same six, and Katib's components (controller, db-manager, MySQL, a suggestion pod), are
killed while a Katib Experiment with MPIJob trials runs in
tests/cluster/test_cluster_katib_faults.py; both use chexflow.devcluster.faults."""

from __future__ import annotations

import json

import pytest

from chexflow.bench.cluster_faults import EPOCHS, train_under_faults
from chexflow.devcluster.faults import CONTROL_PLANE, restarts
from tests.cluster.conftest import generated_tfrecords

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]


@pytest.mark.timeout(2400)
def test_mpijob_on_real_pods_survives_each_control_plane_and_node_process_sigkilled(
        k8s_cluster, k8s_api, real_namespace, trainer_image):
    ns, data = real_namespace
    generated_tfrecords(data)
    before = restarts(k8s_cluster.state_dir)
    run = train_under_faults(k8s_cluster.state_dir, k8s_api, ns, data, "data", trainer_image,
                             EPOCHS, baseline=1)
    assert [row["fault"] for row in run.rows] == list(CONTROL_PLANE)
    cond = run.condition
    assert cond and cond["type"] == "Succeeded", f"{cond}\n{run.rows}\n{run.launcher_log[-3000:]}"
    metrics = json.loads((data / "run" / "metrics.json").read_text())  # whole, not half-written
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, EPOCHS + 1)), metrics
    assert f"val_auroc={metrics['val_auroc']:.6g}" in run.launcher_log
    leftovers = [str(p) for p in (data / "run").rglob("*") if ".tmp" in p.name]
    assert not leftovers, leftovers
    counts = restarts(k8s_cluster.state_dir)
    assert all(counts[n] > before.get(n, 0) for n in CONTROL_PLANE), counts
