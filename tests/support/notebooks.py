"""Notebooks executed as a Kubeflow user runs them: cell by cell with nbclient on a kernel of the
project's one environment (ipykernel's `python3` spec runs this process's interpreter, .venv's),
the parameters cell followed by the test's values, as papermill injects them."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(notebook: Path, folder: Path, timeout: int = 600, **params) -> nbformat.NotebookNode:
    """`notebook` run in `folder` with `params` set after its parameters cell; a failing cell
    raises nbclient's CellExecutionError."""
    nb = nbformat.read(notebook, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(
        "\n".join(f"{name} = {value!r}" for name, value in params.items()),
        metadata={"tags": ["injected-parameters"]}))
    NotebookClient(nb, timeout=timeout, kernel_name=nb.metadata.kernelspec.name,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def text_of(nb: nbformat.NotebookNode) -> str:
    """What the code cells printed."""
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []))
