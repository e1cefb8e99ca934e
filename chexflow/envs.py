"""Locating the trainer's Python: the one with TensorFlow and Horovod.

Locally it is the one environment `make setup` creates (`.venv/`, which also holds kfp), so
it is usually this interpreter. In a cluster the trainer and launcher are two images.
`CHEXFLOW_TRAINER_PYTHON` overrides it (a path to `python` in any environment with TensorFlow
and Horovod, e.g. the TF 2.15 baseline of `chexflow bench --only tf-stack`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from chexflow.errors import ChexflowError

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAINER_ENV_VAR = "CHEXFLOW_TRAINER_PYTHON"


class EnvironmentMissing(ChexflowError):
    """The trainer environment could not be found."""


def in_trainer_env() -> bool:
    """True when this interpreter has TensorFlow and Horovod (the trainer environment)."""
    return all(importlib.util.find_spec(m) is not None for m in ("tensorflow", "horovod"))


def trainer_python() -> Path:
    """The trainer environment's interpreter, or a clear error saying how to create it."""
    override = os.environ.get(TRAINER_ENV_VAR)
    if override:
        path = Path(override)
        if not path.exists():
            raise EnvironmentMissing(f"{TRAINER_ENV_VAR}={override}: no such interpreter")
        return path
    if in_trainer_env():
        return Path(sys.executable)
    path = REPO_ROOT / ".venv" / "bin" / "python"
    if path.exists() and path.resolve() != Path(sys.executable).resolve():
        return path
    raise EnvironmentMissing(
        f"this Python ({sys.executable}) has no TensorFlow and Horovod, and {path.parent.parent}"
        f" is not another environment that does. Create it with `make setup` (or "
        f"images/install-trainer.sh .venv --editable --with-control), or point {TRAINER_ENV_VAR}"
        f" at a python that has tensorflow and horovod."
    )


def with_chexflow_importable(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` whose PYTHONPATH lets any interpreter import chexflow from this source
    tree: a CHEXFLOW_TRAINER_PYTHON interpreter need not have chexflow installed."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return out
