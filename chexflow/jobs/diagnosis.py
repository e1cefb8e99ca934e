"""Why a job's pods cannot start or ended: Kubernetes' own reasons, one line each.

Shared by the jobs backend (kubernetes.py) and Katib's cluster mode (a trial's pods). Kubernetes
retries most of these, so each reason comes with a grace period: short for what the job's spec
got wrong, long when the cluster is only full.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Time allowed beyond the job's own activeDeadlineSeconds for scheduling and image pulls; also
# how long pods may stay unschedulable for lack of room before the job fails with the
# scheduler's reason (other jobs may end, an autoscaler may add a node).
SCHEDULING_GRACE_SECONDS = 300
# How long pods may stay unable to start for a reason in the job's spec (an image that cannot
# be pulled, a missing PVC, a node selector nothing matches, pods the apiserver refuses): long
# enough for a registry hiccup or a PVC created a moment late, short of a timeout.
BAD_INPUT_GRACE_SECONDS = 30
# Container waiting reasons no retry can clear (at once), and ones the kubelet retries (grace).
NEVER_STARTS = ("ErrImageNeverPull", "InvalidImageName")
MAY_NOT_START = ("ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError")
# Scheduler messages that say the cluster is full or busy, not that the spec is wrong.
# scheduler-plugins' Coscheduling: a gang that does not fit yet ("podGroup NS/NAME failed
# recently", "... is unschedulable even after PostFilter") waits like a pod on a full cluster;
# "cannot find enough sibling pods" (minAvailable above the job's pods; its message also says
# "unschedulable even after PostFilter") is the spec's fault, and when it asks for more pods than
# the workers the launcher waits for, it never clears (gang_never_forms).
# A job no empty cluster could hold either is told apart at once by capacity.py (Nodes' GPUs).
FULL_CLUSTER = ("Insufficient", "Too many pods", "free ports", "node.kubernetes.io/",
                "were unschedulable", "unbound immediate PersistentVolumeClaims",
                "failed recently", "unschedulable even after PostFilter")


# scheduler-plugins' Coscheduling, PreFilter: the PodGroup asks for more pods than exist yet
SHORT_GANG = re.compile(r"cannot find enough sibling pods, current pods number: (\d+), "
                        r"minMember of group: (\d+)")


@dataclass(frozen=True)
class Blocker:
    """Why a pod of the job cannot start: `what` names the pod or object, `why` is Kubernetes'
    reason in one line, `grace` how long Kubernetes gets to recover by itself."""

    what: str
    why: str
    grace: float
    unschedulable: bool = False


def ended_attempts(pod, container: str) -> list[tuple[int, Any, bool]]:
    """The ended runs of `container` that the pod still shows, as (attempt in this pod, its
    terminated state, whether its log is the previous container's): the one the kubelet
    restarted (restartPolicy OnFailure/Always: lastState) and, in a Failed pod (Never), the
    last one."""
    ended = []
    for status in (pod.status.container_statuses if pod.status else None) or []:
        if status.name != container:
            continue
        if status.last_state and status.last_state.terminated:
            ended.append((status.restart_count, status.last_state.terminated, True))
        if pod.status.phase == "Failed" and status.state and status.state.terminated:
            ended.append((status.restart_count + 1, status.state.terminated, False))
    return ended


def pod_blockers(pod) -> list[Blocker]:
    """Why `pod` cannot start: the scheduler cannot place it (PodScheduled False, reason
    Unschedulable), or a container waits on an image it cannot get or a config it lacks."""
    if pod.status is None or pod.metadata.deletion_timestamp:
        return []
    what = f"pod {pod.metadata.name}"
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            full = any(marker in (c.message or "") for marker in FULL_CLUSTER)
            grace = SCHEDULING_GRACE_SECONDS if full else BAD_INPUT_GRACE_SECONDS
            return [Blocker(what, one_line(c.message or ""), grace, unschedulable=True)]
    found = []
    statuses = [*(pod.status.init_container_statuses or []),
                *(pod.status.container_statuses or [])]
    for status in statuses:
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason in NEVER_STARTS + MAY_NOT_START:
            grace = 0 if waiting.reason in NEVER_STARTS else BAD_INPUT_GRACE_SECONDS
            found.append(Blocker(f"{what} container {status.name}",
                                 one_line(f"{waiting.reason}: {waiting.message or ''}"), grace))
    return found


def gang_never_forms(blocker: Blocker, workers: int) -> Blocker | None:
    """The workers' scheduling reason when their gang can never form: the PodGroup's minMember
    exceeds the `workers`, the only pods there are until they are ready (an MPIJob whose
    launcher waits for its workers, launcherCreationPolicy WaitForWorkersReady). No wait clears
    it, so it ends the wait at once; None for any other reason (a gang whose pods are still
    being created also lacks siblings for a moment)."""
    match = SHORT_GANG.search(blocker.why) if blocker.unschedulable else None
    if match is None or int(match.group(2)) <= workers:
        return None
    members = int(match.group(2))
    why = (f"its gang never forms: the gang scheduler's PodGroup waits for {members} pods "
           f"together, but only the {workers} worker(s) come before the launcher, which "
           f"mpi-operator creates once they are ready (launcherCreationPolicy "
           f"WaitForWorkersReady); set runPolicy.schedulingPolicy.minAvailable to {workers}, as "
           f"`chexflow mpijob render` does (the scheduler: {blocker.why})")
    return Blocker(blocker.what, why, 0, unschedulable=True)


def refused_pods(event) -> bool:
    """An event saying a controller could not create the job's pods (the Job controller's
    FailedCreate, mpi-operator's 'worker pod created failed')."""
    message = event.message or ""
    return event.type == "Warning" and (
        event.reason == "FailedCreate" or "pod created failed" in message)


def pod_end(pod) -> str:
    """How a failed pod ended: the kubelet's reason (Evicted...) or its containers' exits."""
    if pod.status.reason:
        return one_line(f"{pod.status.reason}: {pod.status.message or ''}")
    ends = [f"container {s.name}: exit code {s.state.terminated.exit_code}"
            f" {s.state.terminated.reason or ''}".rstrip()
            for s in pod.status.container_statuses or [] if s.state and s.state.terminated]
    return "; ".join(ends) or "no container status"


def lost_rank(log: str) -> str | None:
    """OpenMPI's mpirun saying it lost the daemon of a worker (its pod was killed or deleted):
    'mpirun lost its ranks on HOST', or None."""
    match = re.search(r"ORTE has lost communication with a remote daemon\.\s+HNP daemon.*\n"
                      r"\s*Remote daemon\s*:.* on node (\S+)", log)
    return f"mpirun lost its ranks on {match.group(1)}" if match else None


def one_line(text: str) -> str:
    return " ".join(text.split())


def latest_condition(conditions: list[dict[str, Any]]) -> str | None:
    true = [c for c in conditions if c.get("status") == "True"]
    return true[-1]["type"] if true else None
