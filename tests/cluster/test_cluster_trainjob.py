"""Kubeflow Trainer v2 on the session cluster (JobSet and Trainer's controller manager built from
their Go modules and started on it lazily, LocalCluster.add(Trainer())): chexflow's Horovod
ClusterTrainingRuntime, rendered by `chexflow images render` for the trainer pushed to the
cluster's registry, runs a TrainJob submitted with `chexflow job submit --job-kind trainjob` on
real pods that pull the image by digest: two nodes (the launcher is one: runLauncherAsNode)
train DenseNet-121 with Horovod size 2 on generated TFRecords. The pipeline runs TrainJobs on the
session's runtime (the side-loaded image). Stopping the command deletes the TrainJob and its
JobSet; a runtime that does not exist ends the command with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from chexflow.devcluster import nodes
from chexflow.envs import REPO_ROOT
from chexflow.jobs.trainjob import (
    JOBSET_LABEL,
    REPLICATED_JOB_LABEL,
    RUNTIME_NAME,
    RUNTIME_PLURAL,
    TRAINJOB_GROUP,
    TRAINJOB_PLURAL,
    TRAINJOB_VERSION,
)
from tests.cluster.conftest import generated_tfrecords

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
# the runtime rendered for the pushed trainer, beside the session's chexflow-horovod
PUSHED_RUNTIME = "chexflow-horovod-pushed"


def _env(cluster, image: str) -> dict[str, str]:
    """The cluster's KUBECONFIG, and `image` (the runtime's) as the trainer image jobs name."""
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "CHEXFLOW_TRAINER_IMAGE": image}


def _wait_for(what: str, check, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout:.0f} s")
        time.sleep(0.5)


def test_a_trainjob_on_the_runtime_rendered_for_the_pushed_trainer_pulls_it_and_trains(
        trainer_cluster, k8s_api, real_namespace, pushed_trainer, tmp_path):
    """The runtime `chexflow images render` writes for the references file of a push (applied
    under a name of its own: the session's runtime names the side-loaded image), and a
    TrainJob on it as Kubeflow's docs write one (spec.trainer.image, from the references file),
    whose pods pull the image by digest with chexflow's pull Secret."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ns, data = real_namespace
    env, reference = pushed_trainer
    generated_tfrecords(data)
    subprocess.run([*CHEXFLOW, "images", "render", "--out", str(tmp_path / "rendered")],
                   env=env, check=True, cwd=REPO_ROOT, capture_output=True, timeout=120)
    runtime = yaml.safe_load((tmp_path / "rendered" / "trainjob" / "horovod-runtime.yaml")
                             .read_text())
    runtime["metadata"]["name"] = PUSHED_RUNTIME
    try:
        client.CustomObjectsApi(k8s_api).create_cluster_custom_object(
            TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL, runtime)
    except ApiException as e:
        if e.status != 409:
            raise
    subprocess.run([*CHEXFLOW, "images", "pull-secret", "--name", "registry-login",
                    "--namespace", ns, "--apply"], env=env, check=True, cwd=REPO_ROOT,
                   capture_output=True, timeout=60)
    core = client.CoreV1Api(k8s_api)
    start = time.monotonic()
    proc = subprocess.Popen(
        [*CHEXFLOW, "job", "submit", "--job-kind", "trainjob", "--runtime", PUSHED_RUNTIME,
         "--keep", "--name", "tj", "--namespace", ns, "--workers", "2", "--gpus-per-worker",
         "0", "--cpu", "750m", "--memory", "3Gi", "--pvc", "data", "--mount-path", "/data",
         "--image-pull-secret", "registry-login", "--timeout", "900", "--",
         "chexflow", "train", "--launcher", "none", "--data", "/data/tfrecords",
         "--out", "/data/run", "--model", "densenet121", "--image-size", "64",
         "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "4", "--threads", "1"],
        cwd=REPO_ROOT, env={**env, "KUBECONFIG": str(trainer_cluster.kubeconfig)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[str, str] = {}  # pod -> replicated job (JobSet ends the node pods at Complete)
    try:
        while proc.poll() is None and time.monotonic() - start < 1200:
            for pod in core.list_namespaced_pod(ns, label_selector=f"{JOBSET_LABEL}=tj").items:
                seen[pod.metadata.name] = pod.metadata.labels[REPLICATED_JOB_LABEL]
            time.sleep(2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - start
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-5000:]}"
    assert "TrainJob/tj succeeded" in out
    print(f"TrainJob submit to Complete: {wall:.0f} s", file=sys.stderr)
    # two nodes: the launcher is one of them (runLauncherAsNode)
    assert sorted(seen.values()) == ["launcher", "node"], seen
    pods = core.list_namespaced_pod(ns, label_selector=f"{JOBSET_LABEL}=tj").items
    launcher = next(p for p in pods if p.metadata.labels[REPLICATED_JOB_LABEL] == "launcher")
    log = core.read_namespaced_pod_log(launcher.metadata.name, ns, container="node")
    metrics = json.loads((data / "run" / "metrics.json").read_text())
    assert metrics["workers"] == 2 and metrics["model"] == "densenet121", metrics
    assert f"val_auroc={metrics['val_auroc']:.6g}" in log
    # both pods ran the pushed image, pulled by its digest
    for pod in pods:
        assert [c.image for c in pod.spec.containers] == [reference], pod.metadata.name
        assert pod.status.container_statuses[0].image_id.endswith(reference.split("@")[1])
    job = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
        TRAINJOB_GROUP, TRAINJOB_VERSION, ns, TRAINJOB_PLURAL, "tj")
    conds = {c["type"]: c["status"] for c in job["status"]["conditions"]}
    assert conds.get("Complete") == "True", job["status"]


# the pipeline's three steps on real pods limited to 750m CPU: minutes on 2 shared cores
@pytest.mark.timeout(2400)
def test_chexnet_train_pipeline_with_job_kind_trainjob_ends_with_auroc_and_the_report(
        trainer_cluster, k8s_api, real_namespace, trainer_image):
    """`chexflow run chexnet-train --backend kubernetes --job-kind trainjob`: preprocess and
    evaluate run as Jobs, the training step as a TrainJob on chexflow's runtime (two nodes,
    Horovod size 2), and the run ends with the test AUROC and the HTML report."""
    from pathlib import Path

    ns, shared = real_namespace
    proc = subprocess.run(
        [*CHEXFLOW, "run", "chexnet-train", "--backend", "kubernetes", "--namespace", ns,
         "--job-kind", "trainjob", "--data-pvc", "data", "--pvc-host-path", str(shared),
         "--trainer-image", trainer_image, "--epochs", "1", "--workers", "2",
         "--image-size", "64", "--batch-size", "4", "--steps-per-epoch", "2",
         "--validation-steps", "2", "--cpu-per-worker", "750m", "--memory-per-worker", "3Gi",
         "--weights", "none", "--bootstrap", "50", "--timeout-seconds", "1500"],
        cwd=REPO_ROOT, env=_env(trainer_cluster, trainer_image), capture_output=True, text=True,
        timeout=2100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "mean test AUROC" in proc.stdout, proc.stdout
    (run_dir,) = (shared / "runs").glob("chexnet-train-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    evaluation = summary["tasks"]["evaluate-op"]["artifacts"]["metrics"]["metadata"]
    assert 0 <= evaluation["auroc_mean"] <= 1, evaluation
    (report,) = summary["reports"]
    assert "<html" in Path(report).read_text().lower()
    (workdir,) = Path(summary["work_dir"]).iterdir()
    metrics = json.loads((workdir / "train-w2" / "metrics.json").read_text())
    assert metrics["workers"] == 2, metrics  # Horovod size 2 across the TrainJob's two nodes
    train_log = (run_dir / "logs" / "train-op.log").read_text()
    assert "TrainJob/train-w2-" in train_log and "val_auroc=" in train_log, train_log[-3000:]


def test_stopping_the_submitting_command_deletes_the_trainjob_and_its_jobset(
        trainer_cluster, k8s_api, k8s_namespace, trainer_image):
    """On the kwok nodes (a held launcher): SIGTERM deletes the TrainJob; its JobSet and pods
    go with it."""
    from kubernetes import client

    ns = k8s_namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    proc = subprocess.Popen(
        [*CHEXFLOW, "mpijob", "submit", "--job-kind", "trainjob", "--name", "held",
         "--namespace", ns, "--workers", "2", "--gpus-per-worker", "1", "--timeout", "600",
         "--env", f"{nodes.OUTCOME_ENV}=hold", "--", "chexflow", "train", "--epochs", "1"],
        cwd=REPO_ROOT, env=_env(trainer_cluster, trainer_image), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        def launcher_running() -> bool:
            pods = core.list_namespaced_pod(
                ns, label_selector=f"{JOBSET_LABEL}=held,{REPLICATED_JOB_LABEL}=launcher").items
            return any(p.status.phase == "Running" for p in pods)
        _wait_for("launcher running", launcher_running, timeout=120)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1] == (
        f"chexflow mpijob: error: stopped by SIGTERM: deleted TrainJob {ns}/held and its pods")
    assert "Traceback" not in err

    def nothing_left() -> bool:
        jobs = custom.list_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, ns,
                                                    TRAINJOB_PLURAL)["items"]
        jobsets = custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns,
                                                       "jobsets")["items"]
        return not jobs and not jobsets and not core.list_namespaced_pod(ns).items
    _wait_for("TrainJob, JobSet and pods gone", nothing_left, timeout=60)


def test_a_runtime_that_does_not_exist_is_one_clear_line(trainer_cluster, k8s_namespace,
                                                         trainer_image):
    proc = subprocess.run(
        [*CHEXFLOW, "mpijob", "submit", "--job-kind", "trainjob", "--runtime", "no-such",
         "--name", "orphan", "--namespace", k8s_namespace, "--workers", "2", "--",
         "chexflow", "train"],
        cwd=REPO_ROOT, env=_env(trainer_cluster, trainer_image), capture_output=True,
        text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "chexflow mpijob: error: ClusterTrainingRuntime no-such not found: apply it first "
        "(kubectl apply -f horovod-runtime.yaml from chexflow's trainjob/)")
    assert RUNTIME_NAME != "no-such"


def _submit_fails(cluster, image: str, ns: str, name: str, *options: str) -> str:
    """Run `chexflow mpijob submit --job-kind trainjob` expected to fail: its last stderr line."""
    proc = subprocess.run(
        [*CHEXFLOW, "mpijob", "submit", "--job-kind", "trainjob", "--name", name,
         "--namespace", ns, "--workers", "2", "--timeout", "300", *options, "--",
         "chexflow", "train"],
        cwd=REPO_ROOT, env=_env(cluster, image), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_an_image_other_than_the_runtimes_is_one_line_and_nothing_is_created(
        trainer_cluster, k8s_api, k8s_namespace, trainer_image):
    """Trainer would set it on the launcher alone, the node pods keeping the runtime's image:
    refused before anything is created."""
    from kubernetes import client

    ns = k8s_namespace
    line = _submit_fails(trainer_cluster, trainer_image, ns, "other-image",
                         "--image", "chexflow.local/no-such-image:1")
    assert line.startswith(
        f"chexflow mpijob: error: ClusterTrainingRuntime {RUNTIME_NAME} runs its node pods in "
        f"{trainer_image}, but the TrainJob's spec.trainer.image (its launcher's) is "
        "chexflow.local/no-such-image:1: "), line
    custom = client.CustomObjectsApi(k8s_api)
    assert not custom.list_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, ns,
                                                    TRAINJOB_PLURAL)["items"]


def test_a_node_selector_nothing_matches_is_one_line(trainer_cluster, k8s_namespace,
                                                     trainer_image):
    line = _submit_fails(trainer_cluster, trainer_image, k8s_namespace, "nowhere",
                         "--node-selector", "pool=no-such-pool")
    assert line.startswith(f"chexflow mpijob: error: TrainJob {k8s_namespace}/nowhere cannot be "
                           "scheduled: pod nowhere-node-0-0"), line
    assert "node affinity/selector" in line and line.endswith("it was deleted"), line


PLAIN_RANK = "import os, sys; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], sys.executable)"
FAILING_RANK = ("import os, sys; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], "
                "'failed: no data', flush=True); sys.exit(3)")


def run_plain_trainjob(custom, ns: str, name: str, rank_code: str, timeout: float) -> dict:
    """A TrainJob as Kubeflow's docs write one (runtimeRef, numNodes, a command; the image the
    runtime's) whose launcher runs `mpirun -np 2 python -c RANK_CODE`; its Complete or Failed
    condition once it has one."""
    custom.create_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, ns, TRAINJOB_PLURAL, {
        "apiVersion": f"{TRAINJOB_GROUP}/{TRAINJOB_VERSION}", "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": RUNTIME_NAME}, "trainer": {
            "numNodes": 2, "command": ["mpirun", "-np", "2", "python", "-c", rank_code],
            # no GPU here: the runtime's default asks for one per node
            "resourcesPerNode": {"requests": {"cpu": "250m", "memory": "512Mi"},
                                 "limits": {"cpu": "1", "memory": "1Gi"}}}}})

    def ended() -> dict | None:
        job = custom.get_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, ns,
                                                  TRAINJOB_PLURAL, name)
        return next((c for c in job.get("status", {}).get("conditions", [])
                     if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None)

    _wait_for(f"TrainJob {name} finished", ended, timeout=timeout)
    return ended()


def launcher_pods(core, ns: str, name: str) -> list:
    return core.list_namespaced_pod(
        ns, label_selector=f"{JOBSET_LABEL}={name},{REPLICATED_JOB_LABEL}=launcher").items


def test_a_plain_trainjob_with_mpirun_and_no_forwarded_environment_runs_python_on_every_rank(
        trainer_cluster, k8s_api, real_namespace):
    """A plain TrainJob whose launcher runs `mpirun -np 2 python ...` with no `-x PATH`: the
    rank started over ssh on the other node finds the venv's python, as sshd gives its sessions
    the image's PATH (images/trainer/Dockerfile)."""
    from kubernetes import client

    ns, _ = real_namespace
    core = client.CoreV1Api(k8s_api)
    ended = run_plain_trainjob(client.CustomObjectsApi(k8s_api), ns, "plain", PLAIN_RANK, 300)
    (launcher,) = launcher_pods(core, ns, "plain")
    log = core.read_namespaced_pod_log(launcher.metadata.name, ns, container="node")
    assert ended["type"] == "Complete", log[-3000:]
    ranks = sorted(line.split()[1:] for line in log.splitlines() if line.startswith("rank "))
    assert ranks == [["0", "/opt/chexflow/venv/bin/python"],
                     ["1", "/opt/chexflow/venv/bin/python"]], log[-3000:]


def test_a_failed_plain_trainjob_keeps_every_launcher_attempt_and_its_log(
        trainer_cluster, k8s_api, real_namespace):
    """A plain TrainJob whose ranks exit 3: once it has Failed, each of the launcher's attempts
    (the runtime's backoffLimit 2: three) is still a pod whose log `kubectl logs` reads, as the
    runtime's launcher restarts by a new pod (restartPolicy Never), which the Job controller
    keeps, and JobSet deletes only the Jobs still active when the TrainJob fails."""
    from kubernetes import client

    ns, _ = real_namespace
    core = client.CoreV1Api(k8s_api)
    ended = run_plain_trainjob(client.CustomObjectsApi(k8s_api), ns, "fails", FAILING_RANK, 420)
    assert ended["type"] == "Failed", ended
    launchers = launcher_pods(core, ns, "fails")
    assert len(launchers) == 3, [(p.metadata.name, p.status.phase) for p in launchers]
    for pod in launchers:
        assert pod.status.phase == "Failed", pod.status
        log = core.read_namespaced_pod_log(pod.metadata.name, ns, container="node")
        assert "rank 0 failed: no data" in log and "rank 1 failed: no data" in log, log[-3000:]
