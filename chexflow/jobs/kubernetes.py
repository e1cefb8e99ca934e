"""The kubernetes backend: create an MPIJob (Horovod jobs; or a Kubeflow Trainer v2 TrainJob with
job_kind="trainjob": trainjob.py) or a batch Job, wait until it has Succeeded or Failed (a
TrainJob: Complete or Failed), raise with the launcher pod's log tail on failure, then delete
or keep it.
A launcher attempt that fails and is retried (runPolicy.backoffLimit) is reported as it happens,
and its log kept: the Job controller deletes an OnFailure pod when it gives up. A worker pod that
is deleted or fails is reported too (mpi-operator recreates a deleted one, and the retried
launcher's command resumes from its checkpoint).
Pods that cannot start end the wait with one line naming the pod and Kubernetes' own reason: an
image the kubelet cannot pull, a missing PVC or a node selector nothing matches (the scheduler's
message), pods the apiserver refuses (e.g. no such PriorityClass: the Job controller's or
mpi-operator's event). Kubernetes retries all of these, so each gets a grace period first: short
for what the job's spec got wrong, long when the cluster is only full.
Stopping the process (SIGTERM: a KFP run terminated, a pod deleted; Ctrl-C) deletes the job with
its pods (propagation Background) before it exits: nothing keeps running.
A job whose namespace is deleted while it runs (seen when its workers go, or when it fails or
vanishes: the namespace is read then) is reported as that, not as the job's own failure.

A TrainJob's pods are its JobSet's (labelled jobset.sigs.k8s.io/jobset-name): the `launcher`
replicated job's pod runs mpirun, the `node` pods are its workers; deleting the TrainJob deletes
the JobSet and its pods.

Uses the official client: CustomObjectsApi (kubeflow.org/v2beta1 mpijobs,
trainer.kubeflow.org/v1alpha1 trainjobs), BatchV1Api (jobs),
CoreV1Api (pods, pod logs, events). 409 Conflict adopts the job when it is the same spec (a
retried pipeline step) and refuses otherwise; 429/5xx and connection errors are retried.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import chexflow.jobs.diagnosis as diagnosis
from chexflow.errors import ChexflowError
from chexflow.jobs.capacity import never_fits, node_gpus, pod_gpus
from chexflow.jobs.diagnosis import (
    BAD_INPUT_GRACE_SECONDS,
    Blocker,
    ended_attempts,
    gang_never_forms,
    latest_condition,
    lost_rank,
    one_line,
    pod_blockers,
    pod_end,
    refused_pods,
)
from chexflow.jobs.queueing import QueueError, check_local_queue, queue_state, workloads
from chexflow.jobs.render import (
    JOB_NAME_LABEL,
    LAUNCHER_ROLE_LABEL,
    MPIJOB_GROUP,
    MPIJOB_PLURAL,
    MPIJOB_VERSION,
    render,
)
from chexflow.jobs.result import JobResult
from chexflow.jobs.signals import Terminated, ignore_sigterm, sigterm_raises
from chexflow.jobs.spec import (
    JOB_KINDS,
    ClusterOptions,
    JobCancelled,
    JobFailed,
    JobSpec,
    JobTimeout,
)
from chexflow.jobs.trainjob import CONTAINER as TRAINJOB_CONTAINER
from chexflow.jobs.trainjob import (
    JOBSET_LABEL,
    REPLICATED_JOB_LABEL,
    RUNTIME_FILE,
    RUNTIME_NAME,
    RUNTIME_PLURAL,
    TRAINJOB_GROUP,
    TRAINJOB_PLURAL,
    TRAINJOB_VERSION,
    render_trainjob,
    runtime_image_mismatch,
)
from chexflow.kube import (
    TRANSIENT_STATUS,
    KubernetesError,
    api_message,
    finished_condition,
    load_api_client,
)

DELETE_POLICIES = ("always", "on-success", "never")
# the custom resources this backend creates: kind -> (group, version, plural)
CUSTOM_KINDS = {"MPIJob": (MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL),
                "TrainJob": (TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL)}
SPEC_HASH_ANNOTATION = "chexflow.io/spec-sha256"
LOG_TAIL_LINES = 60


class JobCannotStart(JobFailed):
    """The job's pods could not start (image, volume, scheduling, admission); it was deleted."""


class JobUnschedulable(JobCannotStart):
    """The job's pods stayed unschedulable (e.g. more GPUs per worker than any node has)."""


def pod_role(pod) -> str:
    """`launcher` or `worker`: an MPIJob's pods by mpi-operator's role label, a TrainJob's by
    their JobSet replicated job (`node` pods are the workers), a Job's pod is a launcher."""
    labels = pod.metadata.labels or {}
    if REPLICATED_JOB_LABEL in labels:
        return "worker" if labels[REPLICATED_JOB_LABEL] == "node" else "launcher"
    return labels.get(LAUNCHER_ROLE_LABEL, "launcher")


def spec_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj["spec"], sort_keys=True).encode()).hexdigest()[:32]


class KubernetesBackend:
    """Runs JobSpecs as MPIJobs / batch Jobs in one namespace."""

    name = "kubernetes"

    def __init__(
        self,
        namespace: str = "default",
        api_client=None,
        delete_policy: str = "on-success",
        poll_seconds: float = 5.0,
        image: str | None = None,
        service_account: str | None = None,
        clean_pod_policy: str = "Running",
        options: ClusterOptions | None = None,
        retries: int = 5,
        stream: TextIO | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        watch: bool = True,
        job_kind: str | None = None,
        runtime: str | None = None,
    ):
        if delete_policy not in DELETE_POLICIES:
            raise ChexflowError(f"delete_policy must be one of {DELETE_POLICIES}")
        self.options = options or ClusterOptions()
        # the kind a Horovod job runs as: `job_kind` if given, else the options' (a pipeline's)
        self.job_kind = job_kind or self.options.job_kind
        if self.job_kind not in JOB_KINDS:
            raise ChexflowError(f"job_kind {self.job_kind!r}: expected one of "
                                f"{', '.join(JOB_KINDS)}")
        self.runtime = runtime or RUNTIME_NAME  # a TrainJob's ClusterTrainingRuntime
        from kubernetes import client

        self.api_client = api_client or load_api_client()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.namespace = namespace
        self.delete_policy = delete_policy
        self.poll_seconds = poll_seconds
        self.image = image
        self.service_account = service_account
        self.clean_pod_policy = clean_pod_policy
        self.failed_attempts: dict[str, str] = {}  # pod/attempt -> its log tail
        self._incidents: dict[str, str] = {}  # what happened to worker pods, once each
        self._workers: dict[str, str] = {}  # worker pod name -> uid last seen
        self.retries = retries
        self.stream = stream or sys.stdout
        self.sleep = sleep
        self.clock = clock
        self.watch = watch  # follow pod events between polls (off: sleep)
        self._pods_version: str | None = None  # resourceVersion of the last pod list

    # --- public ---------------------------------------------------------------------------
    def render(self, spec: JobSpec) -> dict[str, Any]:
        if spec.horovod and self.job_kind == "trainjob":
            obj = render_trainjob(spec, self.namespace, image=self.image, runtime=self.runtime,
                                  options=self.options)
            obj["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = spec_hash(obj)
            return obj
        kwargs: dict[str, Any] = {"image": self.image, "service_account": self.service_account,
                                  "options": self.options}
        if spec.horovod:
            kwargs["clean_pod_policy"] = self.clean_pod_policy
        obj = render(spec, self.namespace, **kwargs)
        obj["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = spec_hash(obj)
        return obj

    def run(self, spec: JobSpec) -> JobResult:
        obj = self.render(spec)
        kind = obj["kind"]
        if kind == "TrainJob":  # before anything is created: nothing to delete then
            self.check_runtime(obj["spec"]["runtimeRef"]["name"], obj)
        start = self.clock()
        self.failed_attempts, self._incidents, self._workers = {}, {}, {}
        if self.options.queue:  # before anything is created
            check_local_queue(self.custom, self.namespace, self.options.queue)
        with sigterm_raises():
            try:
                self.create(obj)
                cond = self.wait(obj, spec.timeout_seconds + diagnosis.SCHEDULING_GRACE_SECONDS)
            except BaseException as e:
                # Timed out, unschedulable, stopped (SIGTERM, Ctrl-C) or broken: do not leave
                # the job running; a SIGTERM now must not cut the deletion short.
                ignore_sigterm()
                if isinstance(e, Terminated):
                    self._log(spec.name, f"SIGTERM: deleting {kind}/{spec.name}")
                elif not isinstance(e, JobFailed):
                    self._log(spec.name, f"interrupted: deleting {kind}/{spec.name}")
                self.delete(kind, spec.name)
                if isinstance(e, Terminated):
                    raise JobCancelled(f"stopped by SIGTERM: deleted {kind} {self.namespace}/"
                                       f"{spec.name} and its pods") from None
                raise
        wall = self.clock() - start
        tail = self.log_tail(kind, spec.name)
        if not tail.strip() and self.failed_attempts:  # the last attempt's pod is gone
            tail = list(self.failed_attempts.values())[-1]
        if cond["type"] == "Failed":  # the job's own failure, or its namespace's deletion?
            self.check_namespace(kind, spec.name,
                                 f"Failed, {cond.get('reason') or 'no reason'}")
            events = self.events(spec.name)
            if self.delete_policy == "always":
                self.delete(kind, spec.name)
            reason = cond.get("reason", "")
            message = f"{kind} {self.namespace}/{spec.name} failed"
            message += f" ({reason}: {cond.get('message', '')})" if reason else ""
            lost = lost_rank(tail)
            incidents = [*self._incidents.values(), *([lost] if lost else [])]
            message += "".join(f"; {incident}" for incident in dict.fromkeys(incidents))
            if events:
                message += "\nevents:\n" + "\n".join(events)
            error = JobTimeout if reason == "DeadlineExceeded" else JobFailed
            raise error(message, tail)
        if self.delete_policy in ("always", "on-success"):
            self.delete(kind, spec.name)
        return JobResult(
            name=spec.name,
            backend=self.name,
            succeeded=True,
            wall_seconds=wall,
            log_tail=tail,
            resource=f"{kind}/{spec.name}",
        )

    # --- steps ----------------------------------------------------------------------------
    def create(self, obj: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            if kind in CUSTOM_KINDS:
                self._call(self.custom.create_namespaced_custom_object,
                           *CUSTOM_KINDS[kind][:2], self.namespace, CUSTOM_KINDS[kind][2], obj)
            else:
                self._call(self.batch.create_namespaced_job, self.namespace, obj)
            self._log(name, f"created {kind} {self.namespace}/{name}")
        except ApiException as e:
            if e.status != 409:
                raise KubernetesError(
                    f"creating {kind} {self.namespace}/{name}: HTTP {e.status} {e.reason}: "
                    f"{api_message(e)}"
                ) from None
            existing = self.get(kind, name)
            theirs = existing["metadata"].get("annotations", {}).get(SPEC_HASH_ANNOTATION)
            ours = obj["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
            if theirs != ours:
                raise KubernetesError(
                    f"{kind} {self.namespace}/{name} already exists with a different spec; "
                    f"delete it (kubectl delete {kind.lower()} -n {self.namespace} {name}) or "
                    f"choose another job name"
                ) from None
            self._log(name, f"{kind} {self.namespace}/{name} already exists: waiting on it")

    def check_runtime(self, runtime: str, trainjob: dict[str, Any]) -> None:
        """KubernetesError in one line when ClusterTrainingRuntime `runtime` is missing (Trainer's
        webhook would refuse the TrainJob with a long dump of its runtimeRef), or runs its node
        pods in another image than the TrainJob's launcher (trainjob.runtime_image_mismatch)."""
        from kubernetes.client.rest import ApiException

        try:
            found = self._call(self.custom.get_cluster_custom_object, TRAINJOB_GROUP,
                               TRAINJOB_VERSION, RUNTIME_PLURAL, runtime)
        except ApiException as e:
            if e.status == 404 and f'"{runtime}" not found' not in api_message(e):
                raise KubernetesError("the cluster has no Kubeflow Trainer v2 (no "
                                      "ClusterTrainingRuntime API): install Trainer, or use "
                                      "--job-kind mpijob") from None
            if e.status == 404:
                raise KubernetesError(f"ClusterTrainingRuntime {runtime} not found: apply it "
                                      f"first (kubectl apply -f {RUNTIME_FILE.name} from "
                                      "chexflow's trainjob/)") from None
            raise KubernetesError(f"reading ClusterTrainingRuntime {runtime}: HTTP {e.status} "
                                  f"{e.reason}: {api_message(e)}") from None
        mismatch = runtime_image_mismatch(found, trainjob)
        if mismatch:
            raise KubernetesError(mismatch)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        if kind in CUSTOM_KINDS:
            return self._call(self.custom.get_namespaced_custom_object,
                              *CUSTOM_KINDS[kind][:2], self.namespace, CUSTOM_KINDS[kind][2], name)
        job = self._call(self.batch.read_namespaced_job, name, self.namespace)
        return self.api_client.sanitize_for_serialization(job)

    def wait(self, obj: dict[str, Any], timeout_seconds: float) -> dict[str, Any]:
        """Poll until Succeeded or Failed; return that condition. JobCannotStart when a pod
        stays unable to start past its grace period, JobTimeout past the limit (counted from
        the job's admission when it waits in a Kueue queue), QueueError when its queue can
        never admit it."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        deadline = self.clock() + timeout_seconds
        last_state = last_queue = None
        blocked_since: dict[str, float] = {}  # Blocker.what -> when first seen
        # the job's GPUs checked against the cluster's nodes, with this many pods: again when
        # more appear (the first worker can be unschedulable before its peers exist)
        sized_pods = 0
        incidents = 0  # worker incidents when the namespace was last looked at
        while True:
            current = self.get_while_waiting(kind, name)
            queued, last_queue = self.queued(kind, current, last_queue)
            if queued:
                deadline = self.clock() + timeout_seconds
                self.pause(kind, name)
                continue
            conditions = (current.get("status") or {}).get("conditions") or []
            state = latest_condition(conditions)
            if state != last_state:
                self._log(name, f"{kind} condition: {state or 'Pending'}")
                last_state = state
            cond = finished_condition(conditions, kind)
            if cond is not None:
                return cond
            pods = self.pods(kind, name)
            self.note_failed_attempts(kind, name, pods)
            self.note_workers(name, pods)
            if len(self._incidents) > incidents:  # a worker deleted or failed (here or in
                incidents = len(self._incidents)  # the pod watch): with its namespace?
                self.check_namespace(kind, name)
            blockers = self.blockers(obj, pods)
            if len(pods) > sized_pods and any(b.unschedulable for b in blockers):
                sized_pods = len(pods)
                never = self.never_fits(name, pods)
                if never:
                    raise JobUnschedulable(f"{kind} {self.namespace}/{name} can never be "
                                           f"scheduled: {never}; it was deleted")
            now = self.clock()
            blocked_since = {b.what: blocked_since.get(b.what, now) for b in blockers}
            for b in blockers:
                if blocked_since[b.what] == now:
                    verb = "be scheduled" if b.unschedulable else "start"
                    self._log(name, f"cannot {verb} yet: {b.what}: {b.why}")
            for b in blockers:
                if now - blocked_since[b.what] >= b.grace:
                    raise self._cannot_start(kind, name, b, now - blocked_since[b.what])
            if now >= deadline:
                why = "; ".join(f"{b.what}: {b.why}" for b in blockers)
                raise JobTimeout(
                    f"{kind} {self.namespace}/{name}: not finished after {timeout_seconds:.0f}s "
                    f"(last condition: {state or 'none'}"
                    + (f"; cannot start: {why}" if why else "") + "); it was deleted",
                    self.log_tail(kind, name),
                )
            self.pause(kind, name)

    def get_while_waiting(self, kind: str, name: str) -> dict[str, Any]:
        """The job as get() reads it; JobFailed in one line when it is gone: its namespace was
        deleted (or is being deleted), or someone deleted the job."""
        from kubernetes.client.rest import ApiException

        try:
            return self.get(kind, name)
        except ApiException as e:
            if e.status != 404:
                raise
        self.check_namespace(kind, name)
        raise JobFailed(f"{kind} {self.namespace}/{name} was deleted while it ran (not by "
                        f"chexflow)")

    def check_namespace(self, kind: str, name: str, last: str = "") -> None:
        """JobFailed in one line when the job's namespace is being (or was) deleted: its pods
        and the job go with it. `last`: the job's last condition, when it has one."""
        ending = self.namespace_ending()
        if ending:
            raise JobFailed(f"{kind} {self.namespace}/{name} did not finish: namespace "
                            f"{self.namespace} {ending} while it ran, and its pods with it"
                            + (f" (the {kind}'s last condition: {last})" if last else ""))

    def namespace_ending(self) -> str | None:
        """"was deleted" or "is being deleted" when the job's namespace is gone or terminating;
        None while it is there, or when it cannot be read (a service account without `get` on
        its namespace)."""
        from kubernetes.client.rest import ApiException

        try:
            ns = self._call(self.core.read_namespace, self.namespace)
        except ApiException as e:
            gone = f'namespaces "{self.namespace}" not found' in api_message(e)
            return "was deleted" if e.status == 404 and gone else None
        terminating = ns.status is not None and ns.status.phase == "Terminating"
        return "is being deleted" if ns.metadata.deletion_timestamp or terminating else None

    def queued(self, kind: str, current: dict[str, Any], last: str | None
               ) -> tuple[bool, str | None]:
        """Whether the job waits suspended in its Kueue queue, and the queue line last reported
        (a new one is logged once); QueueError when Kueue says it can never be admitted."""
        if not self.options.queue or (last or "").startswith("admitted"):
            return False, last
        spec = current.get("spec") or {}
        suspended = (spec.get("runPolicy") or {}).get("suspend") if kind == "MPIJob" \
            else spec.get("suspend")
        name = current["metadata"]["name"]
        state = queue_state(current["metadata"]["uid"], workloads(self.custom, self.namespace))
        if state is not None and state.line != last:
            self._log(name, state.line)
            last = state.line
        if state is not None and state.never:
            raise QueueError(f"{kind} {self.namespace}/{name} cannot be admitted: {state.line}; "
                             f"it was deleted")
        return bool(suspended), last

    def pause(self, kind: str, name: str) -> None:
        """Wait poll_seconds while following the job's pod events from the last list's
        resourceVersion (a watch, as controllers do): a worker deleted and created again
        between two polls, or a launcher attempt whose pod the Job controller deletes at once
        (backoffLimit reached), is seen all the same. Without a watch: sleep."""
        from kubernetes import watch

        if not self.watch or not self._pods_version:
            self.sleep(self.poll_seconds)
            return
        end = self.clock() + self.poll_seconds
        stream = watch.Watch()
        try:
            for event in stream.stream(
                    self.core.list_namespaced_pod, self.namespace,
                    label_selector=self._pod_selector(kind, name),
                    resource_version=self._pods_version,
                    timeout_seconds=max(1, round(self.poll_seconds)),
                    _request_timeout=self.poll_seconds + 10):
                pod = event["object"]
                if event["type"] in ("ADDED", "MODIFIED", "DELETED") and pod.metadata:
                    self._pods_version = pod.metadata.resource_version
                    if pod_role(pod) == "worker":
                        self._note_worker(name, pod, deleted=event["type"] == "DELETED")
                    else:
                        self.note_failed_attempts(kind, name, [pod])
                if self.clock() >= end:
                    break
        except Exception:  # 410 Gone, a dropped connection: the next list starts over
            self._pods_version = None
        finally:
            stream.stop()
        left = end - self.clock()
        if left > 0:
            self.sleep(left)

    def never_fits(self, name: str, pods: list) -> str | None:
        """Why the job's pods can never all be placed, even on an empty cluster (capacity.py),
        or None. Without the right to list Nodes (mpijob/rbac.yaml grants none) nothing is
        known: the scheduler's reason then ends the wait only after the grace."""
        from kubernetes.client.rest import ApiException

        live = [p for p in pods if not p.metadata.deletion_timestamp
                and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))]
        try:
            listed = self._call(self.core.list_node).items
        except ApiException as e:
            self._log(name, f"no Nodes to size the job against (HTTP {e.status} {e.reason}): "
                            f"a pod the cluster could never hold is told from a full cluster "
                            f"only after {diagnosis.SCHEDULING_GRACE_SECONDS}s")
            return None
        return never_fits([pod_gpus(p) for p in live], [node_gpus(n) for n in listed])

    def _cannot_start(self, kind: str, name: str, b: Blocker, waited: float) -> JobCannotStart:
        job = f"{kind} {self.namespace}/{name}"
        if not b.unschedulable:
            return JobCannotStart(f"{job} cannot start: {b.what}: {b.why} (for {waited:.0f}s); "
                                  f"it was deleted")
        hint = "; it asks for more than any node offers, or the cluster is full" \
            if b.grace == diagnosis.SCHEDULING_GRACE_SECONDS else ""
        return JobUnschedulable(f"{job} cannot be scheduled: {b.what}: {b.why} (unschedulable "
                                f"for {waited:.0f}s{hint}); it was deleted")

    def blockers(self, obj: dict[str, Any], pods: list) -> list[Blocker]:
        """What keeps the job's pods from starting: each pod's scheduling or container state;
        while pods are missing, also the refusals the controllers report as events (the
        MPIJob's and its launcher Job's, or the Job's)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        found = [b for pod in pods for b in pod_blockers(pod)]
        if kind == "MPIJob" and obj["spec"].get("launcherCreationPolicy") == \
                "WaitForWorkersReady":
            workers = obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
            found = [gang_never_forms(b, workers) or b for b in found]
        live = [p for p in pods if not p.metadata.deletion_timestamp
                and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))]
        if kind == "MPIJob":
            expected = obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] + 1
            owners = [name, f"{name}-launcher"]
        elif kind == "TrainJob":  # runLauncherAsNode: the launcher is one of the nodes
            expected = max(obj["spec"]["trainer"]["numNodes"] - 1, 1) + 1
            owners = [name, f"{name}-node-0", f"{name}-launcher-0"]
        else:
            expected, owners = 1, [name]
        if len(live) < expected:
            for owner in owners:
                refused = [e for e in self._event_items(owner) if refused_pods(e)]
                if refused:
                    e = refused[-1]
                    grace = diagnosis.SCHEDULING_GRACE_SECONDS if "exceeded quota" in e.message \
                        else BAD_INPUT_GRACE_SECONDS
                    found.append(Blocker(f"{e.involved_object.kind} {owner} ({e.reason})",
                                         one_line(e.message), grace))
        return found

    def note_workers(self, name: str, pods: list) -> None:
        """Report, once each, a worker pod that is deleted (mpi-operator creates it again) or
        that failed; the lines also go into the job's failure message. A worker seen before
        and gone now (deleted at once, grace period 0, and not created again yet) counts as
        deleted: mpi-operator deletes workers only after the job's Failed or Succeeded
        condition, which ends the polling first."""
        workers = [p for p in pods if pod_role(p) == "worker"]
        if pods:  # an empty list may be an API error: then nothing is known to be gone
            listed = {p.metadata.name for p in workers}
            for pod_name, uid in self._workers.items():
                if pod_name not in listed:
                    self._incident(name, uid, f"worker pod {pod_name} was deleted")
        for pod in workers:
            self._note_worker(name, pod)

    def _note_worker(self, name: str, pod, deleted: bool = False) -> None:
        pod_name, uid = pod.metadata.name, pod.metadata.uid
        previous = self._workers.get(pod_name)
        self._workers[pod_name] = uid
        if previous and previous != uid:
            self._incident(name, previous, f"worker pod {pod_name} was deleted and created "
                                           f"again")
        if deleted or pod.metadata.deletion_timestamp:
            self._incident(name, uid, f"worker pod {pod_name} was deleted")
        elif pod.status and pod.status.phase == "Failed":
            self._incident(name, uid, f"worker pod {pod_name} failed ({pod_end(pod)})")

    def _incident(self, name: str, key: str, message: str) -> None:
        if key not in self._incidents:
            self._incidents[key] = message
            self._log(name, message)

    def pods(self, kind: str, name: str) -> list:
        """The job's pods (launcher and workers), or none when the API does not answer."""
        from kubernetes.client.rest import ApiException

        try:
            listed = self._call(self.core.list_namespaced_pod, self.namespace,
                                label_selector=self._pod_selector(kind, name))
        except ApiException:
            self._pods_version = None
            return []
        self._pods_version = listed.metadata.resource_version if listed.metadata else None
        return listed.items

    @staticmethod
    def _pod_selector(kind: str, name: str) -> str:
        if kind == "TrainJob":
            return f"{JOBSET_LABEL}={name}"
        return f"{JOB_NAME_LABEL}={name}" if kind == "MPIJob" else f"job-name={name}"

    @staticmethod
    def _container(kind: str) -> str:
        """The launcher's container (or the Job's)."""
        return {"MPIJob": "launcher", "TrainJob": TRAINJOB_CONTAINER}.get(kind, "main")

    def note_failed_attempts(self, kind: str, name: str, pods: list) -> None:
        """Report each launcher (or Job pod) attempt that failed, once, and keep its log tail:
        a pod that failed (restartPolicy Never) or a container the kubelet restarted
        (OnFailure, whose pod the Job controller deletes when the backoff limit is reached)."""
        from kubernetes.client.rest import ApiException

        container = self._container(kind)
        for pod in pods:
            if pod_role(pod) != "launcher":
                continue
            for attempt, how, previous in ended_attempts(pod, container):
                key = f"{pod.metadata.name}/{attempt}"
                if key in self.failed_attempts:
                    continue
                try:
                    tail = self._call(
                        self.core.read_namespaced_pod_log, pod.metadata.name,
                        self.namespace, container=container, tail_lines=LOG_TAIL_LINES,
                        previous=previous,
                    )
                except ApiException:
                    tail = ""
                self.failed_attempts[key] = tail
                lost = lost_rank(tail)
                self._log(name, f"attempt {len(self.failed_attempts)} failed in pod "
                                f"{pod.metadata.name} (exit code {how.exit_code}: "
                                f"{how.reason or 'Error'})" + (f": {lost}" if lost else ""))

    def log_tail(self, kind: str, name: str) -> str:
        """The last lines of the launcher pod's log (MPIJob) or the job pod's log."""
        from kubernetes.client.rest import ApiException

        if kind == "MPIJob":
            selector = f"{JOB_NAME_LABEL}={name},{LAUNCHER_ROLE_LABEL}=launcher"
            container = "launcher"
        elif kind == "TrainJob":
            selector = f"{JOBSET_LABEL}={name},{REPLICATED_JOB_LABEL}=launcher"
            container = TRAINJOB_CONTAINER
        else:
            selector = f"job-name={name}"
            container = "main"
        try:
            pods = self._call(
                self.core.list_namespaced_pod, self.namespace, label_selector=selector
            )
            if not pods.items:
                return ""
            pod = max(pods.items, key=lambda p: p.metadata.creation_timestamp or 0)
            return self._call(
                self.core.read_namespaced_pod_log,
                pod.metadata.name,
                self.namespace,
                container=container,
                tail_lines=LOG_TAIL_LINES,
            )
        except ApiException as e:
            return f"(launcher log unavailable: HTTP {e.status} {e.reason})"

    def events(self, name: str) -> list[str]:
        return [f"  {e.type} {e.reason}: {e.message}" for e in self._event_items(name)[-10:]]

    def _event_items(self, name: str) -> list:
        """The namespace's events about the object `name` (none when the API does not answer)."""
        from kubernetes.client.rest import ApiException

        try:
            return self._call(
                self.core.list_namespaced_event,
                self.namespace,
                field_selector=f"involvedObject.name={name}",
            ).items
        except ApiException:
            return []

    def delete(self, kind: str, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        body = client.V1DeleteOptions(propagation_policy="Background")
        try:
            if kind in CUSTOM_KINDS:
                self._call(self.custom.delete_namespaced_custom_object,
                           *CUSTOM_KINDS[kind][:2], self.namespace, CUSTOM_KINDS[kind][2], name,
                           body=body)
            else:
                self._call(self.batch.delete_namespaced_job, name, self.namespace, body=body)
            self._log(name, f"deleted {kind} {self.namespace}/{name}")
        except ApiException as e:
            if e.status != 404:
                raise

    # --- helpers --------------------------------------------------------------------------
    def _call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Call the API, retrying 429/5xx and connection errors with exponential backoff."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        delay = 1.0
        for attempt in range(self.retries + 1):
            try:
                return fn(*args, **kwargs)
            except ApiException as e:
                if e.status not in TRANSIENT_STATUS or attempt == self.retries:
                    raise
                why = f"HTTP {e.status} {e.reason}"
            except (HTTPError, ConnectionError) as e:
                if attempt == self.retries:
                    raise KubernetesError(f"Kubernetes API unreachable: {e}") from None
                why = type(e).__name__
            self._log("api", f"{fn.__name__}: {why}; retry {attempt + 1}/{self.retries}")
            self.sleep(delay)
            delay = min(delay * 2, 30)
        raise AssertionError("unreachable")

    def _log(self, name: str, message: str) -> None:
        print(f"[{name}] {message}", file=self.stream, flush=True)
