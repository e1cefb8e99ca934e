"""A shipped Katib spec made to name its template in ConfigMap chexflow-trial-templates
(`trialTemplate.configMap`), as a spec of one's own does, instead of carrying it inline."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from chexflow.envs import REPO_ROOT
from chexflow.katib.experiment.chexnet_template import CONFIG_MAP, MARKER_RE

KATIB = REPO_ROOT / "katib"
TEMPLATES = KATIB / "trial-templates.yaml"


def configmap_spec(name: str, folder: Path, namespace: str = "kubeflow",
                   with_templates: bool = True) -> Path:
    """folder/specs/NAME.yaml: katib/specs/NAME.yaml in `namespace` whose trialTemplate names
    the ConfigMap key its trialSpec copies (configMapNamespace `namespace`); with
    `with_templates`, a copy of katib/trial-templates.yaml in `folder` (where the local runner
    looks for it: the folder above the spec's)."""
    source = KATIB / "specs" / f"{name}.yaml"
    key = MARKER_RE.search(source.read_text()).group("key")
    raw = yaml.safe_load(source.read_text())
    raw["metadata"]["namespace"] = namespace
    template = raw["spec"]["trialTemplate"]
    template.pop("trialSpec")
    template["configMap"] = {"configMapName": CONFIG_MAP, "configMapNamespace": namespace,
                             "templatePath": key}
    path = folder / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    if with_templates:
        shutil.copyfile(TEMPLATES, folder / TEMPLATES.name)
    return path
