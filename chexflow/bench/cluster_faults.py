"""`chexflow bench --only cluster-faults`: the fault table docs/bench/cluster-faults.json holds.

An MPIJob (one worker pod and its launcher on a local cluster's real node, DenseNet-121 at
64 px) trains while etcd, kube-apiserver, kube-scheduler, mpi-operator, the kubelet and
containerd are SIGKILLed one at a time (the cluster's supervisor restarts each:
chexflow.devcluster.faults), each once an epoch has been checkpointed since the previous one was
healthy again, so no epoch is touched by two faults. The rank runs `chexflow train`, then waits
for a file written once the last fault is over: the job cannot end before the faults, whatever
the machine's speed (a fault that comes after the last epoch falls in that wait, and its row
has no epoch).

Per fault: seconds until the process was restarted and until healthy, the job's pods replaced
or restarted, other processes restarted with it, and the seconds lost: the epochs running
between the kill and its health, beyond as many median epochs that no fault touched (the faults
start once BASELINE_EPOCHS epochs are checkpointed, so there are always some).
tests/cluster/test_cluster_faults_table.py runs the same job under the same faults and asserts
behaviour only: the job ends Succeeded, with every epoch in a whole metrics.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chexflow.devcluster.faults import CONTROL_PLANE, kill_component, restarts, retry
from chexflow.errors import ChexflowError
from chexflow.jobs import JobSpec, Volume
from chexflow.jobs.render import (
    JOB_NAME_LABEL,
    MPIJOB_GROUP,
    MPIJOB_PLURAL,
    MPIJOB_VERSION,
    render_mpijob,
)

JOB = "faults"
EPOCHS = 12
BASELINE_EPOCHS = 3  # checkpointed before the first fault: epochs 2 and 3 are fault-free
MOUNT = "/data"
GATE = "faults-done"  # in the job's folder on the claim: the rank's wait ends once it exists
JOB_DEADLINE_S = 1800


class FaultRunError(ChexflowError):
    """The job under faults did not start or end as expected."""


@dataclass
class FaultRun:
    """What happened: one row per fault, when each epoch's checkpoint appeared (monotonic
    seconds), the job's end, its launcher's log."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    epoch_ends: dict[int, float] = field(default_factory=dict)
    condition: dict[str, Any] | None = None
    job_seconds: float = 0.0
    launcher_log: str = ""


def rank_command(data: str, out: str, gate: str, epochs: int) -> list[str]:
    """`chexflow train` on one rank, then a wait until `gate` exists."""
    train = ["chexflow", "train", "--launcher", "none", "--data", data, "--out", out,
             "--model", "densenet121", "--image-size", "64", "--epochs", str(epochs),
             "--steps-per-epoch", "4", "--batch-size", "4", "--threads", "1"]
    return ["sh", "-c", f"{shlex.join(train)} && until [ -e {shlex.quote(gate)} ]; do "
                        f"sleep 1; done"]


def render_job(namespace: str, image: str, claim: str, epochs: int) -> dict[str, Any]:
    """The MPIJob: one worker (750m, 3Gi) of the trainer image, the claim at MOUNT holding
    tfrecords/; the run goes to MOUNT/run."""
    command = rank_command(f"{MOUNT}/tfrecords", f"{MOUNT}/run", f"{MOUNT}/{GATE}", epochs)
    spec = JobSpec(name=JOB, command=command, horovod=True, workers=1, cpu="750m",
                   memory="3Gi", volumes=[Volume(claim, MOUNT)], timeout_seconds=JOB_DEADLINE_S)
    return render_mpijob(spec, namespace, image=image)


def _job_pods(core, ns: str) -> dict[str, tuple[str, int]]:
    """The job's pods: name -> (uid, container restarts)."""
    pods = core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME_LABEL}={JOB}")
    return {p.metadata.name: (p.metadata.uid, sum(c.restart_count for c in
                                                  p.status.container_statuses or []))
            for p in pods.items}


def _condition(custom, ns: str) -> dict | None:
    job = custom.get_namespaced_custom_object(MPIJOB_GROUP, MPIJOB_VERSION, ns, MPIJOB_PLURAL,
                                              JOB)
    for cond in job.get("status", {}).get("conditions", []):
        if cond["type"] in ("Succeeded", "Failed") and cond["status"] == "True":
            return cond
    return None


@contextlib.contextmanager
def _epochs(state: Path) -> Iterator[dict[int, float]]:
    """When each epoch's checkpoint appeared (state.json's epoch, polled every 0.1 s)."""
    ends: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):
                ends.setdefault(json.loads(state.read_text())["epoch"], time.monotonic())
            time.sleep(0.1)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield ends
    finally:
        stop.set()
        thread.join()


def _wait(what: str, check, timeout: float, still_running) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        cond = still_running()
        if cond is not None:
            raise FaultRunError(f"the MPIJob ended ({cond.get('type')}: {cond.get('reason')}) "
                                f"while waiting for {what}")
        if time.monotonic() > deadline:
            raise FaultRunError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.5)


def train_under_faults(state_dir: Path, api, namespace: str, shared: Path, claim: str,
                       image: str, epochs: int = EPOCHS, baseline: int = BASELINE_EPOCHS,
                       faults: tuple[str, ...] = CONTROL_PLANE) -> FaultRun:
    """Run the job in `namespace` (its pods on the real node; `claim` is the host folder
    `shared`, holding tfrecords/) under the supervisor, SIGKILL each of `faults` once
    `baseline` epochs are checkpointed, each once an epoch was checkpointed after the previous
    fault was healthy (or training is over), then let the job end; return what happened."""
    from kubernetes import client

    from chexflow.devcluster.controlplane import LocalCluster

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    (shared / GATE).unlink(missing_ok=True)
    shutil.rmtree(shared / "run", ignore_errors=True)  # an earlier run would be resumed
    run, found = FaultRun(), shared / "run"
    supervisor = LocalCluster.attach(state_dir).start_supervisor()
    try:
        start = time.monotonic()
        custom.create_namespaced_custom_object(MPIJOB_GROUP, MPIJOB_VERSION, namespace,
                                               MPIJOB_PLURAL,
                                               render_job(namespace, image, claim, epochs))
        with _epochs(found / "checkpoints" / "state.json") as ends:
            def done(epoch: int):
                return lambda: max(ends, default=0) >= epoch or (found / "metrics.json").exists()

            def running():
                return retry(lambda: _condition(custom, namespace))

            _wait(f"{baseline} epoch(s) checkpointed", done(baseline), 1200, running)
            for name in faults:
                before = retry(lambda: _job_pods(core, namespace))
                counts = restarts(state_dir)
                killed_at = time.monotonic()
                restarted, healthy = kill_component(state_dir, name)
                # the next fault falls in an epoch that began once this one was over
                _wait(f"an epoch after the {name} fault", done(max(ends, default=0) + 1), 600,
                      running)
                after = retry(lambda: _job_pods(core, namespace))
                run.rows.append({
                    "fault": name, "at": killed_at, "back": killed_at + healthy,
                    "restarted_after_s": round(restarted, 1),
                    "healthy_after_s": round(healthy, 1),
                    "job_pods_replaced_or_restarted": sorted(
                        p for p in before if after.get(p) != before[p]),
                    "also_restarted": [n for n, c in restarts(state_dir).items()
                                       if n != name and c > counts.get(n, 0)]})
            (shared / GATE).write_text("")
            deadline = time.monotonic() + JOB_DEADLINE_S
            while (cond := retry(lambda: _condition(custom, namespace))) is None:
                if time.monotonic() > deadline:
                    raise FaultRunError(f"the MPIJob did not end in {JOB_DEADLINE_S} s")
                time.sleep(2)
            run.condition, run.job_seconds = cond, time.monotonic() - start
            run.epoch_ends = dict(ends)
    finally:
        os.kill(supervisor, signal.SIGTERM)
        os.waitpid(supervisor, 0)
    launcher = next((p for p in _job_pods(core, namespace) if "launcher" in p), None)
    if launcher:
        run.launcher_log = core.read_namespaced_pod_log(launcher, namespace)
    return run


def table(run: FaultRun) -> dict[str, Any]:
    """The fault rows with the epochs each fault touched (those running between the kill and
    the component's health) and its seconds lost: their time beyond as many median fault-free
    epochs (None when it fell after the last epoch)."""
    ends = run.epoch_ends
    took = {e: ends[e] - ends[e - 1] for e in ends if e - 1 in ends}
    touched = {row["fault"]: [e for e in took if ends[e - 1] < row["back"] and
                              ends[e] >= row["at"]] for row in run.rows}
    clean = [t for e, t in took.items() if not any(e in hit for hit in touched.values())]
    median = statistics.median(clean) if clean else None
    rows = []
    for row in run.rows:
        hit = touched[row["fault"]]
        seconds = sum(took[e] for e in hit)
        rows.append({**{k: v for k, v in row.items() if k not in ("at", "back")},
                     "during_epochs": hit, "epoch_seconds": round(seconds, 1) if hit else None,
                     "seconds_lost": round(seconds - median * len(hit), 1)
                     if hit and median is not None else None})
    return {"median_fault_free_epoch_s": None if median is None else round(median, 1),
            "fault_free_epochs": len(clean), "faults": rows}


def _git_commit() -> str:
    from chexflow.envs import REPO_ROOT

    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                          capture_output=True, text=True).stdout.strip()


def run(work: Path, data: Path, out: Path, epochs: int = EPOCHS,
        kubeconfig: Path | None = None) -> Path:
    """The benchmark on `data` (64 px TFRecords) on a cluster of its own with a real node (or
    the running one of `kubeconfig`, whose state folder must be its folder): writes
    out/cluster-faults.json."""
    from chexflow.bench import real_pods

    shared = real_pods.shared_folder(work, data)
    load = round(os.getloadavg()[0], 1)
    with real_pods.cluster(work, kubeconfig) as (api, state_dir, setup):
        image, image_setup = real_pods.load_trainer_image(state_dir)
        with real_pods.namespace(api, shared) as ns:
            result = train_under_faults(state_dir, api, ns, shared, "data", image, epochs)
    doc = {"command": "chexflow bench --only cluster-faults",
           "measured": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
           "load_average_1m": load, "cores": os.cpu_count(), "commit": _git_commit(),
           "job": {"kind": "MPIJob, 1 worker, DenseNet-121 64 px", "epochs": epochs,
                   "outcome": (result.condition or {}).get("type"),
                   "seconds": round(result.job_seconds)},
           "setup": {**setup, **image_setup}, **table(result)}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cluster-faults.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
