"""The kubernetes job backend against RecordedRequestFakeKubeApi (a recorded-request FAKE API
server under the real kubernetes client; the real-cluster tests come with the control plane)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from chexflow.jobs import JobFailed, JobSpec, JobTimeout, Volume
from chexflow.jobs.kubernetes import KubernetesBackend, KubernetesError
from chexflow.jobs.schema import validate_mpijob
from tests.recorded_kube_fake import RecordedRequestFakeKubeApi

CRD = Path(__file__).parent / "data" / "mpijobs.kubeflow.org.v2beta1.yaml"
MPI_PATH = "/apis/kubeflow.org/v2beta1/namespaces/team-a/mpijobs"


def train_spec(name: str = "train-a", **kw) -> JobSpec:
    base = dict(
        name=name, command=["chexflow", "train", "--data", "/data/tfr", "--workers", "2"],
        workers=2, horovod=True, gpus_per_worker=1, volumes=[Volume("chexflow-data", "/data")],
        timeout_seconds=600,
    )
    return JobSpec(**{**base, **kw})


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def backend(fake: RecordedRequestFakeKubeApi, **kw) -> tuple[KubernetesBackend, io.StringIO]:
    out = io.StringIO()
    clock = FakeClock()
    b = KubernetesBackend(
        namespace="team-a", api_client=fake.api_client(), poll_seconds=5, stream=out,
        sleep=clock.sleep, clock=clock, watch=False, **kw,
    )
    return b, out


def test_mpijob_success_creates_valid_object_waits_and_deletes():
    fake = RecordedRequestFakeKubeApi()
    b, out = backend(fake)
    result = b.run(train_spec())
    assert result.succeeded and result.resource == "MPIJob/train-a"
    methods = [(r.method, r.path) for r in fake.requests]
    assert methods[0] == ("POST", MPI_PATH)
    assert ("GET", f"{MPI_PATH}/train-a") in methods
    assert methods[-1] == ("DELETE", f"{MPI_PATH}/train-a")  # delete_policy on-success
    posted = fake.requests[0].body
    validate_mpijob(posted, CRD)
    assert posted["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert "Succeeded" in out.getvalue()


def test_failure_raises_with_launcher_log_tail_and_keeps_job():
    fake = RecordedRequestFakeKubeApi(
        scripts={"train-b": [["Created"], ["Created", "Running"], ["Created", "Failed"]]},
        logs={"train-b": "epoch 1/1\n[1]<stderr>: ValueError: bad shard /data/x.tfrecord\n"},
        failures={"train-b": ("BackoffLimitExceeded", "launcher exited with code 1")},
    )
    b, _ = backend(fake)
    with pytest.raises(JobFailed) as err:
        b.run(train_spec("train-b"))
    msg = str(err.value)
    assert "ValueError: bad shard /data/x.tfrecord" in msg
    assert "BackoffLimitExceeded" in msg and "launcher exited with code 1" in msg
    log_req = [r for r in fake.requests if r.path.endswith("/log")]
    assert log_req and log_req[0].path.endswith("/pods/train-b-launcher/log")
    assert log_req[0].query["container"] == "launcher"
    selectors = [r.query["labelSelector"] for r in fake.requests if r.path.endswith("/pods")]
    # while waiting: the job's pods (are they schedulable?); on failure: the launcher's
    assert selectors[0] == "training.kubeflow.org/job-name=train-b"
    assert selectors[-1] == ("training.kubeflow.org/job-name=train-b,"
                             "training.kubeflow.org/job-role=launcher")
    assert ("team-a", "train-b") in fake.jobs  # on-success policy keeps failed jobs to inspect


def test_wait_timeout_deletes_the_job_and_says_so():
    fake = RecordedRequestFakeKubeApi(scripts={"slow": [["Created", "Running"]]})
    b, _ = backend(fake)
    with pytest.raises(JobTimeout, match=r"not finished after .*Running.*deleted"):
        b.run(train_spec("slow", timeout_seconds=30))
    assert ("team-a", "slow") not in fake.jobs
    assert fake.requests[-1].method == "DELETE"


def test_deadline_exceeded_condition_is_a_timeout():
    fake = RecordedRequestFakeKubeApi(
        scripts={"dl": [["Created", "Running", "Failed"]]},
        failures={"dl": ("DeadlineExceeded", "Job was active longer than specified deadline")},
    )
    b, _ = backend(fake, delete_policy="always")
    with pytest.raises(JobTimeout, match="DeadlineExceeded"):
        b.run(train_spec("dl"))
    assert ("team-a", "dl") not in fake.jobs


def test_transient_errors_are_retried():
    fake = RecordedRequestFakeKubeApi(
        inject=[("POST", "mpijobs$", 503), ("GET", "mpijobs/train-c$", 500),
                ("GET", "mpijobs/train-c$", 429)],
    )
    b, out = backend(fake)
    assert b.run(train_spec("train-c")).succeeded
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 2
    assert "retry 1/5" in out.getvalue()


def test_conflict_adopts_same_spec_and_refuses_a_different_one():
    fake = RecordedRequestFakeKubeApi()
    b, out = backend(fake, delete_policy="never")
    b.run(train_spec("train-d"))
    fake.jobs[("team-a", "train-d")].gets = 0
    assert b.run(train_spec("train-d")).succeeded  # a retried step finds its own job
    assert "already exists: waiting on it" in out.getvalue()
    with pytest.raises(KubernetesError, match="already exists with a different spec"):
        b.run(train_spec("train-d", workers=4))


def test_batch_job_for_single_process_steps():
    fake = RecordedRequestFakeKubeApi(scripts={"prep": [[], ["Succeeded"]]})
    b, _ = backend(fake)
    spec = JobSpec(name="prep", command=["chexflow", "preprocess", "--out", "/data/t"],
                   volumes=[Volume("chexflow-data", "/data")])
    assert b.run(spec).resource == "Job/prep"
    post = fake.requests[0]
    assert post.path == "/apis/batch/v1/namespaces/team-a/jobs"
    assert post.body["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert post.body["spec"]["activeDeadlineSeconds"] == spec.timeout_seconds


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return path


def test_client_loader_prefers_kubeconfig_then_the_pod_then_says_what_is_missing(
        tmp_path, monkeypatch):
    from chexflow.kube import load_api_client

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kc", "https://10.1.2.3:6443")))
    assert load_api_client().configuration.host == "https://10.1.2.3:6443"
    # in a pod (the kubelet's variables) an explicit KUBECONFIG still wins
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert load_api_client().configuration.host == "https://10.1.2.3:6443"
    # in a pod without one: the service account (absent here, so its error, not a kubeconfig's)
    monkeypatch.delenv("KUBECONFIG")
    with pytest.raises(KubernetesError, match="no Kubernetes configuration .*token"):
        load_api_client()
    # outside a pod, with no kubeconfig: one clear line
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(KubernetesError, match="set KUBECONFIG"):
        load_api_client()


def test_one_finished_condition_for_mpijobs_jobs_and_experiments():
    from chexflow.kube import finished_condition

    running = [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]
    done = {"type": "Succeeded", "status": "True", "reason": "JobSucceeded"}
    assert finished_condition(running, "MPIJob") is None
    assert finished_condition([*running, done], "MPIJob") == done
    assert finished_condition([*running, done], "Experiment") == done
    assert finished_condition([*running, done], "Job") is None
    complete = {"type": "Complete", "status": "True"}
    assert finished_condition([complete], "Job") == complete
    assert finished_condition([{"type": "Failed", "status": "False"}], "Job") is None


def test_sigterm_while_waiting_deletes_the_job_and_raises_one_line():
    """A KFP run terminated sends the step's process SIGTERM: the backend deletes the MPIJob
    (its pods go with it) and ends with JobCancelled; the SIGTERM handler is restored."""
    import os
    import signal

    from chexflow.jobs import JobCancelled

    fake = RecordedRequestFakeKubeApi(scripts={"train-s": [["Created", "Running"]] * 100})
    b, out = backend(fake)
    polls = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    b.sleep = sleep
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(JobCancelled) as err:
        b.run(train_spec("train-s"))
    assert str(err.value) == "stopped by SIGTERM: deleted MPIJob team-a/train-s and its pods"
    delete = fake.requests[-1]
    assert (delete.method, delete.path) == ("DELETE", f"{MPI_PATH}/train-s")
    assert delete.body["propagationPolicy"] == "Background"
    assert "SIGTERM: deleting MPIJob/train-s" in out.getvalue()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_restarted_launcher_attempt_is_reported_once_with_its_previous_log():
    """restartPolicy OnFailure restarts the launcher container in its pod, and the Job
    controller deletes that pod when the backoff limit is reached: the failed attempt's log
    (previous container) is read when the restart is seen and kept for the final error."""
    from kubernetes.client import (
        V1ContainerState,
        V1ContainerStateRunning,
        V1ContainerStateTerminated,
        V1ContainerStatus,
        V1ObjectMeta,
        V1Pod,
        V1PodStatus,
    )

    from chexflow.jobs.render import LAUNCHER_ROLE_LABEL

    fake = RecordedRequestFakeKubeApi(logs={"train-r": "ssh: connect to host train-r-worker-1 "
                                                      "port 2222: Connection refused\n"})
    b, out = backend(fake)
    status = V1ContainerStatus(
        name="launcher", image="i", image_id="", ready=True, restart_count=1,
        last_state=V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=255,
                                                                          reason="Error")),
        state=V1ContainerState(running=V1ContainerStateRunning()))
    pod = V1Pod(metadata=V1ObjectMeta(name="train-r-launcher-x1",
                                      labels={LAUNCHER_ROLE_LABEL: "launcher"}),
                status=V1PodStatus(phase="Running", container_statuses=[status]))
    b.note_failed_attempts("MPIJob", "train-r", [pod])
    b.note_failed_attempts("MPIJob", "train-r", [pod])  # the same attempt, seen again
    line = "attempt 1 failed in pod train-r-launcher-x1 (exit code 255: Error)"
    assert out.getvalue().count(line) == 1
    logs = [r for r in fake.requests if r.path.endswith("/log")]
    assert len(logs) == 1 and logs[0].query["previous"] is True
    assert "Connection refused" in list(b.failed_attempts.values())[0]


def waiting_pod(reason: str, message: str) -> dict:
    return {"phase": "Pending", "containerStatuses": [{
        "name": "main", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message}}}]}


def unschedulable_pod(message: str) -> dict:
    return {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message}]}


PULL = ('Back-off pulling image "chexflow-missing:0": ErrImagePull: failed to pull and unpack '
        'image "docker.io/library/chexflow-missing:0": dial tcp: lookup registry-1.docker.io: '
        'no such host')
NO_PVC = ('0/5 nodes are available: persistentvolumeclaim "nope" not found. preemption: 0/5 '
          'nodes are available: 5 Preemption is not helpful for scheduling.')
NO_CPU = "0/5 nodes are available: 5 Insufficient cpu. preemption: 0/5 nodes are available."


@pytest.mark.parametrize("status, error, seconds, line", [
    (waiting_pod("ImagePullBackOff", PULL), "JobCannotStart", 30,
     f"Job team-a/p cannot start: pod p-pod container main: ImagePullBackOff: {PULL} (for 30s); "
     f"it was deleted"),
    (waiting_pod("ErrImageNeverPull", 'Container image "x:1" is not present with pull policy of '
                 'Never'), "JobCannotStart", 0,
     'Job team-a/p cannot start: pod p-pod container main: ErrImageNeverPull: Container image '
     '"x:1" is not present with pull policy of Never (for 0s); it was deleted'),
    (unschedulable_pod(NO_PVC), "JobUnschedulable", 30,
     f"Job team-a/p cannot be scheduled: pod p-pod: {NO_PVC} (unschedulable for 30s); it was "
     f"deleted"),
    (unschedulable_pod(NO_CPU), "JobUnschedulable", 300,
     f"Job team-a/p cannot be scheduled: pod p-pod: {NO_CPU} (unschedulable for 300s; it asks "
     f"for more than any node offers, or the cluster is full); it was deleted"),
], ids=["image-pull-backoff", "image-never-pull", "missing-pvc", "no-room"])
def test_a_pod_that_cannot_start_ends_the_wait_after_its_grace_with_one_line(
        status, error, seconds, line):
    """Bad input ends the step with Kubernetes' reason in one line, after a short grace
    (ErrImageNeverPull at once), a full cluster only after the long one; the job is deleted."""
    from chexflow.jobs import kubernetes

    fake = RecordedRequestFakeKubeApi(scripts={"p": [[]]}, pod_status={"p": status})
    b, out = backend(fake)
    with pytest.raises(getattr(kubernetes, error)) as err:
        b.run(JobSpec(name="p", command=["chexflow", "evaluate"], timeout_seconds=3600))
    assert str(err.value) == line
    assert b.clock() == seconds
    assert out.getvalue().count("cannot ") == 1  # "cannot start/be scheduled yet", once
    assert fake.requests[-1].method == "DELETE" and ("team-a", "p") not in fake.jobs


@pytest.mark.parametrize("kind, reason, message", [
    ("Job", "FailedCreate", 'Error creating: pods "p-" is forbidden: no PriorityClass with name '
                            'nope was found'),
    ("MPIJob", "MPIJobFailed", 'worker pod created failed: pods "p-worker-0" is forbidden: no '
                               'PriorityClass with name nope was found'),
])
def test_pods_the_apiserver_refuses_end_the_wait_with_the_controllers_event(
        kind, reason, message):
    """No pod exists (admission refused it): the Job controller's or mpi-operator's event
    says why, in one line, after the short grace."""
    from chexflow.jobs.kubernetes import JobCannotStart

    fake = RecordedRequestFakeKubeApi(scripts={"p": [["Created"]]}, pod_status={"p": None},
                                      failures={"p": (reason, message)})
    b, _ = backend(fake)
    spec = train_spec("p") if kind == "MPIJob" else JobSpec(name="p", command=["chexflow", "x"])
    with pytest.raises(JobCannotStart) as err:
        b.run(spec)
    assert str(err.value) == (f"{kind} team-a/p cannot start: {kind} p ({reason}): {message} "
                              f"(for 30s); it was deleted")
    assert ("team-a", "p") not in fake.jobs


def test_a_deleted_or_failed_worker_pod_is_reported_once_and_named_in_the_failure():
    from kubernetes.client import (
        V1ContainerState,
        V1ContainerStateTerminated,
        V1ContainerStatus,
        V1ObjectMeta,
        V1Pod,
        V1PodStatus,
    )

    from chexflow.jobs.render import LAUNCHER_ROLE_LABEL

    def worker(uid: str, deleting: bool = False, phase: str = "Running") -> V1Pod:
        ended = V1ContainerStatus(
            name="worker", image="i", image_id="", ready=False, restart_count=0,
            state=V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=137)))
        return V1Pod(metadata=V1ObjectMeta(name="t-worker-1", uid=uid,
                                           labels={LAUNCHER_ROLE_LABEL: "worker"},
                                           deletion_timestamp="x" if deleting else None),
                     status=V1PodStatus(phase=phase, container_statuses=[ended]))

    fake = RecordedRequestFakeKubeApi()
    b, out = backend(fake)
    for pods in ([worker("a")], [worker("a", deleting=True)], [worker("a", deleting=True)],
                 [worker("b")], [worker("b", phase="Failed")], [worker("b", phase="Failed")]):
        b.note_workers("t", pods)
    assert list(b._incidents.values()) == [
        "worker pod t-worker-1 was deleted",
        "worker pod t-worker-1 failed (container worker: exit code 137)"]
    assert out.getvalue().count("worker pod t-worker-1") == 2
    # a worker replaced between two polls (its deletion not seen) is still reported
    b._incidents, b._workers = {}, {}
    b.note_workers("t", [worker("a")])
    b.note_workers("t", [worker("c")])
    assert list(b._incidents.values()) == ["worker pod t-worker-1 was deleted and created again"]
    # a worker gone between two polls (grace period 0) and not created again yet is reported;
    # an empty pod list (the API did not answer) tells nothing
    launcher = V1Pod(metadata=V1ObjectMeta(name="t-launcher-x", uid="l",
                                           labels={LAUNCHER_ROLE_LABEL: "launcher"}))
    b._incidents, b._workers = {}, {}
    b.note_workers("t", [worker("a"), launcher])
    b.note_workers("t", [])
    assert b._incidents == {}
    b.note_workers("t", [launcher])
    b.note_workers("t", [worker("d"), launcher])
    assert list(b._incidents.values()) == ["worker pod t-worker-1 was deleted"]


def test_a_failure_after_mpirun_lost_a_worker_names_that_worker_in_its_first_line():
    """A worker pod killed mid-run: OpenMPI's mpirun loses its daemon there and the launcher
    fails; with no retry left, the error's first line says which worker was lost."""
    lost = ("Connection to t-worker-1.t.team-a.svc closed by remote host.\n" + "-" * 74 +
            "\nORTE has lost communication with a remote daemon.\n\n  HNP daemon   : "
            "[[16327,0],0] on node t-launcher\n  Remote daemon: [[16327,0],2] on node "
            "t-worker-1.t.team-a.svc\n\nThis is usually due to either a failure of the TCP\n")
    fake = RecordedRequestFakeKubeApi(
        scripts={"t": [["Created", "Running"], ["Created", "Failed"]]},
        failures={"t": ("BackoffLimitExceeded", "Job has reached the specified backoff limit")})
    b, _ = backend(fake)
    b.log_tail = lambda kind, name: lost  # the pod log as the API serves it (the fake's is repr)
    with pytest.raises(JobFailed) as err:
        b.run(train_spec("t", backoff_limit=0))
    assert str(err.value).splitlines()[0] == (
        "MPIJob team-a/t failed (BackoffLimitExceeded: Job has reached the specified backoff "
        "limit); mpirun lost its ranks on t-worker-1.t.team-a.svc")


def gang_worker(job: str, index: int, pods_now: int, min_member: int) -> dict:
    """A worker that scheduler-plugins' Coscheduling keeps Pending: too few pods for its gang."""
    message = (f"0/2 nodes are available: pre-filter pod {job}-worker-{index} cannot find enough "
               f"sibling pods, current pods number: {pods_now}, minMember of group: "
               f"{min_member}.")
    return {"metadata": {"name": f"{job}-worker-{index}", "namespace": "team-a",
                         "labels": {"training.kubeflow.org/job-role": "worker"},
                         "creationTimestamp": "2026-11-22T00:00:01Z"},
            "status": unschedulable_pod(message)}


def test_workers_whose_gang_waits_for_the_launcher_end_the_wait_at_once_saying_why():
    """A gang scheduler's PodGroup larger than the workers (here --min-available 3 with 2
    workers) waits for a launcher that mpi-operator creates only once the workers are ready:
    no wait clears it, and the line says what to set."""
    from chexflow.jobs.kubernetes import JobUnschedulable
    from chexflow.jobs.spec import ClusterOptions

    pods = [gang_worker("g", i, 2, 3) for i in range(2)]
    fake = RecordedRequestFakeKubeApi(scripts={"g": [["Created"]]}, pods={"g": pods})
    b, out = backend(fake, options=ClusterOptions(gang_scheduling=True, min_available=3))
    with pytest.raises(JobUnschedulable) as err:
        b.run(train_spec("g"))
    assert str(err.value) == (
        "MPIJob team-a/g cannot be scheduled: pod g-worker-0: its gang never forms: the gang "
        "scheduler's PodGroup waits for 3 pods together, but only the 2 worker(s) come before "
        "the launcher, which mpi-operator creates once they are ready (launcherCreationPolicy "
        "WaitForWorkersReady); set runPolicy.schedulingPolicy.minAvailable to 2, as `chexflow "
        f"mpijob render` does (the scheduler: {pods[0]['status']['conditions'][0]['message']}) "
        "(unschedulable for 0s); it was deleted")
    assert b.clock() == 0
    assert ("team-a", "g") not in fake.jobs
    # one of 2 workers created so far (minMember 2): a moment of the start, given the grace
    fake = RecordedRequestFakeKubeApi(scripts={"g": [["Created"]]},
                                      pods={"g": [gang_worker("g", 0, 1, 2)]})
    b, _ = backend(fake)
    with pytest.raises(JobUnschedulable) as err:
        b.run(train_spec("g"))
    assert "gang never forms" not in str(err.value) and b.clock() == 30


@pytest.mark.parametrize("phase, says", [("Terminating", "is being deleted"),
                                         (None, "was deleted")])
def test_a_job_whose_namespace_is_deleted_under_it_is_reported_as_that(phase, says):
    """mpi-operator marks the MPIJob Failed (BackoffLimitExceeded) as the namespace's deletion
    takes its pods: the line names the namespace's deletion, not the job's failure."""
    fake = RecordedRequestFakeKubeApi(
        scripts={"t": [["Created", "Running"], ["Created", "Failed"]]},
        failures={"t": ("BackoffLimitExceeded", "Job has reached the specified backoff limit")},
        namespaces={"team-a": phase})
    b, _ = backend(fake)
    with pytest.raises(JobFailed) as err:
        b.run(train_spec("t"))
    assert str(err.value) == (
        f"MPIJob team-a/t did not finish: namespace team-a {says} while it ran, and its pods "
        "with it (the MPIJob's last condition: Failed, BackoffLimitExceeded)")


def test_workers_deleted_with_their_terminating_namespace_end_the_wait_at_once():
    """The namespace is being deleted, its pods go, and the MPIJob still says Running (the
    namespace controller has not reached it): the wait ends there, naming the namespace."""
    from chexflow.jobs.render import LAUNCHER_ROLE_LABEL

    worker = {"metadata": {"name": "t-worker-0", "namespace": "team-a", "uid": "w0",
                           "labels": {LAUNCHER_ROLE_LABEL: "worker"},
                           "deletionTimestamp": "2026-11-22T00:00:02Z"},
              "status": {"phase": "Running"}}
    fake = RecordedRequestFakeKubeApi(scripts={"t": [["Created", "Running"]]},
                                      pods={"t": [worker]}, namespaces={"team-a": "Terminating"})
    b, out = backend(fake)
    with pytest.raises(JobFailed) as err:
        b.run(train_spec("t"))
    assert str(err.value) == ("MPIJob team-a/t did not finish: namespace team-a is being "
                              "deleted while it ran, and its pods with it")
    assert "[t] worker pod t-worker-0 was deleted" in out.getvalue()


def test_a_job_gone_while_waiting_is_one_line_naming_why():
    from kubernetes.client.rest import ApiException

    fake = RecordedRequestFakeKubeApi(scripts={"t": [["Created", "Running"]]})
    b, _ = backend(fake)
    real_get = b.get
    calls = []

    def get(kind, name):
        calls.append(name)
        if len(calls) > 1:  # deleted by someone else after the first poll
            fake.jobs.pop(("team-a", name), None)
        return real_get(kind, name)

    b.get = get
    with pytest.raises(JobFailed) as err:
        b.run(train_spec("t"))
    assert str(err.value) == "MPIJob team-a/t was deleted while it ran (not by chexflow)"
    fake.namespaces["team-a"] = None
    fake.jobs.clear()
    calls.clear()
    with pytest.raises(JobFailed) as err:
        b.run(train_spec("t"))
    assert str(err.value) == ("MPIJob team-a/t did not finish: namespace team-a was deleted "
                              "while it ran, and its pods with it")
    assert not isinstance(err.value.__cause__, ApiException)


TRAINJOB_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"


def test_trainjob_kind_creates_a_trainjob_follows_complete_and_deletes_it():
    fake = RecordedRequestFakeKubeApi(logs={"train-t": "val_auroc=0.61\n"})
    b, out = backend(fake, job_kind="trainjob")
    result = b.run(train_spec("train-t"))
    assert result.succeeded and result.resource == "TrainJob/train-t"
    methods = [(r.method, r.path) for r in fake.requests]
    assert methods[0] == ("GET", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/"
                                 "chexflow-horovod")
    assert methods[1] == ("POST", TRAINJOB_PATH)
    assert methods[-1] == ("DELETE", f"{TRAINJOB_PATH}/train-t")
    assert fake.requests[1].body["spec"]["trainer"]["numNodes"] == 2
    pod_lists = [r for r in fake.requests if r.path.endswith("/pods")]
    assert pod_lists[0].query["labelSelector"] == "jobset.sigs.k8s.io/jobset-name=train-t"
    assert "val_auroc=0.61" in result.log_tail
    assert "TrainJob condition: Complete" in out.getvalue()


def test_trainjob_failure_raises_with_the_trainjobs_reason():
    fake = RecordedRequestFakeKubeApi(
        scripts={"train-f": [[], ["Failed"]]}, logs={"train-f": "mpirun: rank 1 exited\n"},
        failures={"train-f": ("JobSetFailed", "jobset train-f failed")})
    b, _ = backend(fake, job_kind="trainjob")
    with pytest.raises(JobFailed, match=r"TrainJob team-a/train-f failed \(JobSetFailed"):
        b.run(train_spec("train-f"))


def test_a_missing_runtime_is_one_line_and_nothing_is_created():
    fake = RecordedRequestFakeKubeApi(runtimes=set())
    b, _ = backend(fake, job_kind="trainjob", runtime="horovod-x")
    with pytest.raises(KubernetesError) as err:
        b.run(train_spec("train-m"))
    assert str(err.value) == ("ClusterTrainingRuntime horovod-x not found: apply it first "
                              "(kubectl apply -f horovod-runtime.yaml from chexflow's trainjob/)")
    assert [r.method for r in fake.requests] == ["GET"]  # nothing created, nothing deleted


def test_a_trainjob_whose_image_is_not_its_runtimes_node_image_is_refused_before_creating():
    """Trainer sets only the launcher's image from spec.trainer.image: a TrainJob in another
    image than the runtime's `node` pods would run two images; refused in one line, nothing
    created. The same image goes on."""
    fake = RecordedRequestFakeKubeApi(runtime_image="reg.example/team/trainer:a")
    b, _ = backend(fake, job_kind="trainjob", image="reg.example/team/trainer:b")
    with pytest.raises(KubernetesError) as err:
        b.run(train_spec("train-i"))
    assert str(err.value).startswith(
        "ClusterTrainingRuntime chexflow-horovod runs its node pods in "
        "reg.example/team/trainer:a, but the TrainJob's spec.trainer.image (its launcher's) is "
        "reg.example/team/trainer:b: ")
    assert "chexflow images render --out DIR" in str(err.value) and "\n" not in str(err.value)
    assert [r.method for r in fake.requests] == ["GET"]
    fake = RecordedRequestFakeKubeApi(runtime_image="reg.example/team/trainer:b",
                                      logs={"train-i": "val_auroc=0.6\n"})
    b, _ = backend(fake, job_kind="trainjob", image="reg.example/team/trainer:b")
    assert b.run(train_spec("train-i")).succeeded
