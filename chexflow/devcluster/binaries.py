"""The control plane's binaries: built from build/go.mod by build/build.sh, cached by version.

The cache folder is `$CHEXFLOW_K8S_CACHE/<key>` (default `~/.cache/chexflow/k8s/<key>`), where
<key> is the Kubernetes release in build/go.mod plus a hash of go.mod, go.sum and build.sh, so
a change of any pinned module or build step builds a fresh set.
`CHEXFLOW_K8S_BIN` points at a ready folder instead.

The real node's binaries (kubelet, kube-proxy, CoreDNS, pause; build/build-node.sh) live beside
them in `node-<key>`, keyed the same way by the files build-node.sh builds from (Katib's programs,
for its images, too: chexflow.devcluster.katib_images).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from chexflow.errors import ChexflowError

GO_DIR = Path(__file__).resolve().parent / "build"
BUILD_SCRIPT = GO_DIR / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
            "mpi-operator", "kubectl")
NODE_BUILD_SCRIPT = GO_DIR / "build-node.sh"
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns", "pause")
NODE_INPUTS = ("go.mod", "go.sum", "node/go.mod", "node/go.sum", "node/coredns/main.go",
               "build-node.sh")


class BinariesMissing(ChexflowError):
    """The control plane's binaries are not built and could not be built."""


def k8s_version() -> str:
    """The k8s.io/kubernetes release build/go.mod requires (e.g. v1.36.3)."""
    m = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (GO_DIR / "go.mod").read_text(), re.M)
    if not m:
        raise BinariesMissing(f"{GO_DIR / 'go.mod'}: no `k8s.io/kubernetes vX.Y.Z` requirement")
    return m.group(1)


def cache_key() -> str:
    """<k8s release>-<10 hex of sha256(go.mod + go.sum + build.sh)>, as build.sh computes it."""
    files = ("go.mod", "go.sum", "build.sh")
    digest = hashlib.sha256(b"".join((GO_DIR / f).read_bytes() for f in files))
    return f"{k8s_version()}-{digest.hexdigest()[:10]}"


def cache_dir() -> Path:
    """Where this version's binaries live (whether built or not)."""
    override = os.environ.get("CHEXFLOW_K8S_BIN")
    if override:
        return Path(override)
    root = os.environ.get("CHEXFLOW_K8S_CACHE") or Path.home() / ".cache" / "chexflow" / "k8s"
    return Path(root) / cache_key()


def node_cache_dir() -> Path:
    """Where the real node's binaries live: node-<release>-<hash of NODE_INPUTS>."""
    digest = hashlib.sha256(b"".join((GO_DIR / f).read_bytes() for f in NODE_INPUTS))
    return cache_dir().parent / f"node-{k8s_version()}-{digest.hexdigest()[:10]}"


def missing(bin_dir: Path, names: tuple[str, ...] = BINARIES) -> list[str]:
    return [b for b in names if not os.access(bin_dir / b, os.X_OK)]


def ensure_node_binaries() -> Path:
    """The folder with kubelet, coredns and pause; runs build/build-node.sh when any is missing."""
    bin_dir = node_cache_dir()
    if not missing(bin_dir, NODE_BINARIES):
        return bin_dir
    print(f"building the real node (kubelet, CoreDNS, pause) into {bin_dir} (cold: about 4 min)...",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(NODE_BUILD_SCRIPT), str(bin_dir)], stdout=sys.stderr)
    absent = missing(bin_dir, NODE_BINARIES)
    if proc.returncode != 0 or absent:
        raise BinariesMissing(f"{NODE_BUILD_SCRIPT} exited {proc.returncode}; "
                              f"missing {', '.join(absent)}")
    print(f"built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return bin_dir


def ensure_binaries(build: bool = True) -> Path:
    """The folder with all binaries; runs build/build.sh (minutes, cold) when any is missing."""
    bin_dir = cache_dir()
    absent = missing(bin_dir)
    if not absent:
        return bin_dir
    if not build or os.environ.get("CHEXFLOW_K8S_BIN"):
        raise BinariesMissing(
            f"{bin_dir}: missing {', '.join(absent)}; build them with `{BUILD_SCRIPT}` "
            "(Go 1.26 at /usr/local/go, module proxy access; about 6 min cold on 2 idle cores)"
        )
    print(f"building the Kubernetes control plane into {bin_dir} (cold: about 6 min)...",
          file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), str(bin_dir)], stdout=sys.stderr)
    if proc.returncode != 0 or missing(bin_dir):
        raise BinariesMissing(
            f"{BUILD_SCRIPT} exited {proc.returncode}; missing {', '.join(missing(bin_dir))}"
        )
    print(f"built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return bin_dir


def required_version(go_mod: Path, module: str) -> str:
    """The version `go_mod` requires of `module` (its `require MODULE vX.Y.Z` line)."""
    m = re.search(rf"^require {re.escape(module)} (v\S+)", go_mod.read_text(), re.M)
    if not m:
        raise BinariesMissing(f"{go_mod}: no `require {module} vX.Y.Z` line")
    return m.group(1)


@dataclass(frozen=True)
class GoBuild:
    """A cluster part built from a go.mod folder of its own by its build.sh, cached by content:
    `<cache>/<name>-<version of module>-<10 hex of sha256(inputs)>/` holding `outputs`."""

    name: str
    folder: Path
    module: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...] = ("go.mod", "go.sum", "build.sh")
    go_mod: str = "go.mod"
    cold: str = "minutes"  # what a cold build took, for the message

    def version(self) -> str:
        return required_version(self.folder / self.go_mod, self.module)

    def cache_dir(self) -> Path:
        digest = hashlib.sha256(b"".join((self.folder / f).read_bytes() for f in self.inputs))
        root = os.environ.get("CHEXFLOW_K8S_CACHE") or Path.home() / ".cache" / "chexflow" / "k8s"
        return Path(root) / f"{self.name}-{self.version()}-{digest.hexdigest()[:10]}"

    def ensure(self) -> Path:
        """The cache folder with every output; runs build.sh into it when one is missing."""
        bin_dir = self.cache_dir()
        if all((bin_dir / f).is_file() for f in self.outputs):
            return bin_dir
        script = self.folder / "build.sh"
        print(f"building {self.module} {self.version()} into {bin_dir} (cold: {self.cold})...",
              file=sys.stderr, flush=True)
        start = time.monotonic()
        proc = subprocess.run(["bash", str(script), str(bin_dir)], stdout=sys.stderr)
        missing = [f for f in self.outputs if not (bin_dir / f).is_file()]
        if proc.returncode != 0 or missing:
            raise BinariesMissing(f"{script} exited {proc.returncode}; "
                                  f"missing in {bin_dir}: {', '.join(missing) or 'nothing'}")
        print(f"built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        return bin_dir
