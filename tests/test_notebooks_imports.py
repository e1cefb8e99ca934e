"""Every notebook a Kubeflow user opens imports what the project's one environment installs
(images/install-trainer.sh --with-control, images/install-control.sh): each `import` and
`from ... import` in its code cells, run by this interpreter (.venv's, the kernel's). The cluster
tests execute the notebooks end to end; this finds a missing package without a cluster."""

from __future__ import annotations

import ast
import importlib

import nbformat
import pytest

from chexflow.envs import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def imports_of(notebook) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for each import statement in the code cells."""
    found = []
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                found += [(alias.name, []) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.append((node.module, [alias.name for alias in node.names]))
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_the_notebooks_imports_resolve_in_the_project_environment(notebook):
    imports = imports_of(notebook)
    assert imports, f"{notebook.name} imports nothing"
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in names:
            assert hasattr(loaded, name) or importlib.util.find_spec(f"{module}.{name}"), (
                f"{notebook.name}: from {module} import {name}")
