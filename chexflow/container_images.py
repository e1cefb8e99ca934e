"""Container image names and tags: the one place pipelines, MPIJobs and Katib trials take them from.

Defaults are `ghcr.io/chexflow/trainer:<version>` and `ghcr.io/chexflow/launcher:<version>`
(built from images/trainer/Dockerfile and images/launcher/Dockerfile). Override them per run with
environment variables, most specific first:

- CHEXFLOW_TRAINER_IMAGE, CHEXFLOW_LAUNCHER_IMAGE: a whole reference (`reg.io/team/trainer:v3`);
- CHEXFLOW_IMAGE_REGISTRY (default `ghcr.io/chexflow`), CHEXFLOW_IMAGE_TAG (default: version).

Pipelines take these as compile parameters (`trainer_image()` as the default value), so a
compiled pipeline names its images explicitly.
"""

from __future__ import annotations

import os
import re

from chexflow import __version__
from chexflow.errors import ChexflowError

TRAINER_IMAGE_ENV = "CHEXFLOW_TRAINER_IMAGE"
LAUNCHER_IMAGE_ENV = "CHEXFLOW_LAUNCHER_IMAGE"
REGISTRY_ENV = "CHEXFLOW_IMAGE_REGISTRY"
TAG_ENV = "CHEXFLOW_IMAGE_TAG"
DEFAULT_REGISTRY = "ghcr.io/chexflow"
DEFAULT_TAG = __version__

# The Dockerfiles, relative to the repository root (the build context).
DOCKERFILES = {"trainer": "images/trainer/Dockerfile", "launcher": "images/launcher/Dockerfile"}

# [host[:port]/]path[:tag][@digest], as the Docker reference grammar allows (lower-case path).
_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


class InvalidImage(ChexflowError):
    """An image reference that a container runtime would reject."""


def check_reference(ref: str, source: str) -> str:
    """Return `ref` if it is a valid image reference, else raise naming where it came from."""
    if not _REFERENCE.match(ref):
        raise InvalidImage(
            f"{source}={ref!r} is not an image reference: expected [registry/]name[:tag]"
            " such as reg.example.org/chexflow/trainer:0.1.0 (lower-case name)"
        )
    return ref


def _image(name: str, env_var: str) -> str:
    whole = os.environ.get(env_var)
    if whole:
        return check_reference(whole, env_var)
    registry = os.environ.get(REGISTRY_ENV, DEFAULT_REGISTRY).rstrip("/")
    tag = os.environ.get(TAG_ENV, DEFAULT_TAG)
    return check_reference(f"{registry}/{name}:{tag}", f"{REGISTRY_ENV}/{TAG_ENV}")


def trainer_image() -> str:
    """The GPU training image (MPIJob launcher + workers, Katib trials, Apptainer source)."""
    return _image("trainer", TRAINER_IMAGE_ENV)


def launcher_image() -> str:
    """The control image KFP components run in (kfp preinstalled: install_kfp_package=False)."""
    return _image("launcher", LAUNCHER_IMAGE_ENV)


def images() -> dict[str, str]:
    """Both references, by role."""
    return {"trainer": trainer_image(), "launcher": launcher_image()}
