"""Submitting a compiled pipeline to Kubeflow Pipelines: `chexflow submit` and
notebooks/submit.ipynb, with chexflow's defaults (the service account of mpijob/rbac.yaml, the
pipeline's `namespace` parameter set to the run's namespace).

Before kfp's client is made, one request with short timeouts and no retries asks the KFP API's
health endpoint (`/apis/v2beta1/healthz`, kfp_server_api's HealthzService): a host that does not
answer, or answers HTTP without being the KFP API, is one line at once, not kfp's and urllib3's
retries and tracebacks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError

SERVICE_ACCOUNT = "chexflow-launcher"  # mpijob/rbac.yaml: the account that creates the jobs
HEALTHZ_PATH = "/apis/v2beta1/healthz"
# keys of the KFP API's healthz answer (kfp_server_api V2beta1GetHealthzResponse, and the
# backend's commit and tag)
HEALTHZ_KEYS = {"multi_user", "pipeline_store", "commit_sha", "tag_name"}
CONNECT_S, READ_S = 5.0, 15.0
HOST_ENV = "KF_PIPELINES_ENDPOINT"  # kfp.Client's, for the host
IN_CLUSTER_HOST = "http://ml-pipeline.kubeflow.svc.cluster.local:8888"  # kfp.Client's default
# the pipelines token Kubeflow mounts in notebook pods (kfp's ServiceAccountTokenVolumeCredentials)
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"


class SubmitError(ChexflowError):
    """The run could not be submitted; the message names the host or parameter."""


@dataclass(frozen=True)
class Submission:
    """What to submit and where; the defaults are chexflow's."""

    package: Path  # a compiled pipeline (`chexflow compile`)
    host: str | None = None  # None: KF_PIPELINES_ENDPOINT, else the in-cluster address
    namespace: str | None = None  # Kubeflow profile namespace (multi-user)
    token: str | None = None  # bearer token
    experiment: str = "chexflow"
    run_name: str | None = None
    service_account: str = SERVICE_ACCOUNT
    params: dict[str, Any] = field(default_factory=dict)


def kfp_host(host: str | None) -> str:
    """The API URL as kfp.Client makes it: given, else KF_PIPELINES_ENDPOINT, else the
    in-cluster address; `https://` when no scheme is given; no trailing slash."""
    host = host or os.environ.get(HOST_ENV) or IN_CLUSTER_HOST
    if not host.startswith(("http://", "https://")):
        host = "https://" + host
    return host.rstrip("/")


def _reason(e: Exception) -> str:
    """A connection error in a few words."""
    import urllib3

    text = str(e)
    if isinstance(e, urllib3.exceptions.NameResolutionError):
        return f"cannot resolve its name ({text.rpartition('(')[2].rstrip(')')})"
    if isinstance(e, urllib3.exceptions.ConnectTimeoutError) and "timed out" in text:
        return f"no connection within {CONNECT_S:.0f} s"
    if isinstance(e, urllib3.exceptions.ReadTimeoutError):
        return f"no answer within {READ_S:.0f} s"
    if "Connection refused" in text:
        return "connection refused"
    return text.rpartition(": ")[2] or type(e).__name__


def check_kfp_api(host: str, token: str | None = None) -> dict[str, Any]:
    """The healthz answer of the KFP API at `host`; SubmitError in one line when nothing
    answers there, or something that is not the KFP API (any HTTP answer but its JSON)."""
    import urllib3

    url = host + HEALTHZ_PATH
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = urllib3.PoolManager().request(
            "GET", url, headers=headers, retries=False, redirect=False,
            timeout=urllib3.Timeout(connect=CONNECT_S, read=READ_S))
    except urllib3.exceptions.HTTPError as e:
        raise SubmitError(f"--host {host}: no Kubeflow Pipelines API there: "
                          f"{_reason(e)}") from None
    if response.status in (301, 302, 303, 307, 308):
        raise SubmitError(f"--host {host}: GET {HEALTHZ_PATH} is redirected to "
                          f"{response.headers.get('Location', '?')} (a login page?): give "
                          "--token, or the address of the ml-pipeline service itself")
    if response.status in (401, 403):
        raise SubmitError(f"--host {host}: GET {HEALTHZ_PATH}: HTTP {response.status} "
                          f"{response.reason}: give a --token the Kubeflow Pipelines API "
                          "accepts")
    try:
        answer = json.loads(response.data)
    except ValueError:
        answer = None
    if response.status != 200 or not isinstance(answer, dict) or not HEALTHZ_KEYS & set(answer):
        kind = response.headers.get("Content-Type", "no content type")
        raise SubmitError(f"--host {host}: answers HTTP but is not the Kubeflow Pipelines API "
                          f"(GET {HEALTHZ_PATH}: HTTP {response.status} {response.reason}, "
                          f"{kind}); give the address of its ml-pipeline service, e.g. "
                          "http://localhost:8888 after kubectl port-forward -n kubeflow "
                          "svc/ml-pipeline 8888")
    return answer


def package_parameters(package: Path) -> set[str]:
    """The parameters of a compiled pipeline (root.inputDefinitions.parameters)."""
    import yaml

    try:
        docs = list(yaml.safe_load_all(package.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SubmitError(f"{package}: not a compiled pipeline ({e})") from None
    spec = docs[0] if docs and isinstance(docs[0], dict) else {}
    params = ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters")
    if not isinstance(params, dict):
        raise SubmitError(f"{package}: not a compiled pipeline (no root.inputDefinitions)")
    return set(params)


def run_arguments(submission: Submission) -> dict[str, Any]:
    """The run's arguments: the given parameters, and `namespace` (the jobs' namespace) set to
    the run's namespace where the pipeline has that parameter and it is not given."""
    params = dict(submission.params)
    if submission.namespace and "namespace" not in params and \
            "namespace" in package_parameters(submission.package):
        params["namespace"] = submission.namespace
    return params


def pipelines_token() -> str | None:
    """The pipelines token of a Kubeflow notebook pod, as kfp's client reads it in a cluster."""
    path = Path(os.environ.get(TOKEN_PATH_ENV) or TOKEN_PATH)
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def kfp_client(host: str | None = None, token: str | None = None):
    """kfp.Client for the KFP API at `host` (kfp_host), checked first (check_kfp_api); without
    a host or token, the in-cluster API with the pod's pipelines token, as kfp.Client()."""
    import kfp

    in_cluster = not host and not os.environ.get(HOST_ENV)
    token = token or (pipelines_token() if in_cluster else None)
    host = kfp_host(host)
    check_kfp_api(host, token)
    return kfp.Client(host=host, existing_token=token)


def submit(submission: Submission):
    """Create the run on Kubeflow Pipelines; returns kfp's RunPipelineResult."""
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    arguments = run_arguments(submission)
    client = kfp_client(submission.host, submission.token)
    host = kfp_host(submission.host)
    try:
        return client.create_run_from_pipeline_package(
            str(submission.package), arguments=arguments, run_name=submission.run_name,
            experiment_name=submission.experiment, namespace=submission.namespace,
            service_account=submission.service_account)
    except (HTTPError, ConnectionError) as e:
        raise SubmitError(f"--host {host}: Kubeflow Pipelines API unreachable ({e})") from None
    except ApiException as e:
        body = " ".join(str(e.body or "").split())[:300]
        raise SubmitError(f"--host {host}: Kubeflow Pipelines refused the run: HTTP {e.status} "
                          f"{e.reason}: {body}") from None
