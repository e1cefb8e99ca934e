"""Locating the two Python environments: control (this one, usually) and trainer.

In a cluster they are two images; locally they are `.venv/` and `.venv-trainer/` at the
repository root, created by `make setup`. `CHEXFLOW_TRAINER_PYTHON` overrides the trainer's
interpreter (a path to `python` in any environment with TensorFlow and Horovod).
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
    if in_trainer_env():
        return Path(sys.executable)
    override = os.environ.get(TRAINER_ENV_VAR)
    if override:
        path = Path(override)
        if not path.exists():
            raise EnvironmentMissing(f"{TRAINER_ENV_VAR}={override}: no such interpreter")
        return path
    path = REPO_ROOT / ".venv-trainer" / "bin" / "python"
    if path.exists():
        return path
    venv = path.parent.parent
    raise EnvironmentMissing(
        f"the trainer environment (TensorFlow 2.15 + Horovod) was not found at {venv}.\n"
        f"Create it with `make setup-trainer` (or images/install-trainer.sh {venv}),\n"
        f"or point {TRAINER_ENV_VAR} at a python that has tensorflow and horovod."
    )


def with_chexflow_importable(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` whose PYTHONPATH lets any interpreter import chexflow from this source
    tree: a CHEXFLOW_TRAINER_PYTHON interpreter need not have chexflow installed."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return out


def trainer_bin(name: str) -> Path:
    """An executable (e.g. horovodrun) next to the trainer interpreter."""
    return trainer_python().parent / name
