"""Kueue, seen from a job: does its LocalQueue exist, and where is its Workload in the queue.

Kueue (kueue.x-k8s.io) suspends a job labelled kueue.x-k8s.io/queue-name when it is created
and makes a Workload for it (labelled kueue.x-k8s.io/job-uid); the Workload's QuotaReserved and
Admitted conditions say whether its ClusterQueue has room, and if not why (Kueue's own message).
Kueue unsuspends the job when it admits it. The position is computed here, as Kueue orders a
queue by default (higher priority first, then older first), among the LocalQueue's pending
Workloads: the visibility API that reports it is an aggregated API server, not always there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chexflow.jobs.diagnosis import one_line
from chexflow.jobs.spec import JobFailed

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Kueue's flavor assigner: the request exceeds what the ClusterQueue (and its cohort) could
# ever offer, so waiting cannot help
NEVER_FITS = "> maximum capacity"
MISSING_QUEUE = "doesn't exist"  # "LocalQueue X doesn't exist", "ClusterQueue X doesn't exist"


class QueueError(JobFailed):
    """The job cannot be admitted by its Kueue queue (no such queue, larger than its quota)."""


@dataclass(frozen=True)
class QueueState:
    """Where a job's Workload stands: `admitted`, or queued with `line` saying where and why;
    `never` when Kueue says it can never be admitted as asked."""

    admitted: bool
    line: str
    never: bool = False


def check_local_queue(custom, namespace: str, queue: str) -> None:
    """QueueError when the LocalQueue does not exist (or Kueue is not installed). Without the
    right to read LocalQueues (403) nothing is known: the Workload's status will say."""
    from kubernetes.client.rest import ApiException

    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", queue)
        return
    except ApiException as e:
        if e.status != 404:
            if e.status == 403:
                return
            raise
    try:
        queues = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues")
    except ApiException as e:
        if e.status == 404:
            raise QueueError(f"--queue {queue}: Kueue is not installed in this cluster (no "
                             f"{GROUP}/{VERSION} LocalQueue API)") from None
        raise
    names = sorted(q["metadata"]["name"] for q in queues.get("items", []))
    raise QueueError(f"--queue {queue}: no LocalQueue {queue} in namespace {namespace} "
                     f"(there: {', '.join(names) or 'none'})")


def workloads(custom, namespace: str) -> list[dict[str, Any]]:
    from kubernetes.client.rest import ApiException

    try:
        return custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "workloads").get("items", [])
    except ApiException:
        return []


def _conditions(wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (wl.get("status") or {}).get("conditions", [])}


def _pending(wl: dict[str, Any]) -> bool:
    conds = _conditions(wl)
    return not any(conds.get(t, {}).get("status") == "True"
                   for t in ("QuotaReserved", "Admitted", "Finished"))


def queue_state(job_uid: str, items: list[dict[str, Any]]) -> QueueState | None:
    """The state of the Workload of the job with `job_uid` among the namespace's Workloads
    `items`; None while Kueue has not made it yet."""
    mine = [w for w in items
            if (w["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == job_uid]
    if not mine:
        return None
    wl = mine[0]
    conds = _conditions(wl)
    queue = wl["spec"].get("queueName", "")
    admission = (wl.get("status") or {}).get("admission") or {}
    if conds.get("Admitted", {}).get("status") == "True":
        return QueueState(True, f"admitted by ClusterQueue {admission.get('clusterQueue', '?')}"
                                f" (Workload {wl['metadata']['name']})")
    if conds.get("Finished", {}).get("status") == "True":  # admitted and ended between polls
        return QueueState(True, f"admitted and finished (Workload {wl['metadata']['name']})")
    reserved = conds.get("QuotaReserved", {})
    why = one_line(reserved.get("message", "")) or "waiting for Kueue"
    pending = sorted((w for w in items if w["spec"].get("queueName") == queue and _pending(w)),
                     key=lambda w: (-(w["spec"].get("priority") or 0),
                                    w["metadata"]["creationTimestamp"]))
    uids = [w["metadata"]["uid"] for w in pending]
    where = (f"position {uids.index(wl['metadata']['uid']) + 1} of {len(uids)}"
             if wl["metadata"]["uid"] in uids else "quota reserved, awaiting admission")
    never = NEVER_FITS in why or MISSING_QUEUE in why
    return QueueState(False, f"queued in LocalQueue {queue}, {where}: {why}", never)
