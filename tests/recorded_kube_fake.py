"""RecordedRequestFakeKubeApi: a FAKE Kubernetes API server for unit tests, not a cluster.

It replaces the REST layer of a real `kubernetes.client.ApiClient`, so the official client's own
code (CustomObjectsApi, BatchV1Api, CoreV1Api: URL building, serialisation, ApiException) runs
unchanged; only the HTTP round trip is answered here. Every request is recorded (method, path,
query, body) for assertions. A scripted "controller" moves each created job through the
conditions the test gives it, creates its launcher pod and serves that pod's log.
The real-cluster tests (marker `cluster`) run the same backend against a real API server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from kubernetes import client
from kubernetes.client.rest import ApiException, RESTClientObject, RESTResponse

HOST = "https://fake-kube-api.invalid"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: object


class _Resp:
    def __init__(self, status: int, payload: object):
        self.status = status
        self.reason = {200: "OK", 201: "Created", 403: "Forbidden", 404: "Not Found",
                       409: "Conflict"}.get(
            status, "Error"
        )
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.data = data.encode()

    def getheaders(self):
        return {"content-type": "application/json"}

    def getheader(self, name, default=None):
        return self.getheaders().get(name.lower(), default)


@dataclass
class FakeJob:
    obj: dict
    script: list[list[str]]  # condition types that become True, one list per GET
    gets: int = 0


@dataclass
class RecordedRequestFakeKubeApi(RESTClientObject):
    """Answers the Kubernetes REST calls chexflow's backend makes; records every one."""

    # name -> list of condition snapshots, e.g. [[], ["Created"], ["Created", "Running"], ...]
    scripts: dict[str, list[list[str]]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)  # job name -> launcher log text
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (reason, msg)
    # job name -> its pod's status (a V1PodStatus dict), or None: the job has no pod
    pod_status: dict[str, dict | None] = field(default_factory=dict)
    # job name -> its pods as the API returns them (metadata, spec, status): instead of the one
    # pod made from pod_status
    pods: dict[str, list[dict]] = field(default_factory=dict)
    # the cluster's Nodes (V1Node dicts); None: listing Nodes is forbidden (403), as for
    # mpijob/rbac.yaml's service account
    nodes: list[dict] | None = None
    # (METHOD, path regex, HTTP status): answered once each, in order, before real handling
    inject: list[tuple[str, str, int]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    # namespaces being deleted ("Terminating") or gone (None); any other is Active
    namespaces: dict[str, str | None] = field(default_factory=dict)
    # ClusterTrainingRuntimes that exist (Kubeflow Trainer v2)
    runtimes: set[str] = field(default_factory=lambda: {"chexflow-horovod"})
    # the image the runtimes run their node pods in: chexflow's runtime rendered for it
    runtime_image: str | None = None
    jobs: dict[tuple[str, str], FakeJob] = field(default_factory=dict)

    def __post_init__(self) -> None:  # no connection pool: nothing leaves the process
        pass

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = HOST
        api = client.ApiClient(cfg)
        api.rest_client = self
        return api

    # The one method every GET/POST/DELETE of RESTClientObject goes through.
    def request(self, method, url, query_params=None, headers=None, body=None, post_params=None,
                _preload_content=True, _request_timeout=None):
        parts = urlsplit(url)
        query = dict(query_params or []) | dict(parse_qsl(parts.query))
        self.requests.append(Recorded(method, parts.path, query, body))
        for i, (m, pattern, status) in enumerate(self.inject):
            if m == method and re.search(pattern, parts.path):
                del self.inject[i]
                raise ApiException(http_resp=RESTResponse(_Resp(status, {"message": "injected"})))
        status, payload = self._handle(method, parts.path, query, body)
        if not 200 <= status <= 299:
            raise ApiException(http_resp=RESTResponse(_Resp(status, payload)))
        response = RESTResponse(_Resp(status, payload))
        if _preload_content:  # as the real REST client hands it on: text (a log stays a str)
            response.data = response.data.decode("utf8")
        return response

    # --- routing ----------------------------------------------------------------------------
    def _handle(self, method, path, query, body):
        m = re.match(r"^/apis/(kubeflow\.org/v2beta1|batch/v1|trainer\.kubeflow\.org/v1alpha1)/"
                     r"namespaces/([^/]+)/(mpijobs|jobs|trainjobs)(?:/([^/]+))?$", path)
        if m:
            _, ns, plural, name = m.groups()
            kind = {"mpijobs": "MPIJob", "jobs": "Job", "trainjobs": "TrainJob"}[plural]
            return self._job(method, kind, ns, name, body)
        m = re.match(r"^/apis/trainer\.kubeflow\.org/v1alpha1/clustertrainingruntimes/([^/]+)$",
                     path)
        if m and method == "GET":
            if m.group(1) in self.runtimes and self.runtime_image:
                from chexflow.jobs.trainjob import horovod_runtime

                runtime = horovod_runtime(self.runtime_image)
                runtime["metadata"]["name"] = m.group(1)
                return 200, runtime
            if m.group(1) in self.runtimes:
                return 200, {"kind": "ClusterTrainingRuntime", "metadata": {"name": m.group(1)}}
            return 404, {"kind": "Status", "reason": "NotFound", "message":
                         f'clustertrainingruntimes.trainer.kubeflow.org "{m.group(1)}" not found'}
        if path == "/api/v1/nodes" and method == "GET":
            if self.nodes is None:
                return 403, {"kind": "Status", "reason": "Forbidden", "message":
                             'nodes is forbidden: cannot list resource "nodes"'}
            return 200, {"apiVersion": "v1", "kind": "NodeList", "items": self.nodes}
        m = re.match(r"^/api/v1/namespaces/([^/]+)$", path)
        if m and method == "GET":
            return self._namespace(m.group(1))
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods$", path)
        if m and method == "GET":
            return 200, self._pods(m.group(1), query.get("labelSelector", ""))
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$", path)
        if m and method == "GET":
            job = m.group(2).rsplit("-launcher", 1)[0].rsplit("-pod", 1)[0]
            text = self.logs.get(job, "")
            tail = int(query.get("tailLines", 0) or 0)
            lines = text.splitlines()[-tail:] if tail else text.splitlines()
            return 200, "\n".join(lines)
        m = re.match(r"^/api/v1/namespaces/([^/]+)/events$", path)
        if m and method == "GET":
            name = query.get("fieldSelector", "").split("=", 1)[-1]
            items = []
            if name in self.failures:
                items.append({
                    "metadata": {"name": f"{name}.1", "namespace": m.group(1)},
                    "involvedObject": {"name": name, "kind": next(
                        (j.obj["kind"] for (_, n), j in self.jobs.items() if n == name),
                        "MPIJob")},
                    "type": "Warning", "reason": self.failures[name][0],
                    "message": self.failures[name][1],
                })
            return 200, {"apiVersion": "v1", "kind": "EventList", "items": items}
        return 404, {"kind": "Status", "status": "Failure", "message": f"no route {path}"}

    def _namespace(self, ns):
        phase = self.namespaces.get(ns, "Active")
        if phase is None:
            return 404, {"kind": "Status", "reason": "NotFound",
                         "message": f'namespaces "{ns}" not found'}
        meta = {"name": ns, **({"deletionTimestamp": "2026-11-22T00:00:02Z"}
                               if phase == "Terminating" else {})}
        return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": meta,
                     "status": {"phase": phase}}

    def _job(self, method, kind, ns, name, body):
        if method == "POST":
            name = body["metadata"]["name"]
            if (ns, name) in self.jobs:
                return 409, {"kind": "Status", "reason": "AlreadyExists",
                             "message": f"{kind.lower()}s {name!r} already exists"}
            obj = json.loads(json.dumps(body))
            obj["metadata"]["creationTimestamp"] = "2026-11-22T00:00:00Z"
            default = [["Created"], ["Created", "Running"], ["Created", "Running", "Succeeded"]]
            self.jobs[(ns, name)] = FakeJob(obj, self.scripts.get(name, default))
            return 201, obj
        job = self.jobs.get((ns, name))
        if job is None:
            return 404, {"kind": "Status", "reason": "NotFound", "message": f"{name} not found"}
        if method == "DELETE":
            del self.jobs[(ns, name)]
            return 200, {"kind": "Status", "status": "Success"}
        snapshot = job.script[min(job.gets, len(job.script) - 1)]
        job.gets += 1
        if kind in ("Job", "TrainJob"):
            snapshot = ["Complete" if t == "Succeeded" else t for t in snapshot]
            snapshot = [t for t in snapshot if t in ("Complete", "Failed")]
        reason, message = self.failures.get(name, ("MPIJobFailed", "launcher failed"))
        conditions = [
            {"type": t, "status": "True",
             "reason": reason if t == "Failed" else t,
             "message": message if t == "Failed" else "",
             "lastTransitionTime": "2026-11-22T00:00:00Z"}
            for t in snapshot
        ]
        return 200, {**job.obj, "status": {"conditions": conditions}}

    def _pods(self, ns, selector):
        labels = dict(kv.split("=", 1) for kv in selector.split(",") if kv)
        items = []
        for (jns, name), _job in self.jobs.items():
            if jns != ns:
                continue
            if name in self.pods and name in selector:
                items.extend(self.pods[name])
                continue
            if labels.get("training.kubeflow.org/job-name") == name:
                pod_name = f"{name}-launcher"
            elif labels.get("jobset.sigs.k8s.io/jobset-name") == name:
                pod_name = f"{name}-launcher-0-0"
            elif labels.get("job-name") == name:
                pod_name = f"{name}-pod"
            else:
                continue
            if name in self.pod_status and self.pod_status[name] is None:
                continue
            items.append({"metadata": {"name": pod_name, "namespace": ns,
                                       "creationTimestamp": "2026-11-22T00:00:01Z"},
                          "status": self.pod_status.get(name)})
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
