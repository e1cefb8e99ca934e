"""The fields of Katib's v1beta1 Experiment, as Katib's SDK (kubeflow-katib 0.19.0, generated from
Katib's Go types) declares them: `check_path` refuses a `--set` path that names no field.

Katib's Experiment CRD has no schema (`x-kubernetes-preserve-unknown-fields`: its webhook
validates), so the SDK's models are where the fields are written down. They are read from the
wheel's source with `ast`, not imported: the package's `__init__` needs kubeflow-training, which
the control side does not install. `metadata` is a Kubernetes ObjectMeta (the Kubernetes client's
model); `trialSpec` is any object (the Job check in batchjob.py covers batch Jobs).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
from functools import cache
from pathlib import Path

ROOT = "V1beta1Experiment"
NESTED = re.compile(r"^(list|dict)\((?:str, )?(.+)\)$|^list\[(.+)\]$")


@cache
def katib_models() -> dict[str, dict[str, str]]:
    """Model class name -> {JSON field: type}, from the installed kubeflow-katib wheel ({} if
    it is not installed)."""
    spec = importlib.util.find_spec("kubeflow")
    out: dict[str, dict[str, str]] = {}
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted((Path(folder) / "katib" / "models").glob("v1beta1_*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    out[node.name] = _fields(node)
    return out


def _fields(cls: ast.ClassDef) -> dict[str, str]:
    found = {}
    for stmt in cls.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map"):
            found[target.id] = ast.literal_eval(stmt.value)
    types, names = found.get("openapi_types", {}), found.get("attribute_map", {})
    return {names[attr]: kind for attr, kind in types.items() if attr in names}


def _model_fields(type_name: str) -> dict[str, str] | None:
    """{JSON field: type} of a Katib model or a Kubernetes client model; None if neither."""
    if type_name in katib_models():
        return katib_models()[type_name]
    if type_name.startswith("V1") and not type_name.startswith("V1beta1"):
        import kubernetes.client

        model = getattr(kubernetes.client, type_name, None)
        if model is not None:
            return {model.attribute_map[a]: t for a, t in model.openapi_types.items()}
    return None


def check_path(tokens: list[str]) -> str | None:
    """Why `tokens` (`spec`, `parameters`, `[0]`, ...) is not a path of an Experiment, or None.
    None too when the SDK's models are not installed (nothing to check against)."""
    if ROOT not in katib_models():
        return None
    type_name, where = ROOT, ""
    for tok in tokens:
        nested = NESTED.match(type_name)
        if nested:
            inner = nested.group(2) or nested.group(3)
            if type_name.startswith("dict"):  # a map: any key
                type_name, where = inner, f"{where}.{tok}"
                continue
            if not tok.startswith("["):
                return f"{where} is a list; expected an index, e.g. {where}[0]"
            type_name, where = inner, where + tok
            continue
        if type_name == "object":  # free-form (trialSpec, and the like)
            return None
        fields = _model_fields(type_name)
        if fields is None:
            return f"{where} is a value of type {type_name}, not a mapping" if where else None
        if tok.startswith("["):
            return f"{where} is not a list"
        if tok not in fields:
            close = difflib.get_close_matches(tok, list(fields), n=1)
            hint = (f"did you mean {close[0]}?" if close
                    else f"its fields: {', '.join(sorted(fields))}")
            return f"{where or 'an Experiment'} has no field {tok} ({hint})"
        type_name, where = fields[tok], f"{where}.{tok}" if where else tok
    return None
