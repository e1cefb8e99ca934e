"""The contention study: a stream of MPIJobs whose demand exceeds the cluster's GPUs, run under
each admission policy on a fresh local control plane with 1,000 kwok nodes x 8 GPUs.

Policies:
- `default`: kube-scheduler places each pod on its own; workers of many jobs can hold GPUs while
  none of those jobs has all of its workers (partial placement);
- `coscheduling`: scheduler-plugins' coscheduling scheduler, mpi-operator making a PodGroup per
  MPIJob (`--gang-scheduling`): a job's workers are placed all together or not at all;
- `kueue`: Kueue admits a whole MPIJob (unsuspends it) when its ClusterQueue has quota for all of
  it; until then it waits suspended, holding nothing;
- `kueue-blocking`: the same with waitForPodsReady's `blockAdmission`: Kueue admits the next job
  only once every admitted job's pods are ready (its answer to partial placement where quota does
  not match the nodes), at the cost of admitting one job at a time;
- `kueue-tas`: Kueue's topology-aware scheduling: the kwok nodes carry rack and block labels
  (8 nodes a rack), the flavor names a Topology over them, and each job's workers prefer one
  rack; Kueue admits a job with the nodes of its pods chosen, and its pods wait behind a
  scheduling gate until it has placed them.

The stream (seeded): jobs from several namespaces, 1-16 workers x 8 GPUs (one whole node each),
each "running" for a set time once all its workers are up: the launcher (created when the workers
are ready, launcherCreationPolicy WaitForWorkersReady) carries kwok's
`pod-complete.stage.kwok.x-k8s.io/delay`, so kwok ends it after that long and mpi-operator marks
the MPIJob Succeeded and deletes its workers. Every job arrives within the first seconds; their
GPUs add up to `demand` x the cluster's.

Measured per policy, from samples of the pods every `sample_s` seconds: GPUs held by bound
workers, GPUs doing work (jobs whose launcher runs), their difference integrated over time (GPU
time held by jobs that cannot start), jobs partially placed, time to drain the stream (or the
deadlock: nothing runs, nothing changes for `stall_s`, jobs remain); then the control plane's
time from creating 100 MPIJobs that fit to all their workers Running.

    .venv/bin/python -m chexflow.bench.contention --out runs/bench-contention
writes contention.json, contention.png and contention.md there. Not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from chexflow.bench.apiserver_requests import ApiRequests
from chexflow.bench.core import machine
from chexflow.bench.cpu_account import CpuAccount
from chexflow.devcluster import addons
from chexflow.devcluster import nodes as kwok_nodes
from chexflow.devcluster.controlplane import LocalCluster

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
POLICIES = ("default", "coscheduling", "kueue", "kueue-blocking", "kueue-tas")
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"
KWOK_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
SIZES = (1, 2, 4, 8, 16)  # workers per job, one whole node (8 GPUs) each


@dataclass(frozen=True)
class PlannedJob:
    name: str
    namespace: str
    workers: int
    run_seconds: int


def plan_stream(nodes: int, gpus_per_node: int, demand: float = 1.5, namespaces: int = 4,
                run_seconds: tuple[int, int] = (30, 90), seed: int = 0) -> list[PlannedJob]:
    """Jobs until their GPUs reach `demand` x the cluster's, sizes drawn from SIZES."""
    rng = random.Random(seed)
    jobs: list[PlannedJob] = []
    gpus = 0
    while gpus < demand * nodes * gpus_per_node:
        workers = min(rng.choice(SIZES), nodes)
        jobs.append(PlannedJob(f"job-{len(jobs):04d}", f"team-{len(jobs) % namespaces}",
                               workers, rng.randint(*run_seconds)))
        gpus += workers * gpus_per_node
    return jobs


def stream_mpijob(job: PlannedJob, gpus_per_node: int, policy: str,
                  hold: bool = False) -> dict:
    """The MPIJob of `job` under `policy`: workers take a whole node's GPUs; the launcher is
    made once they are ready and kwok ends it after run_seconds (or keeps it, with `hold`)."""
    launcher_meta: dict = ({"labels": {kwok_nodes.HOLD_LABEL: "true"}} if hold else
                           {"annotations": {KWOK_DELAY: f"{job.run_seconds}s"}})

    worker_meta: dict = {}
    if policy == "kueue-tas":
        from chexflow.devcluster import kueue

        worker_meta["annotations"] = {kueue.PREFERRED_TOPOLOGY: kwok_nodes.RACK_LABEL}

    def template(role: str, meta: dict, limits: dict) -> dict:
        return {"metadata": meta,
                "spec": {"containers": [{"name": role, "image": "chexflow-trainer:bench",
                                         "resources": {"limits": limits}}]}}

    run_policy: dict = {"cleanPodPolicy": "All"}
    if policy == "coscheduling":  # the workers are the gang; the launcher comes after them
        run_policy["schedulingPolicy"] = {"minAvailable": job.workers}
    metadata: dict = {"name": job.name, "namespace": job.namespace}
    if policy.startswith("kueue"):
        from chexflow.devcluster import kueue

        metadata["labels"] = {kueue.QUEUE_LABEL: kueue.CLUSTER_QUEUE}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "MPIJob", "metadata": metadata,
        "spec": {
            "slotsPerWorker": gpus_per_node, "runPolicy": run_policy,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template(
                    "launcher", launcher_meta, {"cpu": "1"})},
                "Worker": {"replicas": job.workers, "template": template(
                    "worker", worker_meta, {kwok_nodes.GPU_RESOURCE: gpus_per_node, "cpu": "1"})},
            },
        },
    }


@dataclass
class Sample:
    t: float
    held_gpus: int  # GPUs of bound, live worker pods
    working_gpus: int  # GPUs of jobs whose launcher runs
    partial_jobs: int  # jobs with some but not all workers bound
    finished: int
    placed_jobs: int = 0  # unfinished jobs with every worker bound (running, or about to)
    demand_gpus: int = 0  # GPUs of the jobs not finished yet


def pods(list_call, *args, **query) -> list[dict]:
    """A pod list from the apiserver's watch cache (resourceVersion 0) as plain JSON: the
    client's typed models cost the bench several times the CPU, taken from the control plane
    it measures on the same cores."""
    response = list_call(*args, resource_version="0", _preload_content=False, **query)
    return json.loads(response.data)["items"]


def sample(api, plan: dict[str, PlannedJob], gpus_per_node: int, t: float) -> Sample:
    """One look at every stream job's pods and conditions."""
    from kubernetes import client

    bound: dict[str, int] = defaultdict(int)
    launcher_running: set[str] = set()
    for pod in pods(client.CoreV1Api(api).list_pod_for_all_namespaces, label_selector=ROLE_LABEL):
        labels = pod["metadata"].get("labels") or {}
        job = labels.get(JOB_LABEL)
        if job not in plan or pod["metadata"].get("deletionTimestamp"):
            continue
        phase = (pod.get("status") or {}).get("phase")
        if labels[ROLE_LABEL] == "worker" and pod["spec"].get("nodeName") \
                and phase in ("Pending", "Running"):
            bound[job] += 1
        elif labels[ROLE_LABEL] == "launcher" and phase == "Running":
            launcher_running.add(job)
    done = {item["metadata"]["name"] for item in client.CustomObjectsApi(api)
            .list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
            if item["metadata"]["name"] in plan and any(
                c["type"] == "Succeeded" and c["status"] == "True"
                for c in (item.get("status") or {}).get("conditions") or [])}
    demand = sum(j.workers for name, j in plan.items() if name not in done) * gpus_per_node
    held = sum(bound.values()) * gpus_per_node
    working = sum(plan[j].workers for j in launcher_running) * gpus_per_node
    partial = sum(1 for j, n in bound.items() if 0 < n < plan[j].workers)
    placed = sum(1 for j, n in bound.items() if n == plan[j].workers)
    return Sample(round(t, 2), held, working, partial, len(done), placed, demand)


def run_policy(policy: str, nodes: int, gpus_per_node: int, jobs: list[PlannedJob],
               sample_s: float, stall_s: float, timeout: float, fit_jobs: int,
               state_dir: Path, warm_up_s: float = 0.0, kueue_tuning: dict | None = None,
               node_lease_s: int = 40) -> dict:
    """One policy on a fresh cluster: the stream until drained or deadlocked, then the
    create-to-Running time of `fit_jobs` MPIJobs that fit. `kueue_tuning`: the Kueue add-on's
    tuning (client_qps, mpijob_concurrency) over Kueue's shipped settings; `node_lease_s`: the
    kwok nodes' lease duration."""
    from kubernetes import client

    t0 = time.monotonic()
    # a node whose lease kwok renews late on a loaded machine is not a fault being studied
    cluster = LocalCluster(state_dir, nodes=nodes, gpus_per_node=gpus_per_node,
                           die_with_parent=True, node_monitor_grace_s=600,
                           node_lease_duration_s=node_lease_s,
                           **policy_options(policy, kueue_tuning))
    with cluster:
        result: dict = {"policy": policy, "cluster_start_s": round(time.monotonic() - t0, 1)}
        api = cluster.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespaces = sorted({j.namespace for j in jobs} | {"fit"})
        for ns in namespaces:
            core.create_namespace({"metadata": {"name": ns}})
            if policy.startswith("kueue"):
                from chexflow.devcluster import kueue

                kueue.create_local_queue(api, ns)
        plan = {j.name: j for j in jobs}
        start = time.monotonic()
        with CpuAccount() as stream_cpu, ApiRequests(api) as stream_requests:
            submit(custom, [stream_mpijob(j, gpus_per_node, policy) for j in jobs])
            result["submit_s"] = round(time.monotonic() - start, 1)
            samples = watch_stream(api, cluster, plan, gpus_per_node, start, sample_s, stall_s,
                                   timeout)
        result["stream_cpu"] = stream_cpu.result | {"requests": stream_requests.result}
        result.update(summarize(samples, len(jobs), nodes * gpus_per_node, sample_s,
                                warm_up_s))
        result["samples"] = [asdict(s) for s in samples]
        if policy == "kueue-tas":
            result["workloads_with_topology_assignment"] = topology_assigned(custom)
        delete_all(custom, namespaces)
        with CpuAccount() as fit_cpu, ApiRequests(api) as fit_requests:
            fit = time_fit_jobs(api, custom, policy, fit_jobs, nodes, gpus_per_node, timeout)
        result["fit_cpu"] = fit_cpu.result | {"requests": fit_requests.result}
        result["fit_all_running_s"] = fit["all_running_s"]
        result["fit_to_admitted_s"], result["fit_to_running_s"] = (fit["to_admitted_s"],
                                                                   fit["to_running_s"])
        if policy.startswith("kueue"):
            result["fit_kueue_steps_s"] = kueue_steps(custom, "fit", fit["seen"])
        result["rate_limits"] = rate_limits(policy, kueue_tuning)
        result["utilisation_bound"] = utilisation_bound(jobs, fit["to_running_s"]["p50"])
        cluster.check()
    return result


def topology_assigned(custom) -> int:
    """Kueue Workloads whose admission placed the workers by topology (a podSetAssignment with
    a topologyAssignment): that TAS, not only quota, admitted them."""
    from chexflow.devcluster import kueue

    items = custom.list_cluster_custom_object(kueue.GROUP, kueue.VERSION, "workloads")["items"]
    return sum(1 for w in items if any(
        a.get("topologyAssignment") for a in
        ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []))


def utilisation_bound(jobs: list[PlannedJob], latency_s: float | None) -> float | None:
    """D / (D + L): the share of its GPUs' time a job can work when each job runs D seconds
    (the stream's mean) and L seconds pass from capacity being there to all its workers Running
    (the fit jobs' p50): what the control plane allows, whatever the policy's order."""
    if latency_s is None:
        return None
    d = sum(j.run_seconds for j in jobs) / len(jobs)
    return round(d / (d + latency_s), 3)


def policy_options(policy: str, kueue_tuning: dict | None = None) -> dict:
    """LocalCluster options for `policy` (the add-on it needs beside the control plane);
    `kueue_tuning`: the Kueue add-on's client_qps and mpijob_concurrency."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
    if policy.startswith("kueue"):
        from chexflow.devcluster.kueue import Kueue

        return {"addons": addons.resolve([Kueue(block_admission=policy == "kueue-blocking",
                                                topology=policy == "kueue-tas",
                                                **(kueue_tuning or {}))])}
    return {"addons": addons.named([] if policy == "default" else [policy])}


def submit(custom, objects: list[dict]) -> dict[str, float]:
    """Create the MPIJobs (8 at a time); each one's time.monotonic() once its create returned."""

    def create(o: dict) -> tuple[str, float]:
        custom.create_namespaced_custom_object(GROUP, VERSION, o["metadata"]["namespace"],
                                               PLURAL, o)
        return o["metadata"]["name"], time.monotonic()

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(create, objects))


def watch_stream(api, cluster: LocalCluster, plan: dict[str, PlannedJob], gpus_per_node: int,
                 start: float, sample_s: float, stall_s: float, timeout: float) -> list[Sample]:
    """Samples until every job finished, or deadlock: for stall_s nothing changed, nothing
    runs and no job has all its workers placed (one that has will start: the simulator's
    readiness and the launcher lag behind on a loaded machine, they are not stuck)."""
    samples: list[Sample] = []
    last_change = start
    while True:
        s = sample(api, plan, gpus_per_node, time.monotonic() - start)
        if samples and (s.held_gpus, s.working_gpus, s.finished) != (
                samples[-1].held_gpus, samples[-1].working_gpus, samples[-1].finished):
            last_change = time.monotonic()
        samples.append(s)
        print(f"  {s.t:7.1f} s  finished {s.finished:4d}/{len(plan)}  GPUs held {s.held_gpus:5d}"
              f"  working {s.working_gpus:5d}  jobs placed {s.placed_jobs:3d}, partly placed "
              f"{s.partial_jobs:3d}", flush=True)
        if s.finished == len(plan):
            return samples
        if s.working_gpus == 0 and s.placed_jobs == 0 \
                and time.monotonic() - last_change >= stall_s:
            return samples  # deadlocked: summarize reports it
        if time.monotonic() - start > timeout:
            return samples
        cluster.check()
        time.sleep(sample_s)


def summarize(samples: list[Sample], jobs: int, capacity: int, sample_s: float,
              warm_up_s: float = 0.0) -> dict:
    """The figures of one policy's stream; the steady-state shares are those while demand
    exceeds the GPUs after the first `warm_up_s` seconds (the first wave's placement)."""
    last = samples[-1]
    idle_held = sum((b.t - a.t) * (a.held_gpus - a.working_gpus)
                    for a, b in zip(samples, samples[1:], strict=False))
    busy = [s for s in samples if s.demand_gpus >= capacity]  # demand exceeds the GPUs
    steady = [s for s in busy if s.t >= warm_up_s]
    drained = last.finished == jobs
    return {
        "jobs": jobs, "finished": last.finished, "drained": drained,
        "drain_s": last.t if drained else None,
        "deadlocked_jobs": 0 if drained else last.partial_jobs,
        "stalled_with_gpus_held": 0 if drained else last.held_gpus,
        "max_partial_jobs": max(s.partial_jobs for s in samples),
        "gpu_seconds_held_by_jobs_not_running": round(idle_held),
        "seconds_demand_exceeded_capacity": round(sum(
            b.t - a.t for a, b in zip(samples, samples[1:], strict=False)
            if a.demand_gpus >= capacity)),
        "mean_utilisation_while_backlogged": round(
            sum(s.working_gpus for s in busy) / (len(busy) * capacity), 3) if busy else None,
        "mean_held_while_backlogged": round(
            sum(s.held_gpus for s in busy) / (len(busy) * capacity), 3) if busy else None,
        "warm_up_s": warm_up_s,
        "steady_working_while_backlogged": round(
            sum(s.working_gpus for s in steady) / (len(steady) * capacity), 3) if steady else None,
        "steady_held_while_backlogged": round(
            sum(s.held_gpus for s in steady) / (len(steady) * capacity), 3) if steady else None,
    }


def delete_all(custom, namespaces: list[str], timeout: float = 300) -> None:
    """Delete every MPIJob of the stream and wait until their pods are gone."""
    from kubernetes import client

    for ns in namespaces:
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    core = client.CoreV1Api(custom.api_client)
    deadline = time.monotonic() + timeout
    while core.list_pod_for_all_namespaces(label_selector=ROLE_LABEL, limit=1).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"MPIJob pods still there {timeout:.0f} s after deleting them")
        time.sleep(1)


def percentiles(values: list[float]) -> dict:
    """p50 and p95 (nearest rank) of `values`, in seconds to 0.1 s."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p95": None}
    return {f"p{q}": round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 1)
            for q in (50, 95)}


def time_fit_jobs(api, custom, policy: str, count: int, nodes: int, gpus_per_node: int,
                  timeout: float) -> dict:
    """`count` 4-worker MPIJobs that all fit (launchers kept running), created at once: seconds
    until every worker is Running, and per job, from its create call, p50/p95 to admission
    (Kueue unsuspending it; the other policies admit on creation) and to all its workers
    Running: the control plane's latency L when capacity is there. Polled every 0.5 s once all
    are created, so a time is an upper bound by the poll and, for a job done while the others
    were still being created, by the rest of the submission. `seen`: per job, the wall-clock
    times it was seen unsuspended and Running (kueue_steps reads them)."""
    from kubernetes import client

    workers = max(1, min(4, nodes * gpus_per_node // (count * gpus_per_node)))
    jobs = [PlannedJob(f"fit-{i:04d}", "fit", workers, 0) for i in range(count)]
    core = client.CoreV1Api(api)
    start = time.monotonic()
    created = submit(custom, [stream_mpijob(j, gpus_per_node, policy, hold=True) for j in jobs])
    admitted: dict[str, float] = {} if policy.startswith("kueue") else dict(created)
    running: dict[str, float] = {}
    wall = time.time() - time.monotonic()  # monotonic + wall: the apiserver's clock
    while len(running) < count:
        now = time.monotonic()
        per_job: dict[str, int] = defaultdict(int)
        for pod in pods(core.list_namespaced_pod, "fit", label_selector=f"{ROLE_LABEL}=worker"):
            if (pod.get("status") or {}).get("phase") == "Running" \
                    and not pod["metadata"].get("deletionTimestamp"):
                per_job[pod["metadata"]["labels"][JOB_LABEL]] += 1
        running |= {j: now for j, n in per_job.items() if n >= workers and j not in running}
        if len(admitted) < count:
            for item in custom.list_namespaced_custom_object(GROUP, VERSION, "fit",
                                                             PLURAL)["items"]:
                name = item["metadata"]["name"]
                if name not in admitted and not item["spec"].get("runPolicy", {}).get("suspend"):
                    admitted[name] = now
        if now - start > timeout:
            raise TimeoutError(f"{len(running)}/{count} MPIJobs with all workers Running after "
                               f"{timeout} s")
        time.sleep(0.5)
    return {"all_running_s": round(max(running.values()) - start, 1),
            "to_admitted_s": percentiles([admitted[j] - created[j] for j in admitted]),
            "to_running_s": percentiles([running[j] - created[j] for j in running]),
            "seen": {j: {"unsuspended": admitted[j] + wall, "running": running[j] + wall}
                     for j in running}}


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def kueue_steps(custom, namespace: str, seen: dict[str, dict[str, float]]) -> dict:
    """Where Kueue's admission latency goes: per MPIJob, seconds from its creationTimestamp
    to its Workload's creation (Kueue's MPIJob controller), QuotaReserved (Kueue's scheduler),
    Admitted, then the MPIJob seen unsuspended (the MPIJob controller again) and all its workers
    seen Running (mpi-operator, kube-scheduler, kwok), as p50/p95 of each step's cumulative
    time. The apiserver's times have 1 s resolution; `seen` are this process's polls (wall
    clock, the same machine's)."""
    from chexflow.devcluster import kueue

    jobs = {j["metadata"]["name"]: _stamp(j["metadata"]["creationTimestamp"]) for j in
            custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]}
    steps: dict[str, list[float]] = defaultdict(list)
    for w in custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace,
                                                  "workloads")["items"]:
        owner = next((o["name"] for o in w["metadata"].get("ownerReferences", [])
                      if o["kind"] == "MPIJob"), None)
        if owner not in jobs or owner not in seen:
            continue
        created = jobs[owner]
        conditions = {c["type"]: _stamp(c["lastTransitionTime"])
                      for c in (w.get("status") or {}).get("conditions", [])}
        steps["workload_created"].append(_stamp(w["metadata"]["creationTimestamp"]) - created)
        for step in ("QuotaReserved", "Admitted"):
            if step in conditions:
                steps[step].append(conditions[step] - created)
        for step, t in seen[owner].items():
            steps[step].append(t - created)
    order = ("workload_created", "QuotaReserved", "Admitted", "unsuspended", "running")
    return {step: percentiles(steps[step]) for step in order if steps[step]}


def rate_limits(policy: str, kueue_tuning: dict | None = None) -> dict:
    """The API clients' rate limits (qps, burst) of the controllers `policy` runs, and the
    apiserver's request limits: what the latencies were measured under."""
    from chexflow.devcluster import controlplane, coscheduling

    client = {"qps": controlplane.CLIENT_QPS, "burst": controlplane.CLIENT_BURST}
    limits = {"apiserver": controlplane.APISERVER_LIMITS,
              "kube-scheduler": client, "kube-controller-manager": client,
              "mpi-operator": {**client, "queue": controlplane.MPI_OPERATOR_QUEUE}}
    if policy == "coscheduling":
        limits |= {"coscheduling scheduler": coscheduling.SCHEDULER_CLIENT,
                   "podgroup controller": coscheduling.CONTROLLER_CLIENT}
    if policy.startswith("kueue"):
        (addon,) = policy_options(policy, kueue_tuning)["addons"]
        limits["kueue"] = {**addon.client(), "groupKindConcurrency": addon.concurrency(),
                           "blockAdmission": addon.block_admission,
                           "topologyAwareScheduling": addon.topology}
    return limits


def write_report(results: list[dict], settings: dict, out: Path) -> None:
    """contention.json, contention.png (GPUs working and held over time per policy) and
    contention.md (the table) in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "contention.json").write_text(json.dumps(
        {"settings": settings, "machine": machine(), "results": results}, indent=2) + "\n")
    capacity = settings["nodes"] * settings["gpus_per_node"]
    fig, axes = plt.subplots(len(results), 1, figsize=(7, 2.4 * len(results)), sharex=True,
                             squeeze=False)
    for ax, r in zip(axes[:, 0], results, strict=True):
        ts = [s["t"] for s in r["samples"]]
        ax.plot(ts, [s["working_gpus"] / capacity for s in r["samples"]], label="working")
        ax.plot(ts, [s["held_gpus"] / capacity for s in r["samples"]], label="held", ls="--")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("share of GPUs")
        ax.set_title(f"{_label(r)}: " + (f"drained in {r['drain_s']:.0f} s" if r["drained"]
                     else f"deadlocked, {r['deadlocked_jobs']} jobs partly placed"), fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
    axes[-1, 0].set_xlabel("seconds since the stream was submitted")
    fig.tight_layout()
    fig.savefig(out / "contention.png", dpi=120)
    plt.close(fig)
    (out / "contention.md").write_text(markdown(results, settings))


def _seconds(p: dict | None) -> str:
    return "-" if not p or p.get("p50") is None else f"{p['p50']:.1f} / {p['p95']:.1f} s"


def markdown(results: list[dict], settings: dict) -> str:
    after = " (after warm-up)" if "warm_up_s" in settings else ""
    head = ("| policy | drained in | jobs deadlocked (partly placed) | GPU-hours held by jobs not "
            f"running | GPUs working while demand exceeds them{after} | GPUs held "
            "meanwhile | fitting MPIJob: create to admitted, p50 / p95 | to all workers "
            "Running, p50 / p95 | bound D/(D+L) | "
            f"{settings['fit_jobs']} fitting MPIJobs: create to all workers Running |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    rows = ""
    for r in results:
        cells = [_label(r), f"{r['drain_s']:.0f} s" if r["drained"] else "never",
                 str(r["deadlocked_jobs"]),
                 f"{r['gpu_seconds_held_by_jobs_not_running'] / 3600:.1f}",
                 share(r.get("steady_working_while_backlogged",
                             r["mean_utilisation_while_backlogged"])),
                 share(r.get("steady_held_while_backlogged", r["mean_held_while_backlogged"])),
                 _seconds(r.get("fit_to_admitted_s")), _seconds(r.get("fit_to_running_s")),
                 share(r.get("utilisation_bound")), f"{r['fit_all_running_s']:.1f} s"]
        rows += "| " + " | ".join(cells) + " |\n"
    stated, shown = "", {}
    for r in results:  # each policy's limits, those already shown left out
        new = {k: v for k, v in (r.get("rate_limits") or {}).items() if shown.get(k) != v}
        if new:
            stated += (f"\n- {r['policy']}: " + "; ".join(f"{k} {v}" for k, v in new.items()))
        shown |= new
    if stated:
        stated = "\nAPI clients' rate limits and the apiserver's limits:\n" + stated + "\n"
    steps = "".join(
        f"\n- {_label(r)}: " + ", ".join(f"{name} {_seconds(p)}" for name, p in
                                          r["fit_kueue_steps_s"].items())
        for r in results if r.get("fit_kueue_steps_s"))
    if steps:
        steps = ("\nA fitting MPIJob's way through Kueue, seconds from its creation (p50 / p95; "
                 "the apiserver's times to 1 s):\n" + steps + "\n")
    return (f"{settings['jobs']} MPIJobs ({settings['demand']:.0%} of {settings['nodes']} kwok "
            f"nodes x {settings['gpus_per_node']} GPUs), job run times "
            f"{settings['run_seconds'][0]}-{settings['run_seconds'][1]} s, seed "
            f"{settings['seed']}" + (f", warm-up {settings['warm_up_s']:g} s" if after else "")
            + f", node leases of {settings.get('node_lease_s', 40)} s"
            + ":\n\n"
            + head + rows + spread(results) + stated + steps + cpu_lines(results, settings))


def _label(result: dict) -> str:
    return f"{result['policy']} (run {result['repeat']})" if "repeat" in result \
        else result["policy"]


def _median_range(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def spread(results: list[dict]) -> str:
    """With repeats: per policy, the median and range over the runs of GPUs working (after
    warm-up) and of the p50 from creation to all workers Running, and that p50 over the default
    scheduler's of the same run (the policies of a run are interleaved: same machine state)."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        if "repeat" in r:
            runs[r["policy"]].append(r)
    if not any(len(v) > 1 for v in runs.values()):
        return ""
    default = {r["repeat"]: r["fit_to_running_s"]["p50"] for r in runs.get("default", [])}
    lines = ""
    for policy, rs in runs.items():
        working = [r.get("steady_working_while_backlogged") for r in rs]
        latency = [r["fit_to_running_s"]["p50"] for r in rs]
        ratio = [r["fit_to_running_s"]["p50"] / default[r["repeat"]] for r in rs
                 if default.get(r["repeat"]) and r["fit_to_running_s"]["p50"] is not None]
        cells = [f"GPUs working {_median_range([w * 100 for w in working], '.0f')} %"
                 if None not in working else "",
                 f"to all workers Running p50 {_median_range(latency, '.1f')} s"
                 if None not in latency else "",
                 f"that over the default scheduler's {_median_range(ratio, '.2f')}"
                 if ratio and policy != "default" else ""]
        lines += f"\n- {policy}, {len(rs)} runs: " + "; ".join(c for c in cells if c)
    return ("\nMedian (range) over the runs, each run's policies one after another on the same "
            "machine:\n" + lines + "\n")


def cpu_lines(results: list[dict], settings: dict, programs: int = 5) -> str:
    """Per policy, how busy the machine was in each phase, the programs that used most of it
    and the requests the apiserver served most: whether a latency is the policy's or the
    machine's."""
    def phase(cpu: dict) -> str:
        top = list(cpu["programs_cpu_s"].items())[:programs]
        requests = list(cpu.get("requests", {}).items())[:programs]
        return (f"{cpu['machine_busy']:.0%} of {cpu['cores']} cores busy over "
                f"{cpu['wall_s']:.0f} s (" + ", ".join(f"{n} {s:.0f}" for n, s in top)
                + f", the bench's client {cpu['bench_client_cpu_s']:.0f} core-s)"
                + ("; the apiserver served " + ", ".join(f"{k} {n}" for k, n in requests)
                   if requests else ""))

    lines = "".join(
        f"\n- {_label(r)}: the stream {phase(r['stream_cpu'])}; the {settings['fit_jobs']} "
        f"fitting MPIJobs {phase(r['fit_cpu'])}"
        for r in results if r.get("stream_cpu") and r.get("fit_cpu"))
    return ("\nThe machine's CPU, per phase (core-seconds of the programs that used most):\n"
            + lines + "\n") if lines else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--demand", type=float, default=1.5,
                   help="the stream's GPUs over the cluster's (default 1.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-seconds", type=int, nargs=2, default=(30, 90), metavar=("MIN", "MAX"),
                   help="each job runs for a time drawn from MIN..MAX once its workers are up")
    p.add_argument("--sample-s", type=float, default=2.0)
    p.add_argument("--stall-s", type=float, default=45.0,
                   help="nothing running nor changing this long, jobs left: deadlock")
    p.add_argument("--fit-jobs", type=int, default=100)
    p.add_argument("--kueue-qps", type=int,
                   help="Kueue's API client qps, burst twice it (default: its manifests' "
                   "clientConnection, 300/500)")
    p.add_argument("--kueue-mpijob-concurrency", type=int,
                   help="concurrent reconciles of Kueue's MPIJob controller (default: 1, as "
                   "Kueue's manifests leave it)")
    p.add_argument("--warm-up-s", type=float,
                   help="steady-state shares leave out the first seconds (default: the longest "
                   "run time, the first wave's placement and first ends)")
    p.add_argument("--node-lease-s", type=int, default=40,
                   help="the kwok nodes' lease duration, renewed every quarter of it (default: "
                   "the kubelet's 40 s; the node lifecycle controller's grace here is 600 s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the policies in turn this many times (median and range reported)")
    p.add_argument("--timeout", type=float, default=1800)
    a = p.parse_args(argv)
    jobs = plan_stream(a.nodes, a.gpus_per_node, a.demand, run_seconds=tuple(a.run_seconds),
                       seed=a.seed)
    warm_up = a.run_seconds[1] if a.warm_up_s is None else a.warm_up_s
    settings = {"nodes": a.nodes, "gpus_per_node": a.gpus_per_node, "demand": a.demand,
                "seed": a.seed, "jobs": len(jobs), "fit_jobs": a.fit_jobs,
                "run_seconds": list(a.run_seconds),
                "sizes": SIZES, "stall_s": a.stall_s, "warm_up_s": warm_up,
                "node_lease_s": a.node_lease_s}
    if a.repeats > 1:
        settings["repeats"] = a.repeats
    results = []
    for repeat in range(1, a.repeats + 1):
        for policy in a.policies:
            print(f"{policy}: {len(jobs)} MPIJobs on {a.nodes} nodes"
                  + (f", run {repeat}/{a.repeats}" if a.repeats > 1 else ""), flush=True)
            with tempfile.TemporaryDirectory(prefix=f"chexflow-contention-{policy}-") as tmp:
                result = run_policy(policy, a.nodes, a.gpus_per_node, jobs, a.sample_s,
                                    a.stall_s, a.timeout, a.fit_jobs, Path(tmp), warm_up,
                                    {"client_qps": a.kueue_qps,
                                     "mpijob_concurrency": a.kueue_mpijob_concurrency},
                                    a.node_lease_s)
            results.append(result | ({"repeat": repeat} if a.repeats > 1 else {}))
            write_report(results, settings, a.out)
    print((a.out / "contention.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
