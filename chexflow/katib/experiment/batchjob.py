"""Katib's `validatePatchJob` for batch Job trials: every field of the trialSpec must be a field
of a Kubernetes batch/v1 Job (the Kubernetes client's models give the schema).

Katib converts the trialSpec to a Go `batchv1.Job`, diffs it with the original and refuses any
difference other than a removal under `resources.limits`/`resources.requests`: a field the Job
type does not have is dropped by the conversion and reported with its JSON pointer.
"""

from __future__ import annotations

import re
from typing import Any

NESTED = re.compile(r"^(list|dict)\((?:str, )?(.+)\)$|^list\[(.+)\]$")


def _model(type_name: str):
    import kubernetes.client

    return getattr(kubernetes.client, type_name, None)


def unknown_fields(obj: Any, type_name: str = "V1Job", pointer: str = "") -> list[str]:
    """JSON pointers of the fields in `obj` that `type_name` (a client model) does not have."""
    if "resources/limits" in pointer or "resources/requests" in pointer:
        return []
    m = NESTED.match(type_name)
    if m:
        inner = m.group(2) or m.group(3)
        if isinstance(obj, list) and type_name.startswith("list"):
            items = enumerate(obj)
        elif isinstance(obj, dict) and type_name.startswith("dict"):
            items = obj.items()
        else:
            return []
        return [f for k, v in items for f in unknown_fields(v, inner, f"{pointer}/{k}")]
    model = _model(type_name)
    if model is None or not isinstance(obj, dict):
        return []
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    out = []
    for key, value in obj.items():
        attr = by_json.get(key)
        if attr is None:
            out.append(f"{pointer}/{key}")
        else:
            out += unknown_fields(value, model.openapi_types[attr], f"{pointer}/{key}")
    return out
