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
import re
from pathlib import Path

import yaml

from chexflow.errors import ChexflowError
from chexflow.katib.experiment import yamltext
from chexflow.katib.experiment.model import TRIAL_PARAM_RE, ConfigMapTemplate

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


# ---- placeholders that lost their quotes ---------------------------------------------------
# How Katib's controller reads a plain (unquoted) YAML scalar once it has put a trial's values
# in the template's text: sigs.k8s.io/yaml over go-yaml v2 (go.yaml.in/yaml/v2 resolve.go).
GO_YAML_BOOLS = {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
                 "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
GO_YAML_NULLS = {"", "~", "null", "Null", "NULL"}
GO_YAML_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
GO_YAML_SPECIAL_FLOATS = {f"{sign}{dot}" for sign in ("", "+", "-")
                          for dot in (".inf", ".Inf", ".INF")} | {".nan", ".NaN", ".NAN"}
# the fields of a container that the API server takes as strings only
STRING_LISTS = ("command", "args")


def go_yaml_type(text: str) -> str:
    """What go-yaml v2 makes of a plain scalar: str, bool, null, int or float."""
    if text in GO_YAML_BOOLS:
        return "bool"
    if text in GO_YAML_NULLS:
        return "null"
    if text in GO_YAML_SPECIAL_FLOATS:
        return "float"
    if text[:1] not in tuple("+-.0123456789"):
        return "str"
    plain = text.replace("_", "")
    if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO]?[0-7]+|0[bB][01]+|[0-9]+)", plain):
        return "int"  # Go's ParseInt with base 0
    return "float" if GO_YAML_FLOAT.match(plain) else "str"


def _string_scalars(node: yaml.Node, path: str, inside: str = ""):
    """(path, node) of each scalar the API server takes as a string only: a container's
    command and args items and its env values."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = getattr(key, "value", "")
            if name in STRING_LISTS and isinstance(value, yaml.SequenceNode):
                for i, item in enumerate(value.value):
                    if isinstance(item, yaml.ScalarNode):
                        yield f"{path}.{name}[{i}]", item
            elif name == "value" and inside == "env" and isinstance(value, yaml.ScalarNode):
                yield f"{path}.value", value
            else:
                yield from _string_scalars(value, f"{path}.{name}" if path else name, name)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _string_scalars(item, f"{path}[{i}]", inside)


def unquoted_placeholder(template: ConfigMapTemplate, values: dict[str, list[str]]
                         ) -> tuple[str, str] | None:
    """(field, why) for the first container arg, command word or env value of the ConfigMap's
    template written as a plain (unquoted) YAML scalar holding a `${trialParameters.X}` that one
    of X's `values` turns into no string. Katib puts a trial's values into the ConfigMap's text
    and reads that as YAML (pkg/controller.v1beta1/experiment/manifest/generator.go
    applyParameters, GetRunSpecWithHyperParameters -> util.ConvertStringToUnstructured), so
    `- ${trialParameters.lr}` becomes the number 0.01; the API server refuses the trial's job
    (args are strings), the Trial stays Created, and only katib-controller's log says why
    (trial_controller.go reconcileJob: "Create job error"). Else None."""
    text = str((template.config_map.get("data") or {}).get(template.key) or "")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None  # refused where the template is read
    for path, node in _string_scalars(root, ""):
        if node.style is not None or "${trialParameters." not in node.value:
            continue
        names = TRIAL_PARAM_RE.findall(node.value)
        for name in names:
            for value in values.get(name, []):
                made = TRIAL_PARAM_RE.sub(lambda m, n=name, v=value: v if m.group(1) == n
                                          else "x", node.value)
                kind = go_yaml_type(made)
                if kind == "str":
                    continue
                what = "an arg" if ".args[" in path else "a command word" \
                    if ".command[" in path else "an env value"
                return (f"spec.trialTemplate.configMap: {template.where}: {path}",
                        f"{node.value} is not quoted: Katib puts a trial's value in the "
                        f"template's text and reads it as YAML, so {value} makes {what} "
                        f"a YAML {kind}, not a string; the API "
                        f"server then refuses the trial's {template.trial_spec.get('kind')} "
                        f"and the Trial stays Created (only katib-controller's log says why): "
                        f"write \"{node.value}\" in double quotes")
    return None
