"""docs/local-cluster.md's table of the versions tested together says what the repository pins:
each row's version is the one the file it names requires (a Go module's `require` line, a
requirements pin or install-control.sh's `==`)."""

from __future__ import annotations

import re

import pytest

from chexflow.envs import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "local-cluster.md"
# the module or package each row stands for, by the start of its first cell
NAMES = {
    "Kubernetes": "k8s.io/kubernetes", "etcd": "go.etcd.io/etcd/server/v3",
    "kwok": "sigs.k8s.io/kwok", "mpi-operator": "github.com/kubeflow/mpi-operator",
    "Kubeflow Trainer": "github.com/kubeflow/trainer/v2", "JobSet": "sigs.k8s.io/jobset",
    "Katib SDK": "kubeflow-katib", "Katib": "github.com/kubeflow/katib",
    "Kueue": "sigs.k8s.io/kueue", "scheduler-plugins": "sigs.k8s.io/scheduler-plugins",
    "KServe's Python server": "kserve", "KServe": "github.com/kserve/kserve",
    "distribution": "github.com/distribution/distribution/v3", "kfp": "kfp",
    "Kubeflow SDK": "kubeflow",
}


def rows() -> list[tuple[str, str, str]]:
    text = PAGE.read_text().split("## Versions tested together", 1)[1].split("\n## ", 1)[0]
    return [(m[1], m[2], m[3]) for m in
            re.finditer(r"^\| ([^|]+?) \| (v?[\d.]+) \| `([^`]+)` \|$", text, re.M)]


def pinned(path: str, name: str) -> str:
    text = (REPO_ROOT / path).read_text()
    if path.endswith("go.mod"):
        pattern = rf"^\s*(?:require )?{re.escape(name)} (v\S+)"
    else:
        pattern = rf"(?:^|\s){re.escape(name)}==(\S+)"
    found = re.search(pattern, text, re.M)
    assert found, f"{path}: no pin of {name}"
    return found.group(1)


def test_the_table_lists_every_project_once():
    assert sorted(next(n for n in NAMES if r[0].startswith(n)) for r in rows()) == sorted(NAMES)


@pytest.mark.parametrize("project,version,path", rows(), ids=[r[0] for r in rows()])
def test_each_version_is_the_one_pinned(project, version, path):
    name = next(NAMES[n] for n in NAMES if project.startswith(n))
    assert pinned(path, name) == version
