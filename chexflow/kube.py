"""What chexflow's Kubernetes code shares: loading the client configuration, and reading an
object's status conditions (MPIJob, batch Job, Katib Experiment, the local sweep's state)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from chexflow.errors import ChexflowError

# The condition types that end an object, by kind (Katib Experiments end like MPIJobs).
FINISHED = {"MPIJob": ("Succeeded", "Failed"), "Job": ("Complete", "Failed"),
            "Experiment": ("Succeeded", "Failed"), "TrainJob": ("Complete", "Failed")}


# API answers worth another try: throttled, or the apiserver (or what is behind it) unwell
TRANSIENT_STATUS = {429, 500, 502, 503, 504}


class KubernetesError(ChexflowError):
    """No cluster configuration, or the Kubernetes API refused a request."""


def in_pod() -> bool:
    """Running in a Kubernetes pod (the variable the kubelet sets for in-cluster clients)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def load_api_client(context: str | None = None):
    """A client for the cluster, configured as Katib's and KFP's SDKs do: an explicit kubeconfig
    (KUBECONFIG, or a context asked for) first, else the pod's service account when running in a
    pod, else ~/.kube/config."""
    from kubernetes import client, config

    kubeconfig = os.environ.get("KUBECONFIG")  # read now: the library reads it at import
    try:
        if in_pod() and not context and not kubeconfig:
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, FileNotFoundError, TypeError) as e:
        raise KubernetesError(
            f"no Kubernetes configuration ({e}): set KUBECONFIG (or ~/.kube/config), or run in "
            f"a pod"
        ) from None
    return client.ApiClient()


def client_from_kubeconfig(path: str | os.PathLike) -> Any:
    """A client for the cluster of one kubeconfig file, leaving the process's default alone (a
    cluster this process started, beside whatever KUBECONFIG names)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(path))


def finished_condition(conditions: Iterable[dict[str, Any]] | None,
                       kind: str) -> dict[str, Any] | None:
    """The condition with status True that ends an object of `kind`, or None while it runs."""
    done = FINISHED[kind]
    for cond in conditions or []:
        if cond.get("type") in done and cond.get("status") == "True":
            return cond
    return None


def is_transient(e: BaseException) -> bool:
    """An API error worth retrying: 429/5xx, or the connection itself (urllib3)."""
    from urllib3.exceptions import HTTPError

    return (getattr(e, "status", None) in TRANSIENT_STATUS
            or isinstance(e, (HTTPError, ConnectionError)))


def api_message(e: BaseException) -> str:
    """The apiserver's own message in an ApiException's JSON body, else what the error says."""
    body = getattr(e, "body", None)
    try:
        return json.loads(body).get("message", body)
    except (TypeError, ValueError, AttributeError):
        return str(body) if body else str(getattr(e, "reason", None) or e)
