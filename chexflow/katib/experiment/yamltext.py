"""Every YAML text chexflow's Katib reads: an Experiment spec, a trial-template ConfigMap file,
the template in a ConfigMap's data, a `--set` value.

PyYAML keeps the last of two equal keys in a mapping without a word, as `kubectl apply -f`
does; YAML forbids them and Kubernetes' strict readers refuse them (kustomize: `yaml: unmarshal
errors: line 7: mapping key "x" already defined at line 6`; the API server's strict decoding of
a YAML body: `key "x" already set in map`). So a key given twice is refused here (DuplicateKey),
with both lines, instead of one of the two values being silently dropped.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A mapping key given twice (lines count from 1)."""

    def __init__(self, key: Any, first: int, second: int):
        super().__init__(key, first, second)
        self.key, self.first, self.second = key, first, second

    def text(self, line_offset: int = 0) -> str:
        key = json.dumps(str(self.key))
        return (f"line {self.second + line_offset}: mapping key {key} already defined at line "
                f"{self.first + line_offset} (YAML allows a key once; kubectl apply -f would "
                "silently keep the last: keep one)")


class _StrictLoader(_BASE_LOADER):
    """The safe loader, refusing a mapping key given twice (`<<` merges may override)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKey(key, seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep)


def load_all(text: str) -> list:
    """The documents of a YAML text (empty ones left out); yaml.YAMLError (DuplicateKey among
    them) when it is not valid."""
    return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]


def load(text: str) -> Any:
    """One YAML document (a ConfigMap's template, a `--set` value)."""
    return yaml.load(text, Loader=_StrictLoader)


def problem(e: yaml.YAMLError, line_offset: int = 0) -> str:
    """What is wrong with the text, in one line (`line_offset`: lines above the text in its
    file, for a text read from inside another)."""
    if isinstance(e, DuplicateKey):
        return e.text(line_offset)
    return f"not valid YAML ({str(e).splitlines()[0]})"
