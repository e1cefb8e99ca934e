"""The local cluster's OCI image registry: distribution v3's registry (the reference
implementation of the OCI distribution spec), built from its Go module (build/registry/,
cached by content beside the control plane's binaries), served over TLS with a certificate of
the cluster's CA and with htpasswd (bcrypt) basic auth, its blobs in a filesystem folder.

Its files live in one folder (`Registry.dir`): config.yml, htpasswd, credentials.json (user and
password, 0600; kept, so a restarted registry takes the same login), auth.json (that login as
a containers-auth.json file, for `chexflow images push --authfile` and `chexflow images
pull-secret`), registry.log and storage/ (blobs and manifests; another folder may be given).
The serving certificate is the CA's, in its pki folder (certs.server_cert). It listens on
`host:port`; in a cluster, an address its nodes' containerd and this machine reach alike.

In the local cluster it is the `registry` add-on (ClusterRegistry, `cluster up --registry`):
served on the apiserver's address (a real node's bridge address when there are real nodes, so
that their containerd, pods and this machine reach it alike), supervised with the other
components, its files in <state_dir>/registry, its storage shared by the clusters of this
machine (shared_storage()). Every real node's containerd reads
<state_dir>/certs.d (realnode.RealNode.containerd_config), where the add-on writes the
registry's hosts.toml: containerd's per-registry settings, here the CA it trusts. Pods pull from
it as on any cluster: by reference (a digest), with the login from an imagePullSecret
(`chexflow images pull-secret`), which the kubelet hands to containerd.

Outside a cluster (the registry tests): configure(), then start() (which waits until
wait_ready()) and stop().
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chexflow.devcluster import certs
from chexflow.devcluster.addon import AddOn, Cluster
from chexflow.devcluster.binaries import GO_DIR, GoBuild
from chexflow.errors import ChexflowError

REGISTRY_DIR = GO_DIR / "registry"
MODULE = "github.com/distribution/distribution/v3"
EXE = "registry"
USER = "chexflow"
REALM = "chexflow-registry"
BUILD = GoBuild("registry", REGISTRY_DIR, MODULE, (EXE,),
                inputs=("go.mod", "go.sum", "main.go", "build.sh"), cold="about 2 min")
cache_dir = BUILD.cache_dir  # registry-<release>-<10 hex of sha256(go.mod, go.sum, main.go, ...)>
ensure_binaries = BUILD.ensure  # the folder with `registry`
# no OpenTelemetry exporter: distribution's default (OTLP to localhost:4318) has no collector
ENV = {"OTEL_TRACES_EXPORTER": "none"}


class RegistryError(ChexflowError):
    """The registry could not be configured, started or reached."""


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def basic(self) -> str:
        """The `auth` value of an auth file and the Basic header: base64(user:password)."""
        return base64.b64encode(f"{self.user}:{self.password}".encode()).decode()


@dataclass
class Registry:
    """A registry serving `host:port` from `dir` (storage in `storage`, default dir/storage)."""

    dir: Path
    host: str
    port: int
    storage: Path | None = None

    def __post_init__(self) -> None:
        self.dir = Path(self.dir)
        self.storage = Path(self.storage) if self.storage else self.dir / "storage"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.dir / "config.yml"

    @property
    def auth_file(self) -> Path:
        return self.dir / "auth.json"

    @property
    def log_file(self) -> Path:
        return self.dir / "registry.log"

    # ---- configuration ------------------------------------------------------------------------
    def credentials(self) -> Credentials:
        """The login, made once (a random password) and kept in credentials.json."""
        path = self.dir / "credentials.json"
        if path.exists():
            try:
                data = json.loads(path.read_text())
                return Credentials(str(data["user"]), str(data["password"]))
            except (ValueError, KeyError, TypeError) as e:
                raise RegistryError(f"{path}: not the registry's login ({e!r}): remove it to "
                                    "make a new one") from None
        made = Credentials(USER, secrets.token_urlsafe(24))
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_private(path, json.dumps({"user": made.user, "password": made.password}))
        return made

    def configure(self, pki: certs.PKI, bin_dir: Path) -> Credentials:
        """Write the certificate (the cluster CA's, for `host`), htpasswd (hashed by the
        registry binary in `bin_dir`), auth.json and config.yml; returns the login."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        sans = f"IP:{self.host}" if _is_ip(self.host) else f"DNS:{self.host}"
        cert, key = certs.server_cert(pki, f"registry-{self.host}", "chexflow-registry", sans)
        login = self.credentials()
        _write_private(self.dir / "htpasswd", f"{login.user}:{hash_password(bin_dir, login)}\n")
        _write_private(self.auth_file, json.dumps(
            {"auths": {self.address: {"auth": login.basic()}}}, indent=2))
        config = {
            "version": 0.1,
            "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.storage)},
                        "delete": {"enabled": True}},
            "http": {"addr": self.address, "secret": secrets.token_hex(16),
                     "tls": {"certificate": str(cert), "key": str(key)},
                     "headers": {"X-Content-Type-Options": ["nosniff"]}},
            "auth": {"htpasswd": {"realm": REALM, "path": str(self.dir / "htpasswd")}},
        }
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        return login

    def command(self, bin_dir: Path) -> list[str]:
        return [str(bin_dir / EXE), "serve", str(self.config_file)]

    # ---- a process of its own ---------------------------------------------------------------
    def start(self, bin_dir: Path, ca: Path, timeout: float = 30) -> subprocess.Popen:
        """Start the registry (configured first) and wait until it answers; the caller stops
        it (stop())."""
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(self.command(bin_dir), stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **ENV}, start_new_session=True)
        try:
            self.wait_ready(ca, time.monotonic() + timeout, lambda: self._exited(proc),
                            self.log_file)
        except BaseException:
            stop(proc)
            raise
        return proc

    def _exited(self, proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            raise RegistryError(f"the registry exited {proc.returncode} at start: "
                                f"{_last_line(self.log_file)} (log {self.log_file})")

    def wait_ready(self, ca: Path, deadline: float, check: Callable[[], None],
                   log: Path) -> None:
        """Until GET /v2/ answers 401 (TLS and auth up); `check` between polls raises if the
        process has exited; RegistryError naming `log` at time.monotonic() `deadline`."""
        while probe(self.address, ca, None, timeout=2) != 401:
            check()
            if time.monotonic() > deadline:
                raise RegistryError(f"the registry on {self.address} did not answer (log {log})")
            time.sleep(0.2)


def shared_storage() -> Path:
    """The blobs and manifests of every local cluster's registry: one store in chexflow's
    cache (CHEXFLOW_CACHE), so a layer pushed for one cluster is there for the next (podman
    sends only the layers a registry lacks) and `cluster down` leaves no image in --dir."""
    from chexflow.container_images import cache_folder

    return cache_folder() / "registry" / "storage"


def hosts_toml(certs_dir: Path, address: str, ca: Path) -> Path:
    """containerd's settings for the registry at `address` (its hosts.toml under `certs_dir`,
    containerd's registry config_path): pull and resolve over TLS, trusting `ca`."""
    folder = certs_dir / address
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hosts.toml"
    path.write_text(f'server = "https://{address}"\n\n[host."https://{address}"]\n'
                    f'  capabilities = ["pull", "resolve"]\n  ca = "{ca}"\n')
    return path


@dataclass
class ClusterRegistry(AddOn):
    """The cluster's registry (module docstring): distribution's `registry serve` under the
    supervisor, on the apiserver's address, and its hosts.toml for the nodes' containerd."""

    name = "registry"
    help = ("also an OCI registry (distribution, built from its Go module on first use) on the "
            "apiserver's address, over TLS with the cluster's CA and a login; real nodes pull "
            "from it (push with chexflow images push)")
    ports = ("registry",)
    storage: Path | None = None  # default: shared_storage()
    bin_dir: Path | None = field(default=None, init=False, repr=False)

    def at(self, cluster: Cluster) -> Registry:
        """The registry of `cluster` (its folder, address, port and storage)."""
        return Registry(cluster.state_dir / "registry", cluster.host, cluster.ports["registry"],
                        self.storage or shared_storage())

    def components(self, cluster: Cluster) -> list[str]:
        return [EXE]

    def describe(self, cluster: Cluster) -> str:
        registry = self.at(cluster)
        return f"registry {registry.address} (login: --authfile {registry.auth_file})"

    def build(self) -> list[Path]:
        self.bin_dir = ensure_binaries()
        return [self.bin_dir]

    def start(self, cluster: Cluster, deadline: float) -> None:
        registry = self.at(cluster)
        registry.configure(cluster.pki, self.bin_dir)
        hosts_toml(cluster.state_dir / "certs.d", registry.address, cluster.pki.ca)
        cluster.spawn(EXE, ["serve", str(registry.config_file)], exe=self.bin_dir / EXE,
                      env=ENV)

    def ready(self, cluster: Cluster, deadline: float) -> None:
        """Until GET /v2/ answers 401 over TLS (certificate and login in place)."""
        self.at(cluster).wait_ready(cluster.pki.ca, deadline, cluster.check,
                                    cluster.log_dir / f"{EXE}.log")


def hash_password(bin_dir: Path, login: Credentials) -> str:
    """The bcrypt hash of `login`'s password for htpasswd, from the registry binary itself
    (`registry hash-password`, build/registry/main.go: the library its auth checks with)."""
    try:
        proc = subprocess.run([str(bin_dir / EXE), "hash-password"], input=login.password,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RegistryError(f"{bin_dir / EXE} hash-password: {e}") from None
    if proc.returncode != 0 or not proc.stdout.startswith("$2"):
        raise RegistryError(f"{bin_dir / EXE} hash-password exited {proc.returncode}: "
                            f"{(proc.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    return proc.stdout.strip()


def probe(address: str, ca: Path | None, login: Credentials | None, timeout: float = 10
          ) -> int | None:
    """The HTTP status of GET https://ADDRESS/v2/ (with basic auth when `login`), trusting `ca`
    (else the system's CAs); None when nothing answers."""
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    request = urllib.request.Request(f"https://{address}/v2/")
    if login is not None:
        request.add_header("Authorization", f"Basic {login.basic()}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner reads (created so, never world-readable in between)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1] if lines else "(no output)"
