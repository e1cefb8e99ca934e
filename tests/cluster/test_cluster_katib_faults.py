"""Fault injection on the Katib cluster while an Experiment runs (`chexflow tune --cluster`):
the main process of katib-controller, katib-db-manager, katib-mysql and the Experiment's
suggestion pod is SIGKILLed on the node, one at a time, as a crash of that process would; the
kubelet restarts each container. The Experiment must end (Succeeded, or Failed with Katib's
reason), every Trial must be one the suggestion gave (same name, same assignments, none twice,
none missing), and each trial's observation log in db-manager must hold exactly the reports the
trial printed (none lost, none twice). The table (fault, seconds until the container ran again
and its pod was Ready, the trials in flight and what became of them, and the seconds those
trials took beyond the fault-free ones) is written beside the test's data (to
docs/cluster-faults-katib.json, which docs/local-cluster.md quotes, with
CHEXFLOW_RECORD_FAULT_TABLE=1)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from datetime import datetime

import pytest
import yaml

from chexflow.devcluster.katib import NAMESPACE
from chexflow.devcluster.realnode import RealNode
from chexflow.envs import REPO_ROOT
from tests.cluster.test_cluster_katib_tune import _job_spec
from tests.conftest import CHEXFLOW

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

FAULTS = ("katib-controller", "katib-db-manager", "katib-mysql", "suggestion")
EPOCHS = 4  # reports per trial: val_auroc=0.1 .. 0.4, one every 3 s
TRIALS, PARALLEL = 16, 2
TABLE = REPO_ROOT / "docs" / "cluster-faults-katib.json"


def _spec(name: str, image: str) -> dict:
    """The one-trial Job Experiment of the Katib tests, as TRIALS trials, PARALLEL at a time, of
    chexflow's multivariate-tpe, each printing EPOCHS reports 3 s apart (the first after 3 s)."""
    script = (f'echo "lr=${{trialParameters.lr}}"; for e in $(seq 1 {EPOCHS}); do sleep 3; '
              'echo "epoch=$e val_auroc=0.$e"; done')
    spec = _job_spec(name, image, script, pause=0)
    spec["spec"].update(algorithm={"algorithmName": "multivariate-tpe"},
                        parallelTrialCount=PARALLEL, maxTrialCount=TRIALS,
                        maxFailedTrialCount=TRIALS)
    return spec


def _pod(core, fault: str, ns: str, exp: str):
    """The one running pod of the component (the suggestion: the Experiment's)."""
    if fault == "suggestion":
        where, selector = ns, f"katib.kubeflow.org/suggestion={exp}"
    else:
        where, selector = NAMESPACE, f"katib.kubeflow.org/component={fault.split('-', 1)[1]}"
    pods = [p for p in core.list_namespaced_pod(where, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]
    assert len(pods) == 1, (fault, [p.metadata.name for p in pods])
    return pods[0]


def _main_pid(node: RealNode, pod) -> tuple[str, int]:
    """The pod's first container: its containerd id and its main process's host pid."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    for line in node.ctr("task", "ls").stdout.splitlines()[1:]:
        task, pid, status = line.split()
        if task == cid and status == "RUNNING":
            return cid, int(pid)
    raise AssertionError(f"no running task for {pod.metadata.name} ({cid})")


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _kill_and_recover(core, node: RealNode, fault: str, ns: str, exp: str,
                      timeout: float = 300) -> tuple[float, float, str]:
    """SIGKILL the component's main process; seconds until its container ran again (a new
    containerd task, restartCount up) and until the pod was Ready; the pod's name."""
    pod = _pod(core, fault, ns, exp)
    cid, pid = _main_pid(node, pod)
    restarts = pod.status.container_statuses[0].restart_count
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    running = None
    while time.monotonic() - start < timeout:
        pod = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        status = pod.status.container_statuses[0]
        if running is None and status.restart_count > restarts and status.state.running:
            assert status.container_id.split("://", 1)[1] != cid
            running = time.monotonic() - start
        if running is not None and _ready(pod):
            return running, time.monotonic() - start, pod.metadata.name
        time.sleep(0.5)
    raise AssertionError(f"{fault}: pod {pod.metadata.name} not Ready {timeout:.0f} s after "
                         f"SIGKILL (container running again after {running} s)")


def _trials(custom, ns: str, exp: str) -> list[dict]:
    return custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "trials",
        label_selector=f"katib.kubeflow.org/experiment={exp}")["items"]


def _stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def _in_flight(custom, ns: str, exp: str) -> list[str]:
    return sorted(t["metadata"]["name"] for t in _trials(custom, ns, exp)
                  if not (t.get("status") or {}).get("completionTime"))


@pytest.mark.timeout(2400)
def test_an_experiment_survives_katibs_controller_db_manager_mysql_and_suggestion_sigkilled(
        katib_cluster, katib_namespace, katib_base_image, tmp_path):
    from kubernetes import client

    ns, name = katib_namespace, f"faults-{katib_namespace[-5:]}"
    api = katib_cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = RealNode(katib_cluster.state_dir)
    spec, state = tmp_path / "spec.yaml", tmp_path / "state"
    spec.write_text(yaml.safe_dump(_spec(name, katib_base_image)))
    started = time.time()
    tune = subprocess.Popen(
        [*CHEXFLOW, "tune", str(spec), "--cluster", "--namespace", ns, "--state", str(state),
         "--poll-interval", "3", "--timeout", "1800"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "KUBECONFIG": str(katib_cluster.kubeconfig)})
    rows = []
    try:
        deadline = time.monotonic() + 600
        while not any((t.get("status") or {}).get("startTime")
                      for t in _trials(custom, ns, name)):  # a trial runs: the sweep is on
            assert tune.poll() is None and time.monotonic() < deadline, tune.poll()
            time.sleep(1)
        for fault in FAULTS:
            flight = _in_flight(custom, ns, name)
            killed_at = time.time()
            running, ready, pod = _kill_and_recover(core, node, fault, ns, name)
            rows.append({"fault": fault, "pod": pod, "at": killed_at,
                         "running_again_after_s": round(running, 1),
                         "ready_after_s": round(ready, 1), "trials_in_flight": flight})
            assert tune.poll() is None, f"the Experiment ended during the {fault} fault: {rows}"
            time.sleep(5)  # trials go on between two faults
        out, _ = tune.communicate(timeout=1800)
    finally:
        if tune.poll() is None:
            tune.kill()
            tune.wait()
    results = json.loads((state / "results.json").read_text())
    cond = results["condition"]
    assert tune.returncode == (0 if cond["type"] == "Succeeded" else 1), out
    assert cond["type"] == "Succeeded" or cond.get("message"), cond

    # no trial lost or duplicated: the Trials are exactly the suggestions Katib's service gave
    suggestion = custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", ns,
                                                     "suggestions", name)
    given = {s["name"]: {a["name"]: a["value"] for a in s["parameterAssignments"]}
             for s in suggestion["status"]["suggestions"]}
    trials = _trials(custom, ns, name)
    ran = {t["metadata"]["name"]: {a["name"]: a["value"]
                                   for a in t["spec"]["parameterAssignments"]} for t in trials}
    assert ran == given, (ran, given)
    assert len(ran) == TRIALS and len({v["lr"] for v in ran.values()}) == TRIALS
    # no half-written result: each trial's observation log holds its reports, once each
    logs = json.loads((state / "observation-logs.json").read_text())
    statuses = {t["trial"]: t["status"] for t in results["trials"]}
    for trial, status in statuses.items():
        values = [float(m["value"]) for m in logs[trial]["val_auroc"]]
        if status == "Succeeded":
            assert values == [e / 10 for e in range(1, EPOCHS + 1)], (trial, values)
        else:  # a report that did not reach db-manager: none, not a part
            assert values in ([], [e / 10 for e in range(1, EPOCHS + 1)]), (trial, values)

    # seconds lost: the trials in flight at a fault against the trials no fault touched
    took = {t["metadata"]["name"]: _stamp(t["status"].get("completionTime"))
            - _stamp(t["metadata"]["creationTimestamp"]) for t in trials
            if t["status"].get("completionTime")}
    touched = {n for r in rows for n in r["trials_in_flight"]}
    clean = [s for n, s in took.items() if n not in touched]
    assert clean, (took, rows)
    for row in rows:
        row.pop("at")
        row["trials_ended"] = {n: statuses.get(n) for n in row["trials_in_flight"]}
        row["seconds_lost"] = round(max((took[n] for n in row["trials_in_flight"] if n in took),
                                        default=statistics.median(clean))
                                    - statistics.median(clean), 1)
    table = TABLE if os.environ.get("CHEXFLOW_RECORD_FAULT_TABLE") == "1" else \
        tmp_path / "cluster-faults-katib.json"
    table.write_text(json.dumps({
        "measured": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "load_average_1m": round(os.getloadavg()[0], 1), "cores": os.cpu_count(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "experiment": {"trials": f"{TRIALS} batch Job trials, {PARALLEL} in parallel, "
                                 f"{EPOCHS} reports 3 s apart (StdOut collector)",
                       "algorithm": "multivariate-tpe (chexflow.katib.services.server pod)",
                       "outcome": cond["type"], "reason": cond.get("reason"),
                       "seconds": round(time.time() - started),
                       "counts": results["counts"],
                       "median_fault_free_trial_s": round(statistics.median(clean), 1)},
        "faults": rows}, indent=2) + "\n")
