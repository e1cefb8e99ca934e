"""Katib v0.19.0's images for the local cluster, built by `build.build_image(name)`.

Each is images/katib/<name>/Dockerfile on the debootstrapped Debian bookworm base
(`build.base_ref()`). The four Go programs are built static from github.com/kubeflow/katib
v0.19.0 (chexflow/devcluster/build/katib/build.sh, cached by `ensure_katib_binaries` in
`$CHEXFLOW_K8S_CACHE/katib-<release>-<hash>`, beside the cluster's binaries) and copied into
the build context beside their Dockerfile, so an image's content key covers the binary's bytes.
References are `chexflow.local/<name>:<key>` (no registry: load the archive, `imagePullPolicy:
Never`). Paths follow Katib's own images, so Katib's manifests run them (with or without their
`command`).

katib-controller
    /app/katib-controller (WORKDIR /app); uid 1000. Ports 8443 (webhooks), 8080 (metrics),
    18080 (/healthz, /readyz). Katib's manifest runs it with --katib-config=/katib-config.yaml and
    KATIB_CORE_NAMESPACE from the pod's namespace.
katib-db-manager
    /app/katib-db-manager; uid 1000. gRPC on 6789: DBManager and grpc.health.v1 (whose Check runs
    `SELECT 1`), logs "Start Katib manager: 0.0.0.0:6789" once serving. Env: DB_NAME=mysql
    (required), DB_PASSWORD, DB_USER (root), KATIB_MYSQL_DB_HOST (katib-mysql),
    KATIB_MYSQL_DB_PORT (3306), KATIB_MYSQL_DB_DATABASE (katib). Flags: --listen-address
    (0.0.0.0:6789), --connect-timeout (60s; it exits when the database is not up by then).
katib-file-metricscollector
    /app/file-metricscollector; root, as Katib's image (it reads the trial's metrics file and
    waits for the trial's processes). The pod webhook adds it to trial pods for the File and
    StdOut collectors with its own arguments; it listens on nothing.
katib-suggestion-goptuna
    /opt/katib/goptuna-suggestion; uid 1000. gRPC on 6789 (fixed): Suggestion for random, tpe,
    cmaes and sobol, and grpc.health.v1.
katib-mysql
    MariaDB 10.11 from Debian's mariadb-server (katib-db-manager's mysql driver speaks its
    protocol): /usr/local/bin/katib-mysql-entrypoint; uid/gid 999 (Katib's runAsUser; started as
    root it hands the datadir to mysql). Port 3306. Env as Katib's manifest gives mysql:8:
    MYSQL_ROOT_PASSWORD (or MYSQL_ALLOW_EMPTY_PASSWORD=true), MYSQL_DATABASE (katib). Arguments
    go to mariadbd; `--datadir DIR` (Katib's: /var/lib/mysql/datadir) is initialised on first
    start. Katib's probes (`mysqladmin ping -u root -p...`, `mysql -D katib ... -e 'SELECT 1'`)
    work in it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from chexflow.envs import REPO_ROOT
from chexflow.errors import ChexflowError

KATIB_VERSION = "v0.19.0"
GO_DIR = Path(__file__).resolve().parent / "build" / "katib"
BINARIES = ("katib-controller", "katib-db-manager", "file-metricscollector",
            "goptuna-suggestion")
# image name -> the Go program copied into its context (None: nothing built from Go)
IMAGES: dict[str, str | None] = {
    "katib-controller": "katib-controller",
    "katib-db-manager": "katib-db-manager",
    "katib-file-metricscollector": "file-metricscollector",
    "katib-suggestion-goptuna": "goptuna-suggestion",
    "katib-mysql": None,
}
# `chexflow images build katib` builds all of IMAGES
GROUP = "katib"


def image_dir(name: str, root: Path = REPO_ROOT) -> Path:
    return root / "images" / "katib" / name


def make_context(name: str, dest: Path, root: Path = REPO_ROOT) -> None:
    """Fill the empty folder `dest` with images/katib/<name>/ and the image's Go program."""
    shutil.copytree(image_dir(name, root), dest, dirs_exist_ok=True)
    binary = IMAGES[name]
    if binary is None:
        return
    src = ensure_katib_binaries() / binary
    try:
        os.link(src, dest / binary)
    except OSError:  # another filesystem
        shutil.copy2(src, dest / binary)


class KatibBinariesMissing(ChexflowError):
    """Katib's programs are not built and could not be built."""


def katib_cache_dir() -> Path:
    """Where Katib's binaries live: $CHEXFLOW_K8S_CACHE (~/.cache/chexflow/k8s) /
    katib-<release>-<10 hex of go.mod + go.sum + build.sh>, as build.sh names it."""
    go_mod = (GO_DIR / "go.mod").read_text()
    m = re.search(r"^require github\.com/kubeflow/katib (v\S+)", go_mod, re.M)
    if not m:
        raise KatibBinariesMissing(f"{GO_DIR / 'go.mod'}: no `require github.com/kubeflow/katib "
                                   "vX.Y.Z` line")
    digest = hashlib.sha256(b"".join((GO_DIR / f).read_bytes()
                                     for f in ("go.mod", "go.sum", "build.sh")))
    root = os.environ.get("CHEXFLOW_K8S_CACHE") or Path.home() / ".cache" / "chexflow" / "k8s"
    return Path(root) / f"katib-{m.group(1)}-{digest.hexdigest()[:10]}"


def missing(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def ensure_katib_binaries() -> Path:
    """The folder with Katib's programs; runs build/katib/build.sh when any is missing."""
    bin_dir = katib_cache_dir()
    if not missing(bin_dir):
        return bin_dir
    script = GO_DIR / "build.sh"
    print(f"building Katib's programs into {bin_dir} (cold: about 2 min)...", file=sys.stderr,
          flush=True)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(script), str(bin_dir)], stdout=sys.stderr)
    absent = missing(bin_dir)
    if proc.returncode != 0 or absent:
        raise KatibBinariesMissing(f"{script} exited {proc.returncode}; "
                                   f"missing {', '.join(absent)}")
    print(f"built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return bin_dir
