"""Fault injection on the Katib cluster while one Experiment with MPIJob trials runs (`chexflow
tune katib/specs/chexnet-multivariate-tpe.yaml --cluster`, the shipped spec and its MPIJob
template with `--set`): ten processes are SIGKILLed one at a time, each once, while trials run.

- etcd, kube-apiserver, kube-scheduler, mpi-operator, the kubelet and containerd: the
  cluster's supervisor (started here, as test_cluster_faults_table.py does) restarts each.
- The main process of katib-controller, katib-db-manager, katib-mysql and the Experiment's
  suggestion pod (chexflow's multivariate-tpe service), found through containerd: the kubelet
  restarts the container.

The trials do not train: each is an MPIJob (kubeflow.org/v2beta1, one worker pod with 2 slots,
the trainer image's OpenMPI and sshd) whose launcher's mpirun starts 2 ranks of a shell loop;
rank 0 prints `val_auroc=0.1 .. 0.4` 3 s apart (Katib's StdOut collector reads the launcher),
and each rank writes its rank-N.json into the trial's folder on a PersistentVolumeClaim (a
temporary file, then a rename).

The Experiment cannot end while the faults go on, however fast its trials run: it is created
with room for OPEN_TRIALS and cut to the trials made so far + AFTER once the last fault is over
(Katib lets maxTrialCount change while it runs).

Checked: the Experiment ends (Succeeded, or Failed with Katib's reason); its Trials are exactly
the suggestions the Suggestion lists (same names and assignments, no point twice, none
missing); each trial's observation log in db-manager holds exactly its reports once (or none,
for a trial that failed); every rank file on the claim is whole, and a Succeeded trial has both.
Measured per fault: seconds until the process (container) ran again and until it was healthy
(pod Ready), the supervised processes and Katib pods that also restarted, the trials in flight
while it was down and how they ended, and the seconds the slowest of them took beyond the
median trial that no fault touched (measured, not asserted: none when every trial was in flight
during some fault). The table is written beside the test's data, or with
CHEXFLOW_RECORD_FAULT_TABLE=1 to docs/bench/cluster-faults-katib.json, from which
`chexflow bench tables` makes docs/local-cluster.md's table."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from datetime import datetime

import pytest

from chexflow.devcluster.faults import (
    CONTROL_PLANE,
    kill_component,
    restarts,
    retry,
)
from chexflow.devcluster.katib import NAMESPACE
from chexflow.devcluster.realnode import RealNode
from chexflow.envs import REPO_ROOT
from tests.cluster.conftest import hostpath_claim
from tests.cluster.test_cluster_katib_tune import CHEXFLOW, LAUNCHER, WORKER
from tests.support.pod_faults import kill_pod_process

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-multivariate-tpe.yaml"
KATIB = ("katib-controller", "katib-db-manager", "katib-mysql", "suggestion")
FAULTS = (*CONTROL_PLANE, *KATIB)
EPOCHS, RANKS = 4, 2  # reports per trial (val_auroc=0.1 .. 0.4, one every 3 s); MPI ranks
# The Experiment is created with room for OPEN_TRIALS (it cannot end while the faults go on,
# however fast trials run) and cut to the trials made so far + AFTER once the last fault is
# over: a few trials after the faults (the fault-free baseline). PARALLEL trials at a time.
OPEN_TRIALS, AFTER, PARALLEL = 1000, 4, 2
GAP_S = 3  # trials go on between two faults
TABLE = REPO_ROOT / "docs" / "bench" / "cluster-faults-katib.json"
MPIJOB = "spec.trialTemplate.trialSpec.spec"
# what each rank runs: the launcher's command is `sh -c "mpirun ... bash -c 'SCRIPT'"`, as one
# string, since Katib's pod webhook joins its command and args with spaces into one `sh -c`
# string (wrapWorkerContainer, pkg/webhook/v1beta1/pod/utils.go)
SCRIPT = (
    "d=/mnt/chexflow/runs/${trialParameters.trialName}; r=$OMPI_COMM_WORLD_RANK; "
    "if [ $r = 0 ]; then echo lr=${trialParameters.learningRate} "
    "batch_size=${trialParameters.batchSize} optimizer=${trialParameters.optimizer} "
    "weight_decay=${trialParameters.weightDecay}; fi; "
    f"for e in $(seq 1 {EPOCHS}); do sleep 3; "
    "if [ $r = 0 ]; then echo epoch=$e val_auroc=0.$e; fi; done; mkdir -p $d && "
    'printf "{\\"rank\\": $r, \\"size\\": $OMPI_COMM_WORLD_SIZE, \\"reports\\": $e}\\n" '
    ">$d/.rank-$r.tmp && mv $d/.rank-$r.tmp $d/rank-$r.json")


def tune_sets(name: str, image: str) -> list[str]:
    """The shipped spec as OPEN_TRIALS MPIJob trials, PARALLEL at a time, without early stopping,
    val_auroc its only metric; one worker pod of RANKS slots, small, without a GPU; the
    launcher's mpirun runs SCRIPT on RANKS ranks."""
    small = "{requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}"
    mpirun = f"mpirun -np {RANKS} -bind-to none -map-by slot bash -c '{SCRIPT}'"
    sets = [f"metadata.name={name}", f"spec.maxTrialCount={OPEN_TRIALS}",
            f"spec.parallelTrialCount={PARALLEL}", f"spec.maxFailedTrialCount={OPEN_TRIALS}",
            "spec.earlyStopping=null", "spec.objective.additionalMetricNames=[]",
            "spec.objective.metricStrategies=[{name: val_auroc, value: max}]",
            f"{MPIJOB}.slotsPerWorker={RANKS}", f"{MPIJOB}.mpiReplicaSpecs.Worker.replicas=1",
            f"{MPIJOB}.runPolicy.schedulingPolicy.minAvailable=1",
            f"{LAUNCHER}.image={image}", f"{WORKER}.image={image}",
            f"{LAUNCHER}.resources={small}", f"{WORKER}.resources={small}",
            f"{LAUNCHER}.command=[sh, -c]", f"{LAUNCHER}.args={json.dumps([mpirun])}"]
    return [a for s in sets for a in ("--set", s)]


def _pod(core, fault: str, ns: str, exp: str):
    """The one running pod of the Katib component (the suggestion: the Experiment's)."""
    if fault == "suggestion":
        where, selector = ns, f"katib.kubeflow.org/suggestion={exp}"
    else:
        where, selector = NAMESPACE, f"katib.kubeflow.org/component={fault.split('-', 1)[1]}"
    pods = [p for p in core.list_namespaced_pod(where, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]
    assert len(pods) == 1, (fault, [p.metadata.name for p in pods])
    return pods[0]


def _running(core, ns: str) -> set[str]:
    """The trials whose launcher pod runs (mpirun started: its image is unpacked, its worker
    Ready, as launcherCreationPolicy WaitForWorkersReady asks)."""
    pods = core.list_namespaced_pod(ns, label_selector="training.kubeflow.org/job-role=launcher")
    return {p.metadata.labels.get("training.kubeflow.org/job-name") for p in pods.items
            if p.status.phase == "Running"} - {None}  # the MPIJob has the Trial's name


def _katib_restarts(core, ns: str, exp: str) -> dict[str, int]:
    """Container restarts of Katib's pods and the Experiment's suggestion pod."""
    pods = [*core.list_namespaced_pod(NAMESPACE).items,
            *core.list_namespaced_pod(ns, label_selector=f"katib.kubeflow.org/suggestion={exp}"
                                      ).items]
    return {p.metadata.name: sum(c.restart_count for c in p.status.container_statuses or [])
            for p in pods}


def _trials(custom, ns: str, exp: str) -> list[dict]:
    return custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "trials",
        label_selector=f"katib.kubeflow.org/experiment={exp}")["items"]


def _stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def _span(trial: dict) -> tuple[float, float]:
    """When the Trial was created and when it ended (now, if it has not)."""
    end = _stamp((trial.get("status") or {}).get("completionTime"))
    return _stamp(trial["metadata"]["creationTimestamp"]), end or time.time()


def _inject(cluster, core, node: RealNode, fault: str, ns: str, exp: str) -> dict:
    """SIGKILL `fault`, wait until it is back; its row of the table (with `window`, the wall
    time it was down, which the caller replaces by the trials it touched)."""
    before, katib = restarts(cluster.state_dir), retry(lambda: _katib_restarts(core, ns, exp))
    at, target = time.time(), fault
    if fault in CONTROL_PLANE:
        running, ready = kill_component(cluster.state_dir, fault)
        what = "process, restarted by the supervisor"
    else:
        pod = _pod(core, fault, ns, exp)
        running, ready = kill_pod_process(core, node, pod)
        target, what = pod.metadata.name, "pod's main process, restarted by the kubelet"
    time.sleep(GAP_S)
    pods = retry(lambda: _katib_restarts(core, ns, exp))
    also = [n for n, c in [*restarts(cluster.state_dir).items(), *pods.items()]
            if n != target and c > {**before, **katib}.get(n, 0)]
    return {"fault": fault, "pod": None if target == fault else target, "what": what,
            "running_again_after_s": round(running, 1), "ready_after_s": round(ready, 1),
            "also_restarted": sorted(also), "window": (at, at + ready)}


def _close(custom, ns: str, name: str) -> int:
    """End the Experiment AFTER trials from now: maxTrialCount (and maxFailedTrialCount) cut to
    the trials made so far + AFTER (Katib lets both change while it runs); returns that."""
    exp = retry(lambda: custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", ns,
                                                            "experiments", name))
    total = len(retry(lambda: _trials(custom, ns, name))) + AFTER
    retry(lambda: custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "experiments", name,
        {"spec": {"maxTrialCount": total, "maxFailedTrialCount": total}}))
    assert exp["spec"]["maxTrialCount"] == OPEN_TRIALS
    return total


def _failed(trials: list[dict], statuses: dict[str, str], rows: list[dict],
            kubelet_log) -> dict[str, dict]:
    """The trials that did not succeed, each as Katib's design fails it: its metrics collector
    reported while db-manager (or MySQL behind it) was down; Katib's collector tries
    ReportObservationLog once and exits (klog.Fatalf "Failed to Report logs", v0.19.0
    cmd/metricscollector/v1beta1/file-metricscollector/main.go), so the launcher pod's
    collector container crash-loops (the kubelet's log) until the launcher Job's backoffLimit:
    the MPIJob, hence the Trial, Failed with BackoffLimitExceeded. Katib makes another trial in
    its place (maxFailedTrialCount allows it). Asserted for each; returned for the table."""
    log = kubelet_log.read_text(errors="replace")
    out = {}
    for trial in trials:
        name = trial["metadata"]["name"]
        if statuses.get(name) == "Succeeded":
            continue
        cond = next(c for c in trial["status"]["conditions"]
                    if c["type"] == "Failed" and c["status"] == "True")
        faults = [r["fault"] for r in rows if name in r["trials_in_flight"]]
        crashed = ("restarting failed container=metrics-logger-and-collector "
                   f"pod={name}-launcher-") in log
        out[name] = {"faults_in_flight": faults, "reason": cond["reason"],
                     "collector_crash_looped": crashed}
        assert statuses[name] == "Failed", (name, statuses[name])
        assert "BackoffLimitExceeded" in cond["reason"] + cond["message"], (name, cond)
        assert crashed, f"{name}: no collector restart in {kubelet_log}"
        assert {"katib-db-manager", "katib-mysql"} & set(faults), (name, faults)
    return out


@pytest.mark.timeout(1800)
def test_an_experiment_of_mpijob_trials_survives_ten_control_plane_and_katib_processes_sigkilled(
        katib_cluster, katib_namespace, katib_trainer_image, tmp_path):
    from kubernetes import client

    ns, name = katib_namespace, f"faults-{katib_namespace[-5:]}"
    api = katib_cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = RealNode(katib_cluster.state_dir)
    shared, state = tmp_path / "pvc", tmp_path / "state"
    shared.mkdir()
    shared.chmod(0o777)  # the image's user (uid 1000) writes here
    pv = hostpath_claim(core, ns, "fault-data", shared)
    supervisor = katib_cluster.start_supervisor()
    started = time.time()
    tune = subprocess.Popen(
        [*CHEXFLOW, "tune", str(SPEC), "--cluster", "--namespace", ns, "--state", str(state),
         "--poll-interval", "3", "--timeout", "1200", "--volume", "data=fault-data",
         *tune_sets(name, katib_trainer_image)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "KUBECONFIG": str(katib_cluster.kubeconfig)})
    rows, faulted = [], set()
    try:
        for fault in FAULTS:  # each once a trial started since the previous fault runs mpirun
            deadline = time.monotonic() + 600
            while not (running := retry(lambda: _running(core, ns))) - faulted:
                assert tune.poll() is None, f"the Experiment ended before the {fault} fault"
                assert time.monotonic() < deadline, f"no new trial running for 600 s: {rows}"
                time.sleep(0.5)
            rows.append(_inject(katib_cluster, core, node, fault, ns, name))
            faulted |= running
            assert tune.poll() is None, f"the Experiment ended during the {fault} fault: {rows}"
        trials_total = _close(custom, ns, name)
        out, _ = tune.communicate(timeout=1200)
    finally:
        if tune.poll() is None:
            tune.kill()
            tune.wait()
        os.kill(supervisor, signal.SIGTERM)
        os.waitpid(supervisor, 0)
        core.delete_persistent_volume(pv)
    results = json.loads((state / "results.json").read_text())
    cond = results["condition"]
    assert tune.returncode == (0 if cond["type"] == "Succeeded" else 1), out
    assert cond["type"] == "Succeeded" or cond.get("message"), cond
    counts = restarts(katib_cluster.state_dir)
    assert all(counts[n] >= 1 for n in CONTROL_PLANE), counts

    # no trial lost or duplicated: the Trials are exactly the suggestions Katib's service gave
    suggestion = custom.get_namespaced_custom_object("kubeflow.org", "v1beta1", ns,
                                                     "suggestions", name)
    given = {s["name"]: {a["name"]: a["value"] for a in s["parameterAssignments"]}
             for s in suggestion["status"]["suggestions"]}
    trials = _trials(custom, ns, name)
    ran = {t["metadata"]["name"]: {a["name"]: a["value"]
                                   for a in t["spec"]["parameterAssignments"]} for t in trials}
    assert ran == given, (ran, given)
    assert len(ran) == trials_total and len({v["lr"] for v in ran.values()}) == trials_total
    assert {t["spec"]["runSpec"]["kind"] for t in trials} == {"MPIJob"}
    # no half-written result: each trial's observation log holds its reports, once each, and
    # each rank's file is whole; a Succeeded trial ran both ranks to the end
    logs = json.loads((state / "observation-logs.json").read_text())
    statuses = {t["trial"]: t["status"] for t in results["trials"]}
    reports = [e / 10 for e in range(1, EPOCHS + 1)]
    for trial, status in statuses.items():
        values = [float(m["value"]) for m in logs[trial]["val_auroc"]]
        files = sorted((shared / "runs" / trial).glob("rank-*.json"))
        ranks = [json.loads(f.read_text()) for f in files]
        assert all(r == {"rank": r["rank"], "size": RANKS, "reports": EPOCHS} for r in ranks)
        if status == "Succeeded":
            assert values == reports, (trial, values)
            assert sorted(r["rank"] for r in ranks) == list(range(RANKS)), (trial, ranks)
        else:  # a report that did not reach db-manager: none, not a part
            assert values in ([], reports), (trial, status, values)

    # seconds lost: the trials in flight while a process was down against the untouched ones
    spans = {t["metadata"]["name"]: _span(t) for t in trials}
    took = {n: e - s for n, (s, e) in spans.items()}
    for row in rows:
        down, up = row.pop("window")
        row["trials_in_flight"] = sorted(n for n, (s, e) in spans.items()
                                         if s <= up + 1 and e >= down - 1)
    touched = {n for r in rows for n in r["trials_in_flight"]}
    clean = [s for n, s in took.items() if n not in touched]
    median = statistics.median(clean) if clean else None  # a measurement: not asserted
    for row in rows:
        row["trials_ended"] = {n: statuses.get(n) for n in row["trials_in_flight"]}
        row["seconds_lost"] = None if median is None else round(max(
            (took[n] for n in row["trials_in_flight"]), default=median) - median, 1)
    failed = _failed(trials, statuses, rows, katib_cluster.log_dir / "kubelet.log")
    table = TABLE if os.environ.get("CHEXFLOW_RECORD_FAULT_TABLE") == "1" else \
        tmp_path / "cluster-faults-katib.json"
    table.write_text(json.dumps({
        "command": "CHEXFLOW_RECORD_FAULT_TABLE=1 pytest "
                   "tests/cluster/test_cluster_katib_faults.py",
        "measured": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "load_average_1m": round(os.getloadavg()[0], 1), "cores": os.cpu_count(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "experiment": {"trials": f"{trials_total} MPIJob trials (kubeflow.org/v2beta1), "
                                 f"{PARALLEL} in "
                                 f"parallel: a launcher and one worker pod whose mpirun runs "
                                 f"{RANKS} ranks of a shell loop; rank 0 prints {EPOCHS} reports "
                                 "3 s apart (StdOut collector)",
                       "spec": str(SPEC.relative_to(REPO_ROOT)),
                       "algorithm": "multivariate-tpe (chexflow.katib.services.server pod)",
                       "outcome": cond["type"], "reason": cond.get("reason"),
                       "seconds": round(time.time() - started),
                       "counts": results["counts"],
                       "median_fault_free_trial_s": None if median is None
                       else round(median, 1),
                       "failed_trials": failed},
        "faults": rows}, indent=2) + "\n")
