"""chexflow.jobs.queueing: a job's place in its Kueue queue, from Workload objects as Kueue
v0.15 writes them (conditions QuotaReserved / Admitted and their messages), and a TrainJob's as
Kueue v0.19.2 wrote them on the local cluster (tests/cluster/test_cluster_kueue_trainjob.py's
jobs)."""

from __future__ import annotations

from chexflow.jobs.queueing import JOB_UID_LABEL, queue_state

WAITING = ("couldn't assign flavors to pod set worker: insufficient unused quota for "
           "nvidia.com/gpu in flavor kwok-gpu, 8 more needed")
TOO_BIG = ("couldn't assign flavors to pod set worker: insufficient quota for nvidia.com/gpu in "
           "flavor kwok-gpu, previously considered podsets requests (0) + current podset "
           "request (24) > maximum capacity (16)")


def workload(uid: str, created: str, conditions: list[dict], queue: str = "team-a",
             priority: int = 0, cluster_queue: str = "", kind: str = "MPIJob") -> dict:
    status = {"conditions": conditions}
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue}
    return {"metadata": {"name": f"{kind.lower()}-{uid}", "uid": f"wl-{uid}",
                         "creationTimestamp": created, "labels": {JOB_UID_LABEL: uid},
                         "ownerReferences": [{"kind": kind, "name": uid}]},
            "spec": {"queueName": queue, "priority": priority}, "status": status}


def pending(message: str) -> list[dict]:
    return [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}]


ADMITTED = [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]


def test_a_pending_workload_reports_its_position_and_kueues_reason():
    items = [workload("a", "2026-11-26T00:00:00Z", ADMITTED, cluster_queue="chexflow"),
             workload("b", "2026-11-26T00:00:01Z", pending(WAITING)),
             workload("c", "2026-11-26T00:00:02Z", pending(WAITING)),
             workload("d", "2026-11-26T00:00:03Z", pending(WAITING), priority=10),
             workload("e", "2026-11-26T00:00:00Z", pending(WAITING), queue="other")]
    state = queue_state("c", items)
    assert not state.admitted and not state.never
    # d has the higher priority; a is admitted; e waits in another LocalQueue
    assert state.line == f"queued in LocalQueue team-a, position 3 of 3: {WAITING}"
    assert queue_state("a", items).admitted
    assert queue_state("a", items).line == "admitted by ClusterQueue chexflow (Workload mpijob-a)"
    assert queue_state("zz", items) is None  # Kueue has not made its Workload yet
    done = [{"type": "QuotaReserved", "status": "False", "reason": "Finished"},
            {"type": "Finished", "status": "True", "reason": "Succeeded"}]
    assert queue_state("f", [workload("f", "2026-11-26T00:00:00Z", done)]).admitted


def test_a_job_larger_than_the_quota_or_a_missing_queue_can_never_be_admitted():
    big = queue_state("x", [workload("x", "2026-11-26T00:00:00Z", pending(TOO_BIG))])
    assert big.never and "> maximum capacity (16)" in big.line
    gone = [{"type": "QuotaReserved", "status": "False", "reason": "Inadmissible",
             "message": "LocalQueue nope doesn't exist"}]
    missing = queue_state("y", [workload("y", "2026-11-26T00:00:00Z", gone, queue="nope")])
    assert missing.never and missing.line.endswith("LocalQueue nope doesn't exist")


# a 2-node TrainJob's Workload (pod sets `node` and `launcher`, one pod each), pending behind
# one holding the ClusterQueue's 16 GPUs: Kueue v0.19.2's message, as it wrote it
TRAINJOB_WAITING = ("couldn't assign flavors to pod set node: insufficient unused quota for "
                    "nvidia.com/gpu in flavor kwok-gpu, 1 more needed; couldn't assign flavors "
                    "to pod set launcher: insufficient unused quota for nvidia.com/gpu in flavor "
                    "kwok-gpu, 2 more needed")


def test_a_trainjobs_workload_is_reported_as_an_mpijobs_and_shares_the_queues_positions():
    """A TrainJob's Workload is found by the TrainJob's uid (label kueue.x-k8s.io/job-uid, as
    for an MPIJob), its Kueue message reported whole, and its position counted among every
    pending Workload of the LocalQueue, MPIJobs' and TrainJobs' alike."""
    items = [workload("first", "2026-11-28T07:12:37Z", ADMITTED, cluster_queue="chexflow",
                      kind="TrainJob"),
             workload("m", "2026-11-28T07:12:40Z", pending(WAITING)),
             workload("second", "2026-11-28T07:12:44Z", pending(TRAINJOB_WAITING),
                      kind="TrainJob")]
    state = queue_state("second", items)
    assert not state.admitted and not state.never
    assert state.line == f"queued in LocalQueue team-a, position 2 of 2: {TRAINJOB_WAITING}"
    first = queue_state("first", items)
    assert first.admitted
    assert first.line == "admitted by ClusterQueue chexflow (Workload trainjob-first)"
