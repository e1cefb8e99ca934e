"""The shared reference folder: real upstream inputs kept read-only beside the repository
(`../shared/reference/`: the Kubeflow CRDs, Katib's example Experiments; provenance in its
README.md). `CHEXFLOW_REFERENCE_DIR` points elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

from chexflow.envs import REPO_ROOT
from chexflow.errors import ChexflowError

REFERENCE_ENV = "CHEXFLOW_REFERENCE_DIR"
CANDIDATES = (REPO_ROOT.parent / "shared" / "reference", Path("/work/shared/reference"))


class ReferenceMissing(ChexflowError):
    """The shared reference folder was not found."""


def reference_dir() -> Path:
    """The first candidate folder that holds the reference README.md."""
    override = os.environ.get(REFERENCE_ENV)
    candidates = (Path(override),) if override else CANDIDATES
    for d in candidates:
        if (d / "README.md").is_file():
            return d
    raise ReferenceMissing(
        f"the shared reference folder (README.md, crds/, katib-examples/) is not in "
        f"{', '.join(map(str, candidates))}; set {REFERENCE_ENV} to it"
    )
