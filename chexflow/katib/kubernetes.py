"""`chexflow tune --cluster`: create the Experiment with the Kubernetes client and wait for it.

Only the Kubernetes client is needed (CustomObjectsApi, kubeflow.org/v1beta1 experiments); the
Katib SDK pins protobuf < 5 and has no local mode.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.katib.experiment import Experiment
from chexflow.kube import finished_condition, load_api_client

GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"


class ClusterError(ChexflowError):
    """The Experiment could not be created or followed on the cluster."""


def custom_objects_api():
    from kubernetes import client

    return client.CustomObjectsApi(load_api_client())


def _api_message(e: Exception) -> str:
    body = getattr(e, "body", None)
    try:
        return json.loads(body).get("message", str(e))
    except (TypeError, ValueError):
        return str(getattr(e, "reason", e))


def optimal_from_status(exp: Experiment, obj: dict) -> dict[str, Any] | None:
    """status.currentOptimalTrial as optimal.json (metrics after their metricStrategy)."""
    cur = (obj.get("status") or {}).get("currentOptimalTrial") or {}
    name = cur.get("bestTrialName")
    if not name:
        return None
    params = {}
    for a in cur.get("parameterAssignments") or []:
        try:
            p = exp.parameter(a["name"])
            params[a["name"]] = p.snap(a["value"]) if p.numeric else a["value"]
        except StopIteration:
            params[a["name"]] = a["value"]
    metrics = {}
    for m in (cur.get("observation") or {}).get("metrics") or []:
        key = exp.objective.strategies.get(m["name"], "latest")
        try:
            metrics[m["name"]] = float(m.get(key, m.get("latest")))
        except (TypeError, ValueError):
            continue
    return {"trial": name, "parameters": params, "metrics": metrics}


def run_on_cluster(exp: Experiment, state_dir: Path, namespace: str | None, timeout: float,
                   poll: float, dry_run: bool, echo: Callable[[str], None] = print) -> dict:
    """Create the Experiment (server-side dry run with --dry-run) and wait for its end."""
    api = custom_objects_api()
    ns = namespace or exp.namespace
    body = json.loads(json.dumps(exp.raw))
    body.setdefault("metadata", {})["namespace"] = ns
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body,
                                            dry_run="All" if dry_run else None)
    except Exception as e:
        if getattr(e, "status", None) == 409:
            raise ClusterError(f"experiment {ns}/{exp.name} already exists: delete it or change "
                               f"metadata.name") from e
        raise ClusterError(f"creating experiment {ns}/{exp.name}: {_api_message(e)}") from e
    if dry_run:
        echo(f"experiment {ns}/{exp.name}: accepted by the API server (dry run)")
        return {}
    echo(f"experiment {ns}/{exp.name} created; waiting for Succeeded or Failed")
    deadline = time.monotonic() + timeout
    last = None
    while True:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, exp.name)
        st = obj.get("status") or {}
        progress = tuple(st.get(k, 0) for k in ("trialsSucceeded", "trialsRunning", "trialsFailed",
                                                 "trialsEarlyStopped"))
        if progress != last:
            echo("trials: succeeded={} running={} failed={} early-stopped={}".format(*progress))
            last = progress
        cond = finished_condition(st.get("conditions"), "Experiment")
        if cond:
            break
        if time.monotonic() > deadline:
            raise ClusterError(f"experiment {ns}/{exp.name}: not finished after {timeout:.0f} s")
        time.sleep(poll)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "experiment.json").write_text(json.dumps(obj, indent=1, default=str))
    best = optimal_from_status(exp, obj)
    if best:
        (state_dir / "optimal.json").write_text(
            json.dumps({**best, "experiment": exp.name, "condition": cond.get("reason")}, indent=1)
        )
    return {"condition": cond, "optimal": best}
