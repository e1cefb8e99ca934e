"""Validate an object against a CustomResourceDefinition's openAPIV3Schema, as the API server does.

Two checks: the schema itself (types, enums, required fields, patterns, int-or-string) with
jsonschema, and structural pruning: a field the schema does not declare would be silently dropped
by the API server, so it is reported here as an error (like `kubectl apply --validate=strict`).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import yaml

from chexflow.errors import ChexflowError

# Fields every object has whose schema the API server supplies itself.
_OBJECT_META_PATHS = {("metadata",)}


class SchemaError(ChexflowError):
    """An object does not match its CRD schema."""


def load_crd(path: Path | str) -> dict[str, Any]:
    """The CustomResourceDefinition document in `path` (the first with kind CRD)."""
    return copy.deepcopy(_load_crd(str(Path(path).resolve())))


@functools.lru_cache(maxsize=8)
def _load_crd(path: str) -> dict[str, Any]:
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                return doc
    raise SchemaError(f"{path}: no CustomResourceDefinition document found")


def crd_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    names = [v["name"] for v in crd["spec"]["versions"]]
    raise SchemaError(f"CRD {crd['metadata']['name']}: no version {version!r} (has {names})")


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour) to JSON Schema: int-or-string and nullable."""
    if isinstance(node, list):
        return [_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        if "pattern" in out:  # the pattern applies to the string form only
            pattern = out.pop("pattern")
            out["anyOf"] = [{"type": "integer"}, {"type": "string", "pattern": pattern}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("format", None)  # int32/int64/date-time: not checked by the API server's schema either
    return out


@functools.lru_cache(maxsize=8)
def _validator(schema_json: str):
    import jsonschema

    return jsonschema.Draft7Validator(_to_jsonschema(json.loads(schema_json)))


def unknown_fields(obj: Any, schema: dict[str, Any], path: tuple = ()) -> list[str]:
    """Dotted paths of fields the schema does not declare (the API server would prune them)."""
    found: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields") or path in _OBJECT_META_PATHS:
        return found
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            sub = path + (key,)
            if props is not None and key in props:
                found += unknown_fields(value, props[key], sub)
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, sub)
            elif extra is True:
                continue
            else:
                found.append(".".join(map(str, sub)))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], path + (i,))
    return found


def validate_against_crd(
    obj: dict[str, Any], crd: dict[str, Any] | Path | str, version: str | None = None
) -> None:
    """Raise SchemaError listing every problem with `obj` under the CRD's schema."""
    if not isinstance(crd, dict):
        crd = load_crd(crd)
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    api_version = obj.get("apiVersion", "")
    if version is None:
        version = api_version.split("/", 1)[-1]
    where = f"{kind} {obj.get('metadata', {}).get('name', '?')}"
    problems: list[str] = []
    if api_version != f"{group}/{version}":
        problems.append(f"apiVersion is {api_version!r}, expected {group}/{version}")
    if obj.get("kind") != kind:
        problems.append(f"kind is {obj.get('kind')!r}, expected {kind}")
    schema = crd_schema(crd, version)
    validator = _validator(json.dumps(schema, sort_keys=True))
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        at = ".".join(map(str, err.absolute_path)) or "(root)"
        problems.append(f"{at}: {err.message}")
    problems += [f"{p}: unknown field (not in the CRD schema)" for p in unknown_fields(obj, schema)]
    if problems:
        crd_name = crd["metadata"]["name"]
        raise SchemaError(f"{where} does not match CRD {crd_name}: " + "; ".join(problems))


def validate_mpijob(obj: dict[str, Any], crd: dict[str, Any] | Path | str) -> None:
    """CRD schema plus what the mpi-operator's validation adds (replica types, launcher count)."""
    validate_against_crd(obj, crd, version="v2beta1")
    replicas = obj["spec"]["mpiReplicaSpecs"]
    name = obj["metadata"]["name"]
    bad = sorted(set(replicas) - {"Launcher", "Worker"})
    if bad or "Launcher" not in replicas:
        raise SchemaError(
            f"MPIJob {name}: mpiReplicaSpecs must have Launcher (+ Worker), unknown: {bad}"
        )
    policy = obj["spec"].get("runPolicy", {}).get("cleanPodPolicy")
    if policy not in ("All", "Running", "None"):
        raise SchemaError(
            f"MPIJob {name}: spec.runPolicy.cleanPodPolicy must be set to All, Running or None "
            f"(unset means None: finished workers keep running), got {policy!r}"
        )
    if replicas["Launcher"].get("replicas", 1) != 1:
        raise SchemaError(f"MPIJob {name}: mpiReplicaSpecs.Launcher.replicas must be 1")
