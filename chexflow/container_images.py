"""Container image references: the one place pipelines, MPIJobs, TrainJobs, the TrainJob runtime
and Katib trials take them from.

Which references, most specific first:

- CHEXFLOW_TRAINER_IMAGE, CHEXFLOW_LAUNCHER_IMAGE, CHEXFLOW_EARLYSTOPPING_IMAGE: a whole
  reference (`reg.io/team/trainer:v3`);
- CHEXFLOW_IMAGE_REGISTRY and/or CHEXFLOW_IMAGE_TAG: `<registry>/<name>:<tag>`;
- the references file `chexflow images push` writes (`images_file()`: CHEXFLOW_IMAGES_FILE, else
  pushed-images.json in chexflow's cache folder): digest-pinned references of the images pushed
  last (`HOST:PORT/PREFIX/trainer:TAG@sha256:...`);
- the placeholders `ghcr.io/chexflow/<name>:<version>`: nothing is published there; the
  committed artefacts (pipelines/, components/, trainjob/, katib/) carry them and say so in
  their first lines (`header_lines()`).

A reference must carry a tag or a digest (without either a registry serves whatever `latest`
is at pull time). Pipelines take the references as compile parameters (`trainer_image()` as
the default value), so a compiled pipeline names its images explicitly.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chexflow import __version__
from chexflow.errors import ChexflowError

TRAINER_IMAGE_ENV = "CHEXFLOW_TRAINER_IMAGE"
LAUNCHER_IMAGE_ENV = "CHEXFLOW_LAUNCHER_IMAGE"
EARLYSTOPPING_IMAGE_ENV = "CHEXFLOW_EARLYSTOPPING_IMAGE"
REGISTRY_ENV = "CHEXFLOW_IMAGE_REGISTRY"
TAG_ENV = "CHEXFLOW_IMAGE_TAG"
IMAGES_FILE_ENV = "CHEXFLOW_IMAGES_FILE"
IMAGES_FILE_NAME = "pushed-images.json"
DEFAULT_REGISTRY = "ghcr.io/chexflow"
DEFAULT_TAG = __version__
# the images a cluster runs, by role; each has its whole-reference variable
ROLES = {"trainer": TRAINER_IMAGE_ENV, "launcher": LAUNCHER_IMAGE_ENV,
         "earlystopping": EARLYSTOPPING_IMAGE_ENV}

# The Dockerfiles, relative to the repository root (the build context).
DOCKERFILES = {"trainer": "images/trainer/Dockerfile", "launcher": "images/launcher/Dockerfile"}

# [host[:port]/]path[:tag][@digest], as the Docker reference grammar allows (lower-case path).
_REFERENCE = re.compile(
    r"^(?:(?P<host>[a-zA-Z0-9.-]+(?::[0-9]+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


class InvalidImage(ChexflowError):
    """An image reference that a container runtime would reject, or that names no version."""


def check_reference(ref: str, source: str) -> str:
    """Return `ref` if it is a valid image reference with a tag or a digest, else raise naming
    where it came from."""
    m = _REFERENCE.match(ref)
    if not m:
        raise InvalidImage(
            f"{source}={ref!r} is not an image reference: expected [registry/]name:tag or "
            "name@sha256:digest such as reg.example.org/chexflow/trainer:0.1.0 (lower-case name)"
        )
    if not m.group("tag") and not m.group("digest"):
        raise InvalidImage(
            f"{source}={ref!r} has neither a tag nor a digest: give NAME:TAG or "
            "NAME@sha256:DIGEST (without either a registry serves whatever `latest` is then)")
    return ref


def cache_folder() -> Path:
    """chexflow's cache folder: CHEXFLOW_CACHE, else ~/.cache/chexflow."""
    return Path(os.environ.get("CHEXFLOW_CACHE") or Path.home() / ".cache" / "chexflow")


def images_file() -> Path:
    """The references file `chexflow images push` writes and every command reads."""
    return Path(os.environ.get(IMAGES_FILE_ENV) or cache_folder() / IMAGES_FILE_NAME)


@dataclass(frozen=True)
class Pushed:
    """What the references file holds: the registry (HOST[:PORT]/PREFIX) and each image's
    digest-pinned reference."""

    registry: str
    images: dict[str, str]


def pushed() -> Pushed | None:
    """The references file's content (checked), or None when there is none."""
    path = images_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidImage(f"{path}: not a references file of `chexflow images push` ({e}); "
                           f"push again or remove it") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
        raise InvalidImage(f"{path}: expected {{\"registry\": ..., \"images\": {{NAME: REF}}}} "
                           "as `chexflow images push` writes it; push again or remove it")
    for name, ref in data["images"].items():
        check_reference(str(ref), f"{path}: images.{name}")
    return Pushed(str(data.get("registry", "")), {k: str(v) for k, v in data["images"].items()})


def image_source() -> str:
    """Where the references come from now, for a command's report: an environment variable,
    the references file, or the placeholders."""
    given = [v for v in (*ROLES.values(), REGISTRY_ENV, TAG_ENV) if os.environ.get(v)]
    if given:
        return ", ".join(given)
    if pushed() is not None:
        return str(images_file())
    return f"placeholders ({DEFAULT_REGISTRY}, not published)"


def placeholder(name: str) -> str:
    """The committed artefacts' reference of image `name`."""
    return f"{DEFAULT_REGISTRY}/{name}:{DEFAULT_TAG}"


def image(name: str) -> str:
    """The chosen reference of image `name` (a key of ROLES), as the module docstring orders."""
    whole = os.environ.get(ROLES[name])
    if whole:
        return check_reference(whole, ROLES[name])
    if os.environ.get(REGISTRY_ENV) or os.environ.get(TAG_ENV):
        registry = os.environ.get(REGISTRY_ENV, DEFAULT_REGISTRY).rstrip("/")
        tag = os.environ.get(TAG_ENV, DEFAULT_TAG)
        return check_reference(f"{registry}/{name}:{tag}", f"{REGISTRY_ENV}/{TAG_ENV}")
    found = pushed()
    if found is not None and name in found.images:
        return found.images[name]
    return placeholder(name)


def trainer_image() -> str:
    """The training image (MPIJob launcher + workers, TrainJob nodes, Katib trials, Apptainer)."""
    return image("trainer")


def launcher_image() -> str:
    """The control image KFP components run in (kfp preinstalled: install_kfp_package=False)."""
    return image("launcher")


def images() -> dict[str, str]:
    """The trainer's and the launcher's references, by role."""
    return {"trainer": trainer_image(), "launcher": launcher_image()}


def with_chosen_images(node: Any) -> Any:
    """`node` (a spec, a template, YAML text) with each placeholder reference replaced by the
    chosen one (`trainer_image()`, ...): what a committed artefact becomes for this cluster."""
    chosen = {placeholder(name): image(name) for name in ROLES}
    chosen = {old: new for old, new in chosen.items() if old != new}
    if not chosen:
        return node
    pattern = re.compile("|".join(re.escape(old) for old in chosen) + r"(?![\w.:@/-])")

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            return pattern.sub(lambda m: chosen[m.group(0)], value)
        return value

    return walk(node)


HEADER_PREFIX = "# IMAGES:"


def header_lines(render_command: str, roles: tuple[str, ...] = ("trainer", "launcher"),
                 given: dict[str, str | None] | None = None) -> str:
    """The first lines of a rendered artefact (each starting HEADER_PREFIX): the images of
    `roles` it names (`given`, else the chosen ones) and, for placeholders, that they are and
    how to render it for a registry (`render_command` writes the file)."""
    refs = {name: (given or {}).get(name) or image(name) for name in roles}
    holders = [name for name, ref in refs.items() if ref == placeholder(name)]
    if holders == list(refs):
        lines = [f"{' and '.join(refs.values())} in this file "
                 f"{'are' if len(refs) > 1 else 'is a'} PLACEHOLDER{'S' * (len(refs) > 1)},",
                 "published nowhere: pods would end in ErrImagePull. Render it for your registry:",
                 f"chexflow images push --registry HOST[:PORT]/PREFIX, then {render_command}"]
    else:
        lines = [f"{name} {ref}" + (" (a placeholder: push it too, then render again)"
                                    if name in holders else "") for name, ref in refs.items()]
        source = "given" if any((given or {}).values()) else f"chosen by {image_source()}"
        lines.append(f"{source}; rendered by {render_command}")
    return "".join(f"{HEADER_PREFIX} {line}\n" for line in lines)


def without_header(text: str) -> str:
    """`text` without the leading header_lines() block."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if not line.startswith(HEADER_PREFIX)),
                 len(lines))
    return "".join(lines[start:])
