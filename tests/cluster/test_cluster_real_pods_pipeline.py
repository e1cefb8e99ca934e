"""`chexflow run chexnet-train --backend kubernetes`: the pipeline runs here with kfp.local and
its jobs (preprocess and evaluate Jobs, the training MPIJob) run as real pods on the local
cluster's real node, sharing the run's files through the data PVC's host folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexflow.envs import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
IMAGE_UID = 1000  # the images' user `chexflow`, which the pods run as


def _scheduled(core, ns: str) -> dict[str, str]:
    """pod -> the node the scheduler assigned it to (from the namespace's Scheduled events:
    the pods of a job that succeeded are deleted with it)."""
    out = {}
    for event in core.list_namespaced_event(ns).items:
        if event.reason == "Scheduled":
            pod = event.involved_object.name
            out[pod] = event.message.rsplit(" to ", 1)[-1]
    return out


def _run(args: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a command in a session of its own; past `timeout` SIGTERM it all (the steps then
    delete their jobs) and fail."""
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate()
        raise AssertionError(f"not finished after {timeout:.0f} s\n{out[-4000:]}{err[-4000:]}") \
            from None
    return proc.returncode, out, err


# a DenseNet start-up in pods limited to 750m CPU: up to 12 min on 2 cores shared with other work
@pytest.mark.timeout(2400)
def test_chexnet_train_runs_its_jobs_as_real_pods_sharing_the_pvc_folder(
        k8s_api, real_namespace, trainer_image):
    from kubernetes import client

    ns, shared = real_namespace
    rc, out, err = _run(
        [*CHEXFLOW, "run", "chexnet-train", "--backend", "kubernetes", "--namespace", ns,
         "--data-pvc", "data", "--pvc-host-path", str(shared), "--trainer-image", trainer_image,
         "--epochs", "1", "--workers", "2", "--image-size", "64", "--batch-size", "4",
         "--steps-per-epoch", "2", "--validation-steps", "2", "--cpu-per-worker", "750m",
         "--memory-per-worker", "3Gi", "--weights", "none", "--bootstrap", "50",
         "--timeout-seconds", "1500"], timeout=2100)
    assert rc == 0, out[-4000:] + err[-4000:]
    assert "mean test AUROC" in out, out

    # the run, its generated data and the jobs' outputs all lie in the PVC's host folder
    (run_dir,) = (shared / "runs").glob("chexnet-train-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert Path(summary["work_dir"]).is_relative_to(shared)
    assert Path(summary["data"]).is_relative_to(shared)
    evaluation = summary["tasks"]["evaluate-op"]["artifacts"]["metrics"]["metadata"]
    assert 0 <= evaluation["auroc_mean"] <= 1, evaluation
    (report,) = summary["reports"]
    assert report.endswith(".html") and "<html" in Path(report).read_text().lower()

    # the pods, not processes here, wrote the jobs' outputs: as the images' user
    (workdir,) = Path(summary["work_dir"]).iterdir()  # WORK_ROOT/RUN_ID
    for made in ("data/manifest.json", "train-w2/metrics.json", "evaluate/auroc.json"):
        assert (workdir / made).stat().st_uid == IMAGE_UID, made
    metrics = json.loads((workdir / "train-w2" / "metrics.json").read_text())
    assert metrics["workers"] == 2, metrics  # Horovod size 2: one rank in each worker pod

    # every job's pods were scheduled on the real node and the launcher's log reached the step
    scheduled = _scheduled(client.CoreV1Api(k8s_api), ns)
    for prefix in ("preprocess-", "train-w2-", "evaluate-"):
        pods = {p: node for p, node in scheduled.items() if p.startswith(prefix)}
        assert pods and set(pods.values()) == {"chexflow-node"}, (prefix, scheduled)
    train_pods = [p for p in scheduled if p.startswith("train-w2-")]
    assert sum("-worker-" in p for p in train_pods) == 2, train_pods
    assert any("-launcher" in p for p in train_pods), train_pods
    train_log = (run_dir / "logs" / "train-op.log").read_text()
    assert "MPIJob/train-w2-" in train_log and "val_auroc=" in train_log, train_log[-3000:]


@pytest.mark.timeout(900)
def test_sigterm_to_chexflow_run_reaches_the_running_step_which_deletes_its_job(
        k8s_api, real_namespace, trainer_image):
    """`kill PID` of `chexflow run` (not its process group) while the preprocess Job runs: the
    step gets the SIGTERM too and deletes its Job and pods before the run ends, in one line."""
    from kubernetes import client

    ns, shared = real_namespace
    batch, core = client.BatchV1Api(k8s_api), client.CoreV1Api(k8s_api)
    proc = subprocess.Popen(
        [*CHEXFLOW, "run", "chexnet-train", "--backend", "kubernetes", "--namespace", ns,
         "--data-pvc", "data", "--pvc-host-path", str(shared), "--trainer-image", trainer_image,
         "--image-size", "64", "--timeout-seconds", "600"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not batch.list_namespaced_job(ns).items:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, out + err
    assert err.splitlines()[-1].startswith(
        "chexflow run: error: pipeline chexnet-train stopped by SIGTERM at step preprocess-op; "
        "its log: "), err
    assert "Traceback" not in err
    (run_dir,) = (shared / "runs").glob("chexnet-train-*")
    log = (run_dir / "logs" / "preprocess-op.log").read_text()
    assert "SIGTERM: deleting Job/preprocess-" in log, log[-3000:]
    assert not batch.list_namespaced_job(ns).items
    deadline = time.monotonic() + 60
    while core.list_namespaced_pod(ns).items:
        assert time.monotonic() < deadline, [p.metadata.name for p in
                                             core.list_namespaced_pod(ns).items]
        time.sleep(0.5)
