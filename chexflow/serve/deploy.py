"""`chexflow serve deploy`: chexflow's ClusterServingRuntime and an InferenceService on the
cluster, then a wait (with a deadline) until KServe says it is Ready, reporting why it is not
(the predictor pod's image pull, scheduling, a crash with the end of its log, the
InferenceService's own conditions) in one line.
"""

from __future__ import annotations

import difflib
import math
import time
from dataclasses import dataclass
from typing import Any

import yaml

from chexflow.errors import ChexflowError
from chexflow.jobs.diagnosis import one_line, pod_blockers, pod_end
from chexflow.kube import api_message
from chexflow.serve.render import GROUP, RUNTIME_NAME, RUNTIME_VERSION, VERSION, serving_runtime

ISVC_LABEL = "serving.kserve.io/inferenceservice"
LOG_LINES = 15


class DeployError(ChexflowError):
    """The InferenceService could not be created or did not become Ready."""


@dataclass
class Deployed:
    name: str
    namespace: str
    url: str | None  # status.address.url: the cluster-internal address KServe reports
    pod_ip: str | None  # the predictor pod's address (reachable where pod addresses route)


def _custom(api):
    from kubernetes import client

    return client.CustomObjectsApi(api)


def ensure_runtime(api, image: str | None = None, replace: bool = False) -> str:
    """chexflow's ClusterServingRuntime for `image` (default: the chosen trainer image): created
    when missing; one that differs is replaced when `replace`, else refused with the diff."""
    from kubernetes.client.rest import ApiException

    want = serving_runtime(image)
    custom = _custom(api)
    args = (GROUP, RUNTIME_VERSION, "clusterservingruntimes")
    try:
        have = custom.get_cluster_custom_object(*args, RUNTIME_NAME)
    except ApiException as e:
        if e.status == 404:
            _call(custom.create_cluster_custom_object, f"ClusterServingRuntime {RUNTIME_NAME}",
                  *args, want)
            return RUNTIME_NAME
        raise DeployError(f"ClusterServingRuntime {RUNTIME_NAME}: {api_message(e)}") from None
    if have.get("spec") == want["spec"]:
        return RUNTIME_NAME
    if not replace:
        diff = "".join(difflib.unified_diff(
            yaml.safe_dump(have.get("spec"), sort_keys=True).splitlines(keepends=True),
            yaml.safe_dump(want["spec"], sort_keys=True).splitlines(keepends=True),
            "on the cluster", "chexflow's", n=1))
        raise DeployError(f"ClusterServingRuntime {RUNTIME_NAME} on the cluster differs from "
                          f"chexflow's; pass --update-runtime to replace it:\n{diff}".rstrip())
    want["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
    _call(custom.replace_cluster_custom_object, f"ClusterServingRuntime {RUNTIME_NAME}",
          *args, RUNTIME_NAME, want)
    return RUNTIME_NAME


def _call(fn, what: str, *args: Any) -> Any:
    from kubernetes.client.rest import ApiException

    try:
        return fn(*args)
    except ApiException as e:
        raise DeployError(f"{what}: {api_message(e)}") from None


def apply_inference_service(api, isvc: dict[str, Any], namespace: str) -> bool:
    """Create the InferenceService, or replace one of the same name (a new model version);
    whether it was created."""
    from kubernetes.client.rest import ApiException

    custom = _custom(api)
    name = isvc["metadata"]["name"]
    args = (GROUP, VERSION, namespace, "inferenceservices")
    body = {**isvc, "metadata": {**isvc["metadata"], "namespace": namespace}}
    try:
        custom.create_namespaced_custom_object(*args, body)
        return True
    except ApiException as e:
        if e.status != 409:
            raise DeployError(f"InferenceService {namespace}/{name}: {api_message(e)}") from None
        have = custom.get_namespaced_custom_object(*args, name)
        body["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
        _call(custom.replace_namespaced_custom_object, f"InferenceService {namespace}/{name}",
              *args, name, body)
        return False


def delete_inference_service(api, namespace: str, name: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        _custom(api).delete_namespaced_custom_object(GROUP, VERSION, namespace,
                                                     "inferenceservices", name)
    except ApiException as e:
        if e.status != 404:
            raise


def predictor_pods(api, namespace: str, name: str) -> list:
    from kubernetes import client

    return client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{ISVC_LABEL}={name}").items


def _log_tail(api, pod, container: str) -> str:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        log = client.CoreV1Api(api).read_namespaced_pod_log(
            pod.metadata.name, pod.metadata.namespace, container=container,
            tail_lines=LOG_LINES, previous=True)
    except ApiException:
        return ""
    lines = [line for line in log.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def why_not_ready(api, namespace: str, name: str, isvc: dict[str, Any]) -> tuple[str, float]:
    """(why the InferenceService is not Ready in one line, how long Kubernetes may take to clear
    that by itself: 0 when no wait can, inf while it is only starting)."""
    for pod in predictor_pods(api, namespace, name):
        blockers = pod_blockers(pod)
        if blockers:
            b = blockers[0]
            return f"{b.what}: {b.why}", b.grace
        for status in pod.status.container_statuses or [] if pod.status else []:
            waiting = status.state.waiting if status.state else None
            if waiting and waiting.reason == "CrashLoopBackOff":
                last = _log_tail(api, pod, status.name)
                return (f"pod {pod.metadata.name} container {status.name} keeps exiting "
                        f"({pod_end(pod) if pod.status.phase == 'Failed' else 'CrashLoopBackOff'})"
                        + (f"; its log ends: {one_line(last)}" if last else ""), 0.0)
    conditions = (isvc.get("status") or {}).get("conditions") or []
    if not conditions:
        return ("KServe has not reconciled it yet (no status; if this lasts, its controller's "
                "log says why)", math.inf)
    failing = [c for c in conditions if c.get("status") == "False" and c.get("message")]
    if failing:
        c = failing[0]
        return one_line(f"{c['type']}: {c.get('reason', '')} {c['message']}"), math.inf
    return "no predictor pod is Ready yet", math.inf


def wait_ready(api, namespace: str, name: str, timeout: float,
               poll: float = 2.0) -> dict[str, Any]:
    """The InferenceService once its Ready condition is True; DeployError with the reason when
    the deadline passes or a reason persists beyond its grace (an image that cannot be pulled:
    BAD_INPUT_GRACE_SECONDS; a crash loop: none)."""
    custom = _custom(api)
    deadline = time.monotonic() + timeout
    first_seen: dict[str, float] = {}
    while True:
        isvc = _call(custom.get_namespaced_custom_object,
                     f"InferenceService {namespace}/{name}", GROUP, VERSION, namespace,
                     "inferenceservices", name)
        conditions = (isvc.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return isvc
        why, grace = why_not_ready(api, namespace, name, isvc)
        now = time.monotonic()
        since = first_seen.setdefault(why, now)
        if now - since >= grace or now > deadline:
            raise DeployError(f"InferenceService {namespace}/{name} not Ready after "
                              f"{timeout - (deadline - now):.0f} s: {why}")
        time.sleep(poll)


def deploy(api, isvc: dict[str, Any], namespace: str, timeout: float = 600,
           update_runtime: bool = False, image: str | None = None) -> Deployed:
    """The runtime (ensure_runtime), the InferenceService, then wait_ready. An InferenceService
    this call created is deleted again when it does not become Ready or the wait is stopped
    (one it replaced stays, with its new spec, for `kubectl describe`)."""
    ensure_runtime(api, image, replace=update_runtime)
    name = isvc["metadata"]["name"]
    created = apply_inference_service(api, isvc, namespace)
    try:
        ready = wait_ready(api, namespace, name, timeout)
    except DeployError as e:
        if created:
            delete_inference_service(api, namespace, name)
            raise DeployError(f"{e} (the InferenceService was deleted)") from None
        raise
    except BaseException:
        if created:
            delete_inference_service(api, namespace, name)
        raise
    pods = [p for p in predictor_pods(api, namespace, name)
            if p.status and p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    status = ready.get("status") or {}
    return Deployed(name, namespace, (status.get("address") or {}).get("url") or status.get("url"),
                    pods[0].status.pod_ip if pods else None)
