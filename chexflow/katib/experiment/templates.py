"""Trial templates kept in a ConfigMap (`spec.trialTemplate.configMap`), read from the repository.

Katib reads `configMap: {configMapName, configMapNamespace, templatePath}` from the cluster
(its webhook when the Experiment is created, its controller for every trial:
`manifest/generator.go` GetTrialTemplate): the ConfigMap's `data[templatePath]` is the trial's
YAML. chexflow reads the same ConfigMap from a file: `--trial-templates FILE`, else
`trial-templates.yaml` beside the spec or in the folder above it (katib/ for katib/specs/*.yaml).
A change to the template (`--set spec.trialTemplate.trialSpec...`, and on a cluster `--trial-arg`
or `--volume`) inlines it as trialSpec (`inline`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from chexflow.errors import ChexflowError
from chexflow.katib.experiment import yamltext
from chexflow.katib.experiment.model import ConfigMapTemplate

TEMPLATES_FILE = "trial-templates.yaml"
TRIAL_SPEC_PATH = "spec.trialTemplate.trialSpec"


class TemplateError(ChexflowError):
    """A ConfigMap template that cannot be read; the message names the file and ConfigMap."""


def template_files(spec_path: Path, given: Path | None = None) -> list[Path]:
    """Where the ConfigMap is looked for: `given`, else TEMPLATES_FILE beside the spec or above."""
    if given is not None:
        return [Path(given)]
    folder = Path(spec_path).absolute().parent
    return [folder / TEMPLATES_FILE, folder.parent / TEMPLATES_FILE]


def describe(ref: dict) -> str:
    return (f"ConfigMap {ref.get('configMapNamespace')}/{ref.get('configMapName')} "
            f"({ref.get('templatePath')})")


def not_found(ref: dict, files: list[Path]) -> str:
    """One line: the ConfigMap and where it was looked for."""
    return (f"{describe(ref)} is in none of {', '.join(map(str, files)) or 'no file'}: give "
            "its file with --trial-templates FILE")


def _documents(file: Path) -> list:
    try:
        return yamltext.load_all(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise TemplateError(f"{file}: {yamltext.problem(e)}") from None
    except UnicodeDecodeError as e:
        raise TemplateError(f"{file}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise TemplateError(f"{file}: {e.strerror}") from None


def read_config_map(ref: dict, files: list[Path]) -> ConfigMapTemplate | None:
    """The ConfigMap `ref` names, from the first of `files` that holds it (None: none does)."""
    name, namespace, key = (str(ref.get(k) or "") for k in
                            ("configMapName", "configMapNamespace", "templatePath"))
    for file in files:
        if not file.is_file():
            continue
        for doc in _documents(file):
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            if (doc.get("kind") != "ConfigMap" or not isinstance(meta, dict)
                    or meta.get("name") != name
                    or meta.get("namespace") not in (None, namespace)):
                continue
            data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
            if key not in data:
                raise TemplateError(f"{file}: {describe(ref)}: no key {key!r} in its data (has "
                                    f"{', '.join(sorted(data)) or 'none'}); Katib would refuse "
                                    "the Experiment: unable to find trial template in ConfigMap")
            try:
                spec = yamltext.load(str(data[key]))
            except yaml.YAMLError as e:
                above = _lines_above_template(file, name, key)
                raise TemplateError(f"{file}: {describe(ref)}: "
                                    f"{'' if above is not None else 'in its template, '}"
                                    f"{yamltext.problem(e, above or 0)}") from None
            if not isinstance(spec, dict):
                raise TemplateError(f"{file}: {describe(ref)}: expected a mapping (a trial "
                                    "resource such as an MPIJob)")
            return ConfigMapTemplate(name, namespace, key, file, doc, spec)
    return None


def _lines_above_template(file: Path, name: str, key: str) -> int | None:
    """How many lines of the file come before ConfigMap `name`'s data[key], when that is a
    literal block (`key: |`), whose lines are the file's; None for another style."""
    for doc in yaml.compose_all(file.read_text(encoding="utf-8"), Loader=yaml.SafeLoader):
        fields = _node_fields(doc)
        meta = _node_fields(fields.get("metadata"))
        name_node = meta.get("name")
        if getattr(fields.get("kind"), "value", None) != "ConfigMap" or \
                getattr(name_node, "value", None) != name:
            continue
        node = _node_fields(fields.get("data")).get(key)
        if isinstance(node, yaml.ScalarNode) and node.style == "|":
            return node.start_mark.line + 1
    return None


def _node_fields(node) -> dict:
    """A mapping node's values by their (scalar) keys; {} for any other node."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}


def inline(raw: dict, template: ConfigMapTemplate) -> None:
    """Put the ConfigMap's template in the Experiment as trialSpec (no configMap left)."""
    tt = raw["spec"]["trialTemplate"]
    tt.pop("configMap", None)
    tt["trialSpec"] = copy.deepcopy(template.trial_spec)


def resolve(raw: dict, spec_path: Path, given: Path | None, trial_spec_sets: list[str]
            ) -> tuple[ConfigMapTemplate | None, list[Path]]:
    """Read the Experiment's ConfigMap template, if it has one (inlined when `--set` changes
    the trialSpec: `trial_spec_sets`); returns it and the files looked in."""
    spec = raw.get("spec") if isinstance(raw.get("spec"), dict) else {}
    tt = spec.get("trialTemplate") if isinstance(spec.get("trialTemplate"), dict) else {}
    ref = tt.get("configMap")
    if not isinstance(ref, dict) or "trialSpec" in tt:
        return None, []  # the webhook's rules refuse such a spec later, in one line
    files = template_files(spec_path, given)
    found = read_config_map(ref, files)
    if found is None and given is not None:
        raise TemplateError(f"--trial-templates {given}: " + (
            f"no {describe(ref)} in it" if Path(given).is_file() else "no such file"))
    changes = [o.partition("=")[0] for o in trial_spec_sets]
    if changes:
        if found is None:
            raise TemplateError(f"{spec_path}: --set {changes[0]}: changes the trial template, "
                                f"but {not_found(ref, files)}")
        inline(raw, found)
        return None, files
    return found, files
