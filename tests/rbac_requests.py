"""Kubernetes API requests as RBAC authorizes them (API group, resource, verb, namespaced or
cluster-wide), the same for a recorded-request fake and a real apiserver; and what the Roles and
ClusterRoles of an RBAC YAML grant, so a test compares the two."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import yaml

VERBS = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}


@dataclass(frozen=True)
class Access:
    group: str
    resource: str  # plural, with its subresource: pods/log
    verb: str
    namespaced: bool

    def __str__(self) -> str:
        where = "namespaced" if self.namespaced else "cluster-wide"
        return f"{self.verb} {self.resource}.{self.group or 'core'} ({where})"


def access(method: str, path: str, query: dict) -> Access:
    """The RBAC request of one API call (Kubernetes' RequestInfoFactory, in short)."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = rest[:1] == ["namespaces"] and len(rest) > 2
    if namespaced:
        rest = rest[2:]
    elif rest[:1] == ["namespaces"] and len(rest) == 2:
        namespaced = True  # a namespace read by name counts as in that namespace (RequestInfo)
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    watch = str(query.get("watch", "")).lower() == "true"
    verb = VERBS.get(method) or ("watch" if watch else "get" if len(rest) >= 2 else "list")
    return Access(group, resource, verb, namespaced)


def granted(*files: Path) -> set[Access]:
    """What the Roles (namespaced) and ClusterRoles (cluster-wide) of the files grant."""
    out: set[Access] = set()
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if not doc or doc.get("kind") not in ("Role", "ClusterRole"):
                continue
            for rule in doc["rules"]:
                out |= {Access(g, r, v, doc["kind"] == "Role") for g in rule["apiGroups"]
                        for r in rule["resources"] for v in rule["verbs"]}
    return out


class StatusRecorder:
    """Every request an ApiClient sends and the HTTP status it got back (the client's REST
    layer wrapped: what RBAC allowed or refused, also where the caller goes on after a 403)."""

    def __init__(self, api_client) -> None:
        self.calls: list[tuple[Access, int]] = []
        rest = api_client.rest_client
        original = rest.request

        def request(method, url, query_params=None, *args, **kwargs):
            parts = urlsplit(url)
            query = dict(query_params or []) | dict(parse_qsl(parts.query))
            try:
                response = original(method, url, query_params, *args, **kwargs)
            except Exception as e:
                self.calls.append((access(method, parts.path, query), getattr(e, "status", 0)))
                raise
            self.calls.append((access(method, parts.path, query),
                               getattr(response, "status", 200)))
            return response

        rest.request = request

    def refused(self) -> list[Access]:
        return [a for a, status in self.calls if status == 403]

    def used(self) -> set[Access]:
        return {a for a, _ in self.calls}
