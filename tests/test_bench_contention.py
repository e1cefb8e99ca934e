"""The contention study's stream and MPIJobs (chexflow.bench.contention), without a cluster."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from chexflow.bench import contention
from chexflow.devcluster import nodes
from chexflow.envs import REPO_ROOT


def test_the_stream_asks_for_the_demanded_share_of_the_gpus_in_whole_nodes():
    jobs = contention.plan_stream(nodes=100, gpus_per_node=8, demand=1.5, seed=3)
    gpus = sum(j.workers for j in jobs) * 8
    assert 1.5 * 800 <= gpus < 1.5 * 800 + 16 * 8
    assert {j.workers for j in jobs} <= set(contention.SIZES)
    assert len({j.namespace for j in jobs}) == 4
    assert jobs == contention.plan_stream(nodes=100, gpus_per_node=8, demand=1.5, seed=3)


def test_each_policy_renders_what_its_admission_reads():
    job = contention.PlannedJob("job-0001", "team-1", workers=4, run_seconds=42)
    default = contention.stream_mpijob(job, 8, "default")
    gang = contention.stream_mpijob(job, 8, "coscheduling")
    assert "schedulingPolicy" not in default["spec"]["runPolicy"]
    assert gang["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4}
    assert default["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    launcher = default["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    assert launcher["metadata"]["annotations"] == {contention.KWOK_DELAY: "42s"}
    worker = default["spec"]["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"][
        nodes.GPU_RESOURCE] == 8
    held = contention.stream_mpijob(job, 8, "default", hold=True)
    assert held["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"] == {
        "labels": {nodes.HOLD_LABEL: "true"}}
    with pytest.raises(ValueError, match="policy must be one of"):
        contention.policy_options("volcano")


def test_a_stall_with_gpus_held_is_reported_as_a_deadlock():
    Sample = contention.Sample
    samples = [Sample(0, 0, 0, 0, 0, 0, 160), Sample(10, 64, 64, 0, 0, 1, 160),
               Sample(20, 80, 0, 2, 1, 0, 96), Sample(80, 80, 0, 2, 1, 0, 96)]
    s = contention.summarize(samples, jobs=3, capacity=80, sample_s=10)
    assert not s["drained"] and s["drain_s"] is None
    assert s["deadlocked_jobs"] == 2 and s["stalled_with_gpus_held"] == 80
    assert s["gpu_seconds_held_by_jobs_not_running"] == 80 * 60
    # demand (160, then 96 GPUs) exceeded the 80 GPUs throughout; 64 of 80 worked at t=10
    assert s["seconds_demand_exceeded_capacity"] == 80
    assert s["mean_utilisation_while_backlogged"] == round(64 / (4 * 80), 3)


def test_steady_state_leaves_out_the_warm_up_and_the_bound_reads_the_fit_latency():
    Sample = contention.Sample
    # backlogged throughout (demand 160 > 80 GPUs); the first wave (t < 30) places slowly
    samples = [Sample(0, 0, 0, 0, 0, 0, 160), Sample(10, 16, 0, 1, 0, 0, 160),
               Sample(30, 80, 64, 0, 0, 4, 160), Sample(40, 80, 72, 0, 1, 4, 160),
               Sample(50, 80, 80, 0, 2, 5, 160)]
    s = contention.summarize(samples, jobs=9, capacity=80, sample_s=10, warm_up_s=30)
    assert s["steady_working_while_backlogged"] == round((64 + 72 + 80) / (3 * 80), 3)
    assert s["steady_held_while_backlogged"] == 1.0
    assert s["mean_utilisation_while_backlogged"] < s["steady_working_while_backlogged"]
    jobs = [contention.PlannedJob(f"j{i}", "t", 1, d) for i, d in enumerate((30, 90))]
    assert contention.utilisation_bound(jobs, 20.0) == round(60 / 80, 3)
    assert contention.utilisation_bound(jobs, None) is None
    assert contention.percentiles([float(v) for v in range(1, 101)]) == {"p50": 50.0,
                                                                          "p95": 95.0}
    assert contention.percentiles([]) == {"p50": None, "p95": None}


def test_each_policy_states_the_rate_limits_it_ran_under():
    from chexflow.devcluster import controlplane, kueue

    default, queued = contention.rate_limits("default"), contention.rate_limits("kueue")
    assert default["apiserver"] == controlplane.APISERVER_LIMITS
    assert default["mpi-operator"]["qps"] == controlplane.CLIENT_QPS
    assert "kueue" not in default
    assert queued["kueue"] == {**kueue.CLIENT_CONNECTION,
                               "groupKindConcurrency": kueue.GROUP_KIND_CONCURRENCY,
                               "blockAdmission": False, "topologyAwareScheduling": False}
    assert contention.rate_limits("kueue-blocking")["kueue"]["blockAdmission"] is True
    assert "coscheduling scheduler" in contention.rate_limits("coscheduling")
    mpi_operator = controlplane.LocalCluster._mpi_operator_args(SimpleNamespace(kubeconfig="k"))
    assert f"--kube-api-qps={controlplane.CLIENT_QPS}" in mpi_operator


def test_kueue_blocking_runs_kueue_with_waitforpodsready_blocking_admission(tmp_path):
    from chexflow.devcluster import kueue

    (addon,) = contention.policy_options("kueue-blocking")["addons"]
    assert addon.name == "kueue" and addon.block_admission
    assert addon.settings()["block_admission"] is True  # cluster.json keeps it across restarts
    ports = {"kueue_health": 1, "kueue_metrics": 2, "kueue_webhook": 3}
    config = kueue.configuration(ports, tmp_path, addon.block_admission)
    assert config["waitForPodsReady"]["blockAdmission"] is True
    assert kueue.configuration(ports, tmp_path)["waitForPodsReady"]["blockAdmission"] is False
    job = contention.PlannedJob("job-0001", "team-1", workers=2, run_seconds=30)
    assert contention.stream_mpijob(job, 8, "kueue-blocking")["metadata"]["labels"] == {
        kueue.QUEUE_LABEL: kueue.CLUSTER_QUEUE}


def test_kueue_tas_names_a_topology_over_the_racks_and_the_workers_prefer_one_rack():
    from chexflow.devcluster import kueue

    (addon,) = contention.policy_options("kueue-tas")["addons"]
    assert addon.topology and not addon.block_admission
    job = contention.PlannedJob("job-0001", "team-1", workers=4, run_seconds=30)
    spec = contention.stream_mpijob(job, 8, "kueue-tas")["spec"]["mpiReplicaSpecs"]
    assert spec["Worker"]["template"]["metadata"]["annotations"] == {
        kueue.PREFERRED_TOPOLOGY: nodes.RACK_LABEL}
    assert kueue.PREFERRED_TOPOLOGY not in spec["Launcher"]["template"]["metadata"]["annotations"]
    assert nodes.topology_labels(0) == {nodes.BLOCK_LABEL: "block-0", nodes.RACK_LABEL: "rack-0"}
    assert nodes.topology_labels(70) == {nodes.BLOCK_LABEL: "block-1", nodes.RACK_LABEL: "rack-8"}
    assert nodes.gpu_node("n", topology=nodes.topology_labels(9))["metadata"]["labels"][
        nodes.RACK_LABEL] == "rack-1"


def test_kueue_qps_and_mpijob_concurrency_reach_kueues_configuration_and_stated_limits(
        tmp_path):
    from chexflow.devcluster import kueue

    tuning = {"client_qps": 400, "mpijob_concurrency": 5}
    (addon,) = contention.policy_options("kueue", tuning)["addons"]
    ports = {"kueue_health": 1, "kueue_metrics": 2, "kueue_webhook": 3}
    config = kueue.configuration(ports, tmp_path, client=addon.client(),
                                 concurrency=addon.concurrency())
    assert config["clientConnection"] == {"qps": 400, "burst": 800}
    assert config["controller"]["groupKindConcurrency"] == {**kueue.GROUP_KIND_CONCURRENCY,
                                                            "MPIJob.kubeflow.org": 5}
    stated = contention.rate_limits("kueue", tuning)["kueue"]
    assert stated["qps"] == 400 and stated["groupKindConcurrency"]["MPIJob.kubeflow.org"] == 5
    assert kueue.Kueue().client() == kueue.CLIENT_CONNECTION
    shipped = kueue.configuration(ports, tmp_path)["controller"]["groupKindConcurrency"]
    assert shipped == kueue.GROUP_KIND_CONCURRENCY and "MPIJob.kubeflow.org" not in shipped


class _Objects:
    """CustomObjectsApi's list call over fixed items, by plural."""

    def __init__(self, **items):
        self.items = items

    def list_namespaced_custom_object(self, group, version, namespace, plural):
        return {"items": self.items[plural]}


def test_kueue_steps_split_a_jobs_admission_by_the_workloads_conditions_and_the_polls():
    created = datetime(2026, 11, 28, 12, 0, 0, tzinfo=timezone.utc)

    def at(seconds: float) -> str:
        return (created + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")

    jobs = [{"metadata": {"name": f"fit-{i}", "creationTimestamp": at(0)}} for i in range(2)]
    workloads = [{"metadata": {"name": f"mpijob-fit-{i}-x", "creationTimestamp": at(1 + i),
                               "ownerReferences": [{"kind": "MPIJob", "name": f"fit-{i}"}]},
                  "status": {"conditions": [
                      {"type": "QuotaReserved", "lastTransitionTime": at(5 + i)},
                      {"type": "Admitted", "lastTransitionTime": at(5 + i)}]}}
                 for i in range(2)]
    workloads.append({"metadata": {"name": "orphan", "creationTimestamp": at(0)}})
    t0 = created.timestamp()
    seen = {f"fit-{i}": {"unsuspended": t0 + 8 + i, "running": t0 + 10 + i} for i in range(2)}
    steps = contention.kueue_steps(_Objects(mpijobs=jobs, workloads=workloads), "fit", seen)
    assert list(steps) == ["workload_created", "QuotaReserved", "Admitted", "unsuspended",
                           "running"]
    assert steps["workload_created"] == {"p50": 1.0, "p95": 2.0}
    assert steps["QuotaReserved"] == {"p50": 5.0, "p95": 6.0}
    assert steps["running"] == {"p50": 10.0, "p95": 11.0}
    study = json.loads((REPO_ROOT / "docs" / "bench" / "contention.json").read_text())
    kueue = next(r for r in study["results"] if r["policy"] == "kueue")
    table = contention.markdown([{**kueue, "fit_kueue_steps_s": steps}], study["settings"])
    assert "- kueue: workload_created 1.0 / 2.0 s, QuotaReserved 5.0 / 6.0 s" in table


def test_repeats_give_each_policy_its_median_and_range_and_the_ratio_to_the_default_run():
    def result(policy, repeat, working, p50):
        return {"policy": policy, "repeat": repeat, "steady_working_while_backlogged": working,
                "fit_to_running_s": {"p50": p50, "p95": p50 + 1}}

    results = [result("default", 1, 0.70, 6.0), result("kueue", 1, 0.80, 12.0),
               result("default", 2, 0.74, 8.0), result("kueue", 2, 0.78, 12.0),
               result("default", 3, 0.72, 5.0), result("kueue", 3, 0.82, 15.0)]
    text = contention.spread(results)
    assert "- default, 3 runs: GPUs working 72 (70-74) %; to all workers Running p50 " \
           "6.0 (5.0-8.0) s\n" in text
    assert "- kueue, 3 runs: GPUs working 80 (78-82) %; to all workers Running p50 " \
           "12.0 (12.0-15.0) s; that over the default scheduler's 2.00 (1.50-3.00)" in text
    assert contention._label(results[1]) == "kueue (run 1)"
    assert contention.spread([{**results[0]}]) == ""  # one run: nothing to spread
