"""notebooks/submit.ipynb executed cell by cell with nbclient on a kernel of the project's one
environment (ipykernel's `python3` spec runs the interpreter of this process, .venv's), as a
Kubeflow user runs it, its parameters cell followed by the test's values (as papermill injects
them). No KFP API server can run here: the submissions go to FakeKfpApi (a recorded-request
FAKE of the API's endpoints, tests/kfp_fake.py), or to a closed port."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from chexflow.envs import REPO_ROOT
from chexflow.ports import free_port
from tests.kfp_fake import FakeKfpApi
from tests.support import notebooks
from tests.support.notebooks import text_of

NOTEBOOK = REPO_ROOT / "notebooks" / "submit.ipynb"


def execute(folder: Path, **params) -> nbformat.NotebookNode:
    """The notebook run in `folder` with `params` set after its parameters cell."""
    return notebooks.execute(NOTEBOOK, folder, **params)


def test_the_notebook_submits_both_runs_as_chexflows_account_and_checks_the_local_run(
        tmp_path, monkeypatch):
    """Every cell runs: the compiled chexnet-train and the scaling-study function are each
    submitted as chexflow-launcher, the first with the pipeline's namespace parameter set to
    the notebook's NAMESPACE; the local run's arguments are checked (LOCAL_DRY_RUN)."""
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp's client keeps a context file there
    with FakeKfpApi() as kfp:
        nb = execute(tmp_path, HOST=kfp.url, NAMESPACE="team-a", LOCAL_DRY_RUN=True)
        runs = kfp.posted("/apis/v2beta1/runs")
        experiments = kfp.posted("/apis/v2beta1/experiments")
    assert [r["service_account"] for r in runs] == ["chexflow-launcher"] * 2
    compiled, function = (r["runtime_config"]["parameters"] for r in runs)
    assert compiled["namespace"] == "team-a" and compiled["raw_dir"] == "/mnt/chexflow/nih"
    assert function["namespace"] == "team-a" and function["worker_counts"] == [1, 2, 4, 8]
    assert {e["namespace"] for e in experiments} == {"team-a"}
    text = text_of(nb)
    assert "chexnet-train.yaml to " + kfp.url + ", namespace team-a, as chexflow-launcher" in text
    assert "run: chexnet-train: every parameter checked as its steps check them" in text
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_a_closed_port_stops_the_notebook_at_the_submission_with_one_line(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    host = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CellExecutionError) as err:
        execute(tmp_path, HOST=host, LOCAL_DRY_RUN=True)
    assert err.value.ename == "SubmitError"
    assert err.value.evalue == (f"--host {host}: no Kubeflow Pipelines API there: connection "
                                "refused")
