"""Build the trainer, launcher and Katib images with podman, from the repository's Dockerfiles.

No registry is needed: the base is Debian bookworm made with `debootstrap --variant=minbase`
and imported into podman (`chexflow.local/bookworm:<key>`); the Dockerfiles take it as their
base-image build argument (a CUDA or python base by default, for real clusters). Each image is
cached as a docker archive in `<cache>/images/<name>-<key>.tar`, where <key> hashes the
Dockerfile, the build arguments and every file the build context sends (images/ and the source
tree, less what .dockerignore leaves out), so an unchanged tree never rebuilds. The trainer's
Horovod wheel comes from `<cache>/wheels` (the one `make setup` built) through a build volume, and
pip trusts the CA bundle `PIP_CERT` names (a TLS-intercepting proxy's), as pip here does.

Katib's images (katib.py documents each) build from images/katib/<name>/ as their whole context,
with the Go program built from Katib's module copied in: their key covers the binary's bytes.

podman runs with a configuration of its own under `<cache>/podman/` (runc, cgroupfs, no rlimit
raised, storage in that folder) and `--network=host` for apt and pip.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from chexflow.container_images import DOCKERFILES
from chexflow.devcluster import katib_images as katib
from chexflow.envs import REPO_ROOT
from chexflow.errors import ChexflowError

LOCAL_REGISTRY = "chexflow.local"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# the build arguments naming a Dockerfile's bases (the trainer's build and runtime stages)
BASE_ARGS = {"trainer": ("CUDA_IMAGE", "RUNTIME_IMAGE"), "launcher": ("PYTHON_IMAGE",)}
# bookworm has Python 3.11; the CUDA image (Ubuntu 24.04) and the local environment use 3.12
EXTRA_ARGS = {"trainer": {"TF_PACKAGE": "tensorflow-cpu==2.20.0", "PYTHON_VERSION": "3.11"},
              "launcher": {}}
BUILD_PIP_CERT = "/run/chexflow-pip-cert.pem"
# images made from another of ours: name -> (parent, build argument naming it); the context is
# images/<name>/ alone
DERIVED = {"earlystopping": ("launcher", "LAUNCHER_IMAGE")}
# the GPU trainer: the trainer's Dockerfile on its own CUDA bases (the Dockerfile's defaults),
# pulled from their registry: built only where the network reaches it
GPU_IMAGES = {"trainer-gpu": "trainer"}
GPU_BASE_ARGS = ("CUDA_IMAGE", "RUNTIME_IMAGE")
# what `chexflow images build` builds unless told: all that builds without network access
DEFAULT_NAMES = (*DOCKERFILES, *DERIVED, *katib.IMAGES)
IMAGE_NAMES = (*DEFAULT_NAMES, *GPU_IMAGES)
PODMAN_CONF = """[containers]
# no CAP_SYS_RESOURCE here: raising an rlimit fails, so none is set
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class ImageBuildError(ChexflowError):
    """podman, debootstrap or a Dockerfile step failed."""


def cache_root() -> Path:
    return Path(os.environ.get("CHEXFLOW_CACHE") or Path.home() / ".cache" / "chexflow")


def _ignore_patterns(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """As .dockerignore matches: from the context root, `**/` at any depth; a match on a
    folder leaves out everything under it."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts):
                return True
        elif any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            return True
    return False


def context_files(root: Path = REPO_ROOT) -> list[str]:
    """The files the build context sends (relative paths, sorted)."""
    patterns = _ignore_patterns(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if not _ignored(rel_dir + d, patterns)]
        out += [rel_dir + f for f in filenames if not _ignored(rel_dir + f, patterns)]
    return sorted(out)


def content_key(name: str, build_args: dict[str, str], root: Path = REPO_ROOT) -> str:
    """12 hex of sha256 over the build arguments and the context files' paths and bytes."""
    h = hashlib.sha256(f"{name}\n{sorted(build_args.items())}\n".encode())
    for rel in context_files(root):
        path = root / rel
        if path.is_symlink() or not path.is_file():
            continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@dataclass
class Podman:
    """podman with chexflow's own configuration and storage under `<cache>/podman`."""

    dir: Path

    def env(self) -> dict[str, str]:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "containers.conf"
        conf.write_text(PODMAN_CONF)
        storage = self.dir / "storage.conf"
        storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{self.dir / "storage"}"\n'
                           f'runroot = "{self.dir / "run"}"\n')
        return {**os.environ, "CONTAINERS_CONF": str(conf),
                "CONTAINERS_STORAGE_CONF": str(storage)}

    def run(self, *args: str, stdin=None, quiet: bool = False, check: bool = True
            ) -> subprocess.CompletedProcess:
        """podman ARGS (output captured when `quiet`; never reading this terminal unless given
        `stdin`); ImageBuildError naming it when it fails, unless not `check`."""
        if shutil.which("podman") is None:
            raise ImageBuildError("podman not found: run images/install-system.sh "
                                  "(Debian packages podman buildah debootstrap)")
        out = subprocess.PIPE if quiet else sys.stderr
        proc = subprocess.run(["podman", *args], env=self.env(),
                              stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=out,
                              stderr=subprocess.PIPE if quiet else sys.stderr, text=True)
        if proc.returncode != 0 and check:
            detail = (proc.stderr or "").strip().splitlines()[-1:] if quiet else []
            raise ImageBuildError(f"`podman {' '.join(args[:2])} ...` exited {proc.returncode}"
                                  + (f": {detail[0]}" if detail else " (see the output above)"))
        return proc

    def exists(self, ref: str) -> bool:
        return subprocess.run(["podman", "image", "exists", ref], env=self.env()).returncode == 0

    def ensure_loaded(self, image: BuiltImage) -> str:
        """The image's ref, loaded from its archive when podman's storage lacks it."""
        if not self.exists(image.ref):
            self.run("load", "-i", str(image.archive), quiet=True)
        return image.ref


def base_ref() -> str:
    """`chexflow.local/bookworm:<key>`, the key naming the suite, variant and mirror."""
    key = hashlib.sha256(f"{DEBIAN_SUITE} minbase {DEBIAN_MIRROR}".encode()).hexdigest()[:8]
    return f"{LOCAL_REGISTRY}/{DEBIAN_SUITE}:{key}"


def base_image(podman: Podman) -> str:
    """The debootstrapped minbase bookworm image (base_ref), made once."""
    ref = base_ref()
    if podman.exists(ref):
        return ref
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap not found: run images/install-system.sh")
    print(f">> debootstrap --variant=minbase {DEBIAN_SUITE} -> {ref} (about a minute)",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=podman.dir, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = subprocess.run(["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(rootfs),
                               DEBIAN_MIRROR], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"debootstrap {DEBIAN_SUITE} failed: "
                                  f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        podman.run("import", "--change", "CMD [\"/bin/bash\"]", "-", ref, stdin=tar.stdout,
                   quiet=True)
        tar.wait()
    return ref


@dataclass(frozen=True)
class BuiltImage:
    name: str
    ref: str
    archive: Path
    seconds: float
    cached: bool


def build_image(name: str, root: Path = REPO_ROOT) -> BuiltImage:
    """Build images/<name>/Dockerfile (or images/katib/<name>/) on the Debian base, or reuse the
    cached archive. One build of a name at a time on the machine: a second caller (the test
    suite's two cluster workers both need the trainer) waits, then finds the archive cached."""
    locks = cache_root() / "images"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_image(name, root)


def _build_image(name: str, root: Path) -> BuiltImage:
    if name in katib.IMAGES:
        return _build_katib(name, root)
    if name in DERIVED:
        return _build_derived(name, root)
    if name not in DOCKERFILES and name not in GPU_IMAGES:
        raise ImageBuildError(f"unknown image {name!r}: expected one of {', '.join(IMAGE_NAMES)}")
    start = time.monotonic()
    found = built_image(name, root)
    if found is not None:
        return found
    args = build_args(name, root)
    key = image_key(name, root)
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    # the Horovod wheel `make setup` built, where install-trainer.sh looks for it
    volumes = ["-v", f"{wheels}:/var/cache/chexflow/wheels"]
    cert = os.environ.get("PIP_CERT")
    if cert and Path(cert).is_file():  # pip behind this machine's TLS-intercepting proxy
        volumes += ["-v", f"{Path(cert).resolve()}:{BUILD_PIP_CERT}:ro"]
        args = {**args, "PIP_CERT": BUILD_PIP_CERT}
    dockerfile = root / DOCKERFILES[GPU_IMAGES.get(name, name)]
    if name in GPU_IMAGES:
        _pull_gpu_bases(name, root)
    return _podman_build(name, key, dockerfile, root, args, volumes, start,
                         on_debian=name not in GPU_IMAGES)


def build_args(name: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """The build arguments of image `name` here: the Debian base for its base images and the
    CPU TensorFlow for the trainer; for a GPU image, the Dockerfile's CUDA bases (gpu_bases)."""
    if name in GPU_IMAGES:
        return gpu_bases(name, root)
    return {**dict.fromkeys(BASE_ARGS[name], base_ref()), **EXTRA_ARGS[name]}


def gpu_bases(name: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """The CUDA bases of GPU image `name`: its Dockerfile's `ARG CUDA_IMAGE=...` defaults, a
    short name qualified as Docker resolves it (docker.io/; podman resolves none)."""
    dockerfile = root / DOCKERFILES[GPU_IMAGES[name]]
    text = dockerfile.read_text()
    bases = {}
    for arg in GPU_BASE_ARGS:
        m = re.search(rf"^ARG {arg}=(\S+)$", text, re.M)
        if m is None:
            raise ImageBuildError(f"{dockerfile}: no `ARG {arg}=IMAGE` line")
        first = m.group(1).split("/", 1)[0]
        qualified = "." in first or ":" in first or first == "localhost"
        bases[arg] = m.group(1) if qualified else f"docker.io/{m.group(1)}"
    return bases


def image_key(name: str, root: Path = REPO_ROOT) -> str:
    """The content key of image `name` (the trainer, launcher, GPU trainer or a derived one),
    computed without building anything."""
    if name in DERIVED:
        parent, arg = DERIVED[name]
        args = {arg: f"{LOCAL_REGISTRY}/{parent}:{image_key(parent, root)}"}
        return content_key(name, args, root / "images" / name)
    if name not in DOCKERFILES and name not in GPU_IMAGES:
        raise ImageBuildError(f"image {name!r}: its key is known only for "
                              f"{', '.join((*DOCKERFILES, *DERIVED, *GPU_IMAGES))}")
    return content_key(name, build_args(name, root), root)


def built_image(name: str, root: Path = REPO_ROOT) -> BuiltImage | None:
    """Image `name` as built for this tree (its cached archive), or None when it never was."""
    start = time.monotonic()
    key = image_key(name, root)
    archive = cache_root() / "images" / f"{name}-{key}.tar"
    if not archive.exists():
        return None
    return BuiltImage(name, f"{LOCAL_REGISTRY}/{name}:{key}", archive,
                      time.monotonic() - start, cached=True)


def _pull_gpu_bases(name: str, root: Path) -> None:
    """The GPU image's CUDA bases in podman's storage, pulled when absent; ImageBuildError in
    one line where they cannot be (a machine without network access, as the test machine)."""
    podman = Podman(cache_root() / "podman")
    for base in gpu_bases(name, root).values():
        if podman.exists(base):
            continue
        try:
            podman.run("pull", "--quiet", base, quiet=True)
        except ImageBuildError as e:
            raise ImageBuildError(
                f"{name} cannot be built on this machine: its CUDA base {base} is not in "
                f"podman's storage and cannot be pulled ({e}); build and push it where the "
                f"network reaches its registry: chexflow images build {name} && chexflow "
                f"images push {name} --registry HOST[:PORT]/PREFIX") from None


def _build_derived(name: str, root: Path) -> BuiltImage:
    """images/<name>/Dockerfile on our own image DERIVED[name] (built or cached first, and in
    podman's storage); the key covers the parent's reference, so its content too."""
    start = time.monotonic()
    found = built_image(name, root)
    if found is not None:
        return found
    parent_name, arg = DERIVED[name]
    parent = build_image(parent_name, root)
    args = {arg: parent.ref}
    context = root / "images" / name
    Podman(cache_root() / "podman").ensure_loaded(parent)
    return _podman_build(name, image_key(name, root), context / "Dockerfile", context, args, [],
                         start)


def _build_katib(name: str, root: Path) -> BuiltImage:
    """images/katib/<name>/ plus its Go program as the context (katib.py)."""
    start = time.monotonic()
    podman = Podman(cache_root() / "podman")
    podman.dir.mkdir(parents=True, exist_ok=True)
    args = {"BASE_IMAGE": base_ref()}
    with tempfile.TemporaryDirectory(dir=podman.dir, prefix=f"context-{name}-") as tmp:
        context = Path(tmp)
        katib.make_context(name, context, root)
        key = content_key(name, args, context)
        archive = cache_root() / "images" / f"{name}-{key}.tar"
        if archive.exists():
            return BuiltImage(name, f"{LOCAL_REGISTRY}/{name}:{key}", archive,
                              time.monotonic() - start, cached=True)
        return _podman_build(name, key, context / "Dockerfile", context, args, [], start)


def _podman_build(name: str, key: str, dockerfile: Path, context: Path, args: dict[str, str],
                  volumes: list[str], start: float, on_debian: bool = True) -> BuiltImage:
    """podman build -> `chexflow.local/<name>:<key>`, saved as `<cache>/images/<name>-<key>.tar`
    (replacing older archives of that name). `on_debian`: its bases are the Debian base
    (made first), else they are in podman's storage already."""
    podman = Podman(cache_root() / "podman")
    if on_debian:
        base_image(podman)
    ref = f"{LOCAL_REGISTRY}/{name}:{key}"
    # docker format: the Dockerfiles' SHELL (bash -o pipefail) is an instruction OCI lacks
    options = ["--pull=never", "--network=host", "--layers", "--format=docker", "-f",
               str(dockerfile), *volumes]
    for k, v in args.items():
        options += ["--build-arg", f"{k}={v}"]
    shown = dockerfile.relative_to(REPO_ROOT) if dockerfile.is_relative_to(REPO_ROOT) else name
    print(f">> podman build {shown} -> {ref}", file=sys.stderr, flush=True)
    podman.run("build", *options, "-t", ref, str(context))
    # Each named stage tagged too (its layers are cached: seconds), so that dropping older
    # builds keeps its layers: the trainer's `build` stage (compilers, TensorFlow, Horovod) is
    # then rebuilt only when its own inputs change, not on every change of the source.
    stages = {stage: f"{LOCAL_REGISTRY}/{name}-{stage}:{key}" for stage in named_stages(dockerfile)}
    for stage, stage_ref in stages.items():
        podman.run("build", *options, "--target", stage, "-t", stage_ref, str(context),
                   quiet=True)
    images = cache_root() / "images"
    images.mkdir(parents=True, exist_ok=True)
    archive = images / f"{name}-{key}.tar"
    partial = archive.with_suffix(f".partial.{os.getpid()}")  # builds may run side by side
    try:
        podman.run("save", "--format", "docker-archive", "-o", str(partial), ref, quiet=True)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    for old in images.glob(f"{name}-*.tar"):
        old.unlink(missing_ok=True)
    partial.rename(archive)
    for stage, stage_ref in stages.items():
        _drop_older_builds(podman, f"{name}-{stage}", stage_ref, prune=False)
    _drop_older_builds(podman, name, ref)
    return BuiltImage(name, ref, archive, time.monotonic() - start, cached=False)


def named_stages(dockerfile: Path) -> list[str]:
    """The names of a multi-stage Dockerfile's stages (`FROM ... AS NAME`)."""
    return re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", dockerfile.read_text(),
                      re.MULTILINE | re.IGNORECASE)


def _drop_older_builds(podman: Podman, name: str, ref: str, prune: bool = True) -> None:
    """Remove the other tags of `chexflow.local/<name>` from podman's storage, and (`prune`)
    the layers no tagged image uses (a trainer build is ~2 GB; the archive of the newest is
    the cache)."""
    try:
        listed = podman.run("images", "--format", "{{.Repository}}:{{.Tag}}",
                            f"{LOCAL_REGISTRY}/{name}", quiet=True).stdout.split()
        older = [r for r in listed if r != ref]
        if older:
            podman.run("rmi", *older, quiet=True)
        if prune:
            podman.run("image", "prune", "--force", quiet=True)
    except ImageBuildError as e:  # in use by a build beside this one: kept, and said so
        print(f"chexflow images: older {name} images kept: {e}", file=sys.stderr, flush=True)


def base_archive() -> BuiltImage:
    """The Debian base image itself as a docker archive (a small image for plain pods)."""
    start = time.monotonic()
    ref = base_ref()
    images = cache_root() / "images"
    archive = images / f"{DEBIAN_SUITE}-{ref.rsplit(':', 1)[1]}.tar"
    if archive.exists():
        return BuiltImage(DEBIAN_SUITE, ref, archive, time.monotonic() - start, cached=True)
    podman = Podman(cache_root() / "podman")
    base_image(podman)
    images.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    podman.run("save", "--format", "docker-archive", "-o", str(partial), ref, quiet=True)
    partial.rename(archive)
    return BuiltImage(DEBIAN_SUITE, ref, archive, time.monotonic() - start, cached=False)
