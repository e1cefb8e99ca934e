"""Whether a job's pods could ever all be placed: their GPUs against the cluster's nodes.

A pod the scheduler cannot place is retried: the cluster may only be full now (the long grace
of diagnosis.SCHEDULING_GRACE_SECONDS). But a job whose pods ask more GPUs than the cluster's
nodes allocate in all, a pod larger than any node, or more pods of a size than the nodes can hold
side by side can never run, full or empty: a gang the Coscheduling scheduler holds back for it
would wait until the timeout. The check counts every Node's status.allocatable (cordoned or
tainted ones too), so it says "never" only when even an empty cluster could not hold the job.
"""

from __future__ import annotations

from collections import Counter

from chexflow.jobs.render import GPU_RESOURCE


def pod_gpus(pod) -> int:
    """The GPUs a pod asks (its containers' requests, else limits: an extended resource's
    request defaults to its limit)."""
    total = 0
    for c in (pod.spec.containers if pod.spec else None) or []:
        res = c.resources
        asked = (res.requests or {}).get(GPU_RESOURCE) if res else None
        if asked is None and res:
            asked = (res.limits or {}).get(GPU_RESOURCE)
        total += int(asked or 0)
    return total


def node_gpus(node) -> int:
    return int(((node.status.allocatable if node.status else None) or {}).get(GPU_RESOURCE, 0))


def _sizes(need: list[int]) -> str:
    return " + ".join(f"{n} x {g}" for g, n in sorted(Counter(need).items(), reverse=True))


def never_fits(need: list[int], per_node: list[int]) -> str | None:
    """Why pods asking `need` GPUs each can never all be placed on nodes allocating `per_node`
    GPUs each (ignoring what runs there now), or None when an empty cluster could hold them."""
    need = [g for g in need if g > 0]
    if not need:
        return None
    total, biggest = sum(per_node), max(per_node, default=0)
    cluster = (f"the cluster has {total} in all ({len(per_node)} nodes, at most {biggest} on "
               f"one)")
    if max(need) > biggest:
        return f"a pod asks {max(need)} {GPU_RESOURCE}; {cluster}"
    if sum(need) > total:
        return (f"its {len(need)} pods ask {_sizes(need)} = {sum(need)} {GPU_RESOURCE}; "
                f"{cluster}")
    smallest = min(need)
    room = sum(n // smallest for n in per_node)
    if len(need) > room:
        return (f"its {len(need)} pods ask {_sizes(need)} {GPU_RESOURCE}; {cluster}, room for "
                f"at most {room} pods of {smallest}")
    return None
