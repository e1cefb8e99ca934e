"""`chexflow tune katib/specs/chexnet-random-trainjob.yaml --cluster` on the real Katib (v0.19.0)
with Kubeflow Trainer v2 added to the Katib cluster: two tiny trials, each a TrainJob on
chexflow's Horovod runtime (2 nodes, the launcher one of them) training DenseNet-121 on
generated TFRecords, run to Succeeded. Katib's pod webhook puts its metrics collector only in
the launcher pod (the spec's primaryPodLabels), which prints val_auroc: each Trial's
observation is the trial's metrics.json. The optimal trial, read from the same records by the
local runner's rules for this spec, is Katib's; the Katib SDK's KatibClient reads the same
Experiment, its optimal trial and its DB's metrics (notebooks/katib-client.ipynb, executed with
nbclient). Then the local runner runs the same spec (the TrainJob trial's trainer command under
horovodrun) on the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from chexflow.envs import REPO_ROOT
from chexflow.jobs.trainjob import (
    JOBSET_LABEL,
    REPLICATED_JOB_LABEL,
)
from tests.cluster.conftest import katib_data_claim
from tests.cluster.test_cluster_katib_tune import CHEXFLOW, TRIAL_ARGS
from tests.support.notebooks import execute, text_of

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

SPEC = REPO_ROOT / "katib" / "specs" / "chexnet-random-trainjob.yaml"
KATIB_CLIENT = REPO_ROOT / "notebooks" / "katib-client.ipynb"
TRAINER = "spec.trialTemplate.trialSpec.spec.trainer"
COLLECTOR = "metrics-logger-and-collector"  # Katib's sidecar (MetricLoggerCollectorContainerName)
SETS = ["spec.maxTrialCount=2", "spec.parallelTrialCount=1", "spec.maxFailedTrialCount=1",
        "spec.earlyStopping=null"]


def tiny_trainjob(image: str) -> list[str]:
    """Two tiny trials one after the other (no early stopping: medianstop needs 3 succeeded
    trials), the launcher's image the one built here, small nodes without a GPU."""
    return [*(a for s in SETS for a in ("--set", s)), "--set", f"{TRAINER}.image={image}",
            "--set", f"{TRAINER}.resourcesPerNode={{requests: {{cpu: 250m, memory: 1Gi}}, "
                     "limits: {memory: 3Gi}}", *TRIAL_ARGS]


class PodLog(threading.Thread):
    """Every pod of the namespace's TrainJobs seen while the sweep runs: its replicated job and
    its containers (Katib's sidecar included once injected)."""

    def __init__(self, api, namespace: str):
        from kubernetes import client

        super().__init__(daemon=True)
        self.core, self.namespace = client.CoreV1Api(api), namespace
        self.seen: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(2):
            for pod in self.core.list_namespaced_pod(self.namespace,
                                                     label_selector=JOBSET_LABEL).items:
                labels = pod.metadata.labels
                self.seen[pod.metadata.name] = (labels[JOBSET_LABEL],
                                                labels[REPLICATED_JOB_LABEL],
                                                tuple(c.name for c in pod.spec.containers))

    def assert_collector_in_launchers_only(self, jobs: list[str]) -> None:
        """The pods seen were those of `jobs`; Katib's collector sat beside each launcher's
        container and in no `node` pod."""
        by_job: dict[str, dict[str, set[tuple[str, ...]]]] = {}
        for job, role, containers in self.seen.values():
            by_job.setdefault(job, {}).setdefault(role, set()).add(containers)
        assert sorted(by_job) == sorted(jobs), self.seen
        for roles in by_job.values():
            assert roles["launcher"] == {("node", COLLECTOR)}, self.seen
            assert roles["node"] == {("node",)}, self.seen


# 160 generated images: the patient-level split leaves 80 to train, one step of the largest batch
# size (32) x 2 workers; with fewer, `chexflow train` refuses the trial in one line.
@pytest.mark.timeout(2400)
def test_tune_trainjob_spec_on_the_real_katib_runs_trainjob_trials_to_succeeded(
        katib_trainer, katib_namespace, katib_trainer_image, tmp_path, monkeypatch):
    from kubernetes import client

    from chexflow.katib.experiment.spec import load_experiment

    api, ns = katib_trainer.api_client(), katib_namespace
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    shared, pv = katib_data_claim(core, ns, tmp_path / "pvc")  # the template's claim
    name = f"tj-random-{ns[-5:]}"
    pods = PodLog(api, ns)
    pods.start()
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [*CHEXFLOW, "tune", str(SPEC), "--cluster", "--namespace", ns, "--state",
             str(tmp_path / "state"), "--poll-interval", "3", "--timeout", "1500",
             "--set", f"metadata.name={name}", *tiny_trainjob(katib_trainer_image)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=1700,
            env={**os.environ, "KUBECONFIG": str(katib_trainer.kubeconfig)})
        print(f"tune --cluster, 2 TrainJob trials: {time.monotonic() - start:.0f} s",
              file=sys.stderr)
    finally:
        pods.done.set()
        pods.join(timeout=30)
        experiments = custom.list_namespaced_custom_object("kubeflow.org", "v1beta1", ns,
                                                           "experiments")["items"]
        trials = custom.list_namespaced_custom_object(
            "kubeflow.org", "v1beta1", ns, "trials",
            label_selector=f"katib.kubeflow.org/experiment={name}")["items"]
        core.delete_persistent_volume(pv)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (experiment,) = experiments
    status = experiment["status"]
    assert any(c["type"] == "Succeeded" and c["status"] == "True"
               for c in status["conditions"]), status
    assert status["trialsSucceeded"] == 2, status
    assert [t["spec"]["runSpec"]["kind"] for t in trials] == ["TrainJob", "TrainJob"]

    # the collector sits in the launcher pod only, beside the container that prints metrics
    pods.assert_collector_in_launchers_only([t["metadata"]["name"] for t in trials])

    # each Trial's observation is its launcher's val_auroc: the run's metrics.json
    for trial in trials:
        metrics = json.loads((shared / "runs" / "katib" / trial["metadata"]["name"]
                              / "metrics.json").read_text())
        assert metrics["workers"] == 2 and metrics["image_size"] == 32, metrics
        observed = {m["name"]: m for m in trial["status"]["observation"]["metrics"]}
        assert float(observed["val_auroc"]["max"]) == pytest.approx(metrics["val_auroc"],
                                                                    rel=1e-4)

    # the optimal trial: the local runner's reading of the spec over what Katib recorded
    exp = load_experiment(SPEC, SETS)
    rows = json.loads((tmp_path / "state" / "results.json").read_text())["trials"]
    best = rows[0]
    for row in rows[1:]:
        if exp.objective.better(row[exp.objective.metric], best[exp.objective.metric]):
            best = row
    katibs = status["currentOptimalTrial"]
    assert best["trial"] == katibs["bestTrialName"]
    optimal = json.loads((tmp_path / "state" / "optimal.json").read_text())
    assert optimal["trial"] == katibs["bestTrialName"]
    for a in katibs["parameterAssignments"]:
        assert str(best[a["name"]]) == a["value"] or best[a["name"]] == pytest.approx(
            float(a["value"]))
    assigned = [{a["name"]: a["value"] for a in t["spec"]["parameterAssignments"]}
                for t in trials]
    print(f"Katib's assignments (goptuna random, random_state 7): {assigned}", file=sys.stderr)

    # the Katib SDK reads the Experiment from a notebook (notebooks/katib-client.ipynb)
    db_manager = core.read_namespaced_service("katib-db-manager", "kubeflow").spec.cluster_ip
    monkeypatch.setenv("KUBECONFIG", str(katib_trainer.kubeconfig))  # the kernel's
    text = text_of(execute(KATIB_CLIENT, tmp_path, timeout=300, NAMESPACE=ns, EXPERIMENT=name,
                           DB_MANAGER=f"{db_manager}:6789"))
    assert f"{name}: random, maximize val_auroc, trials are TrainJobs" in text, text
    assert "batch-size (discrete): ['8', '16', '32']" in text, text
    assert "succeeded: True" in text
    assert f"optimal trial {katibs['bestTrialName']}: " in text, text
    for trial in trials:
        assert f"  {trial['metadata']['name']}: Succeeded, " in text, text
    best = next(m for m in katibs["observation"]["metrics"] if m["name"] == "val_auroc")
    assert f"  val_auroc={best['latest']}" in text, text  # from Katib's DB, over gRPC

    # the same spec through the local runner on the same data: TrainJob trials under horovodrun
    local = subprocess.run(
        [*CHEXFLOW, "tune", str(SPEC), "--local", "--state", str(tmp_path / "local"),
         "--no-progress", "--volume", f"data={shared}",
         *(a for s in ["spec.maxTrialCount=1", *SETS[1:]] for a in ("--set", s)),
         *TRIAL_ARGS],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    (row,) = json.loads((tmp_path / "local" / "results.json").read_text())["trials"]
    assert row["status"] == "Succeeded", row
    local_metrics = json.loads((shared / "runs" / "katib" / row["trial"]
                                / "metrics.json").read_text())
    assert local_metrics["workers"] == 2
    assert (local_metrics.get("horovod") or {}).get("controller") == "gloo"
    assert row["val_auroc"] == pytest.approx(local_metrics["val_auroc"], rel=1e-4)
    print(f"local runner's assignment: { {k: row[k] for k in assigned[0]} }", file=sys.stderr)
