"""Faults on real pods, as a pipeline step meets them through `chexflow mpijob submit` (the
kubernetes backend): a worker pod killed mid-training, and jobs whose pods cannot start.

A killed worker: mpirun loses its rank and the launcher's attempt fails; the rendered MPIJob's
launcher is retried (restartPolicy OnFailure, runPolicy.backoffLimit 2), mpi-operator creates
the deleted worker pod again, and the retried `chexflow train` resumes from the checkpoint on
the shared volume. With backoffLimit 0 the MPIJob fails instead, and the step says why.
Bad input ends the step within the backend's short grace, with Kubernetes' reason in one line
naming the resource, and deletes the MPIJob."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexflow.envs import REPO_ROOT
from chexflow.jobs.diagnosis import BAD_INPUT_GRACE_SECONDS
from tests.cluster.conftest import generated_tfrecords

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
EPOCHS = 3


def _submit(ns: str, name: str, *options: str, command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*CHEXFLOW, "mpijob", "submit", "--name", name, "--namespace", ns, *options, "--",
         *command],
        cwd=REPO_ROOT, env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _nothing_left(k8s_api, ns: str, timeout: float = 60) -> None:
    """No MPIJob and no pod (terminating ones included) stays in the namespace."""
    from kubernetes import client

    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    deadline = time.monotonic() + timeout
    while True:
        jobs = custom.list_namespaced_custom_object("kubeflow.org", "v2beta1", ns,
                                                    "mpijobs")["items"]
        pods = core.list_namespaced_pod(ns).items
        if not jobs and not pods:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left after {timeout:.0f} s: MPIJobs "
                                 f"{[j['metadata']['name'] for j in jobs]}, pods "
                                 f"{[p.metadata.name for p in pods]}")
        time.sleep(1)


def _wait_for_epoch(proc: subprocess.Popen, state: Path, timeout: float = 900) -> int:
    """The epoch state.json records once rank 0 has checkpointed one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"submit ended before a checkpoint: {proc.communicate()}"
        try:
            return json.loads(state.read_text())["epoch"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError(f"no checkpoint in {state} after {timeout:.0f} s")


def _kill_job(ns: str, trainer_image: str, *options: str) -> subprocess.Popen:
    """`chexflow mpijob submit` of a 2-worker DenseNet-121 training, kept when it ends."""
    return _submit(
        ns, "kill", "--workers", "2", "--gpus-per-worker", "0", "--cpu", "750m", "--memory",
        "3Gi", "--pvc", "data", "--mount-path", "/data", "--image", trainer_image, "--timeout",
        "1800", "--keep", *options, command=[
            "chexflow", "train", "--launcher", "none", "--data", "/data/tfrecords", "--out",
            "/data/run", "--model", "densenet121", "--image-size", "64", "--epochs",
            str(EPOCHS), "--steps-per-epoch", "4", "--batch-size", "4", "--threads", "1"])


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _launcher(core, ns: str):
    pods = core.list_namespaced_pod(
        ns, label_selector="training.kubeflow.org/job-name=kill,"
                           "training.kubeflow.org/job-role=launcher").items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def _delete_kill_job(k8s_api, ns: str) -> None:
    from kubernetes import client

    client.CustomObjectsApi(k8s_api).delete_namespaced_custom_object(
        "kubeflow.org", "v2beta1", ns, "mpijobs", "kill", propagation_policy="Background")
    _nothing_left(k8s_api, ns)


@pytest.mark.timeout(2400)  # two DenseNet start-ups: 20 min on 2 cores shared with other work
def test_worker_pod_killed_mid_training_the_retried_launcher_resumes_from_the_checkpoint(
        k8s_api, real_namespace, trainer_image):
    """The rendered MPIJob's launcher is retried (OnFailure, backoffLimit 2) and mpi-operator
    creates the deleted worker again: the run resumes after the last checkpointed epoch."""
    from kubernetes import client

    ns, data = real_namespace
    core = client.CoreV1Api(k8s_api)
    generated_tfrecords(data)
    proc = _kill_job(ns, trainer_image)
    try:
        killed_after = _wait_for_epoch(proc, data / "run" / "checkpoints" / "state.json")
        assert killed_after < EPOCHS
        core.delete_namespaced_pod("kill-worker-1", ns, grace_period_seconds=0)
    finally:
        out, err = _finish(proc, timeout=1500)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "[kill] worker pod kill-worker-1 was deleted" in err, err
    assert "[kill] attempt 1 failed in pod kill-launcher-" in err, err
    assert "MPIJob/kill succeeded" in out
    launcher = _launcher(core, ns)
    assert launcher.status.container_statuses[0].restart_count >= 1
    log = core.read_namespaced_pod_log(launcher.metadata.name, ns, container="launcher")
    assert "; resumed after epoch " in log, log[-3000:]
    after = int(log.split("; resumed after epoch ")[1].split()[0])
    assert killed_after <= after < EPOCHS, (killed_after, after)
    assert f"from /data/run/checkpoints/ckpt-{after}" in log
    metrics = json.loads((data / "run" / "metrics.json").read_text())
    assert metrics["epochs"] == EPOCHS and metrics["workers"] == 2, metrics
    assert [h["epoch"] for h in metrics["history"]] == list(range(1, EPOCHS + 1))
    assert f"val_auroc={metrics['val_auroc']:.6g}" in log
    _delete_kill_job(k8s_api, ns)


def test_worker_pod_killed_with_backoff_limit_0_fails_the_mpijob_and_the_step_says_why(
        k8s_api, real_namespace, trainer_image):
    """runPolicy.backoffLimit 0: the launcher's first failure (mpirun lost a rank when its
    worker pod was killed) fails the MPIJob; the error's first line names the lost worker."""
    from kubernetes import client

    ns, data = real_namespace
    core = client.CoreV1Api(k8s_api)
    generated_tfrecords(data)
    proc = _kill_job(ns, trainer_image, "--backoff-limit", "0")
    try:
        deadline = time.monotonic() + 900
        while _running_ranks(core, ns) < 2:  # mpirun has started both ranks over ssh
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(1)
        core.delete_namespaced_pod("kill-worker-1", ns, grace_period_seconds=0)
    finally:
        _, err = _finish(proc, timeout=600)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    first = err[err.index("chexflow mpijob: error: "):].splitlines()[0]
    assert first.startswith(f"chexflow mpijob: error: MPIJob {ns}/kill failed ("), first
    assert "BackoffLimitExceeded" in first, first
    # the backend saw the worker go (between two polls, or not: then mpirun's own report)
    assert ("; worker pod kill-worker-1 was deleted" in first
            or f"; mpirun lost its ranks on kill-worker-1.kill.{ns}.svc" in first), first
    _delete_kill_job(k8s_api, ns)


def _running_ranks(core, ns: str) -> int:
    """Worker pods in which a `chexflow train` rank runs (started by mpirun over ssh): the real
    node's processes are this machine's, in cgroups named after their pod's uid."""
    uids = {p.metadata.uid for p in core.list_namespaced_pod(
        ns, label_selector="training.kubeflow.org/job-name=kill,"
                           "training.kubeflow.org/job-role=worker").items}
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if b"chexflow train" not in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                continue
            cgroup = (proc / "cgroup").read_text()
        except OSError:  # not a process, or it ended
            continue
        found |= {uid for uid in uids if f"/pod{uid}/" in cgroup}
    return len(found)


BAD_INPUT = {  # case: (options, what its line must hold, {job} its MPIJob's name)
    "image": (["--image", "chexflow-missing:0"],
              ["cannot start: pod {job}-worker-0 container worker: ", "chexflow-missing:0"]),
    "pvc": (["--pvc", "nope"],
            ["cannot be scheduled: pod {job}-worker-0: ",
             'persistentvolumeclaim "nope" not found']),
    "node-selector": (["--node-selector", "chexflow.io/pool=nowhere"],
                      ["cannot be scheduled: pod {job}-worker-0: ",
                       "didn't match Pod's node affinity/selector"]),
    "priority-class": (["--priority-class", "nope"],
                       ["cannot start: MPIJob {job} (MPIJobFailed): worker pod created failed: "
                        'pods "{job}-worker-0" is forbidden: no PriorityClass with name nope '
                        "was found"]),
}


def test_bad_input_ends_each_step_with_kubernetes_reason_in_one_line_and_deletes_its_mpijob(
        k8s_api, real_namespace, trainer_image):
    """The four kinds submitted at once, each as its own MPIJob `bad-CASE`: each submit ends
    after the grace with its own reason."""
    from concurrent.futures import ThreadPoolExecutor

    ns, _ = real_namespace
    start = time.monotonic()

    def submit(case: str) -> tuple[int, str, float]:
        proc = _submit(ns, f"bad-{case}", "--image", trainer_image, "--workers", "1", "--cpu",
                       "100m", "--memory", "256Mi", "--timeout", "600", *BAD_INPUT[case][0],
                       command=["chexflow", "--help"])
        try:
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, err, time.monotonic() - start

    with ThreadPoolExecutor(len(BAD_INPUT)) as pool:
        ended = dict(zip(BAD_INPUT, pool.map(submit, BAD_INPUT), strict=True))
    for case, (returncode, err, took) in ended.items():
        job = f"bad-{case}"
        assert returncode == 2, (case, err)
        assert "Traceback" not in err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"chexflow mpijob: error: MPIJob {ns}/{job} "), err
        assert line.endswith("); it was deleted"), line
        for part in BAD_INPUT[case][1]:
            assert part.format(job=job) in line, line
        if case == "image":  # the kubelet's own reason: it tried to pull, or backs off pulling
            assert "ErrImagePull: " in line or "ImagePullBackOff: " in line, line
        # the grace ended it (the line is the pods' reason, not the 600 s timeout's), not sooner
        assert took >= BAD_INPUT_GRACE_SECONDS, (case, took, line)
        assert f"[{job}] deleted MPIJob {ns}/{job}" in err
    _nothing_left(k8s_api, ns)
