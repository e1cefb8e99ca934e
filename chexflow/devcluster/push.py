"""`chexflow images push`: the built images to a registry, pinned by digest, and the references
file every command then takes its images from (chexflow.container_images).

    chexflow images push [NAME...] --registry HOST[:PORT]/PREFIX [--tag TAG] [--authfile FILE]
                         [--ca-file CA.crt]

Pushes each image as built for this tree (`chexflow images build`; never builds) with podman
and chexflow's podman configuration, to `HOST[:PORT]/PREFIX/NAME:TAG` (TAG: the image's content
key unless given), and reads back the manifest digest podman wrote (`--digestfile`). The
credentials come from where podman looks for them: `--authfile`, else REGISTRY_AUTH_FILE, else
`${XDG_RUNTIME_DIR}/containers/auth.json`, ~/.config/containers/auth.json and
~/.docker/config.json; `--ca-file` trusts a registry's private CA (podman's `--cert-dir`).

Before anything is sent (one line each otherwise): every image is built, the registry answers
`GET /v2/` over TLS, and, when it asks for a login, one is stored for it and (basic auth) taken.
Each image is whole in the registry once its manifest is written, which comes last; an image
whose push fails has no tag there. The references file is written once every image is pushed
(a temporary file renamed over it), so a failed push leaves it as it was.
`chexflow images pull-secret` turns the same stored login into a Secret for pods' pulls.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from chexflow.container_images import InvalidImage, check_reference, images_file
from chexflow.devcluster.images import DERIVED, DOCKERFILES, GPU_IMAGES, Podman, built_image
from chexflow.devcluster.images import cache_root as images_cache
from chexflow.errors import ChexflowError

PUSHABLE = (*DOCKERFILES, *DERIVED, *GPU_IMAGES)
DEFAULT_PUSH = (*DOCKERFILES, *DERIVED)  # and trainer-gpu where it was built
CONNECT_TIMEOUT = 10.0
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*|\[[0-9a-fA-F:]+\])"
_REGISTRY = re.compile(rf"^(?P<host>{_HOST})(?::(?P<port>[0-9]{{1,5}}))?"
                       r"/(?P<prefix>[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)$")


class PushError(ChexflowError):
    """An image could not be pushed: the registry, the credentials or the image."""


@dataclass(frozen=True)
class Destination:
    """Where images go: HOST[:PORT]/PREFIX."""

    host: str
    port: int | None
    prefix: str

    @classmethod
    def parse(cls, text: str) -> Destination:
        m = _REGISTRY.match(text.strip())
        if m is None:
            raise PushError(f"--registry {text!r}: expected HOST[:PORT]/PREFIX such as "
                            "reg.example.org:5000/chexflow (lower-case prefix, no tag)")
        return cls(m.group("host"), int(m.group("port")) if m.group("port") else None,
                   m.group("prefix"))

    @property
    def address(self) -> str:
        """HOST[:PORT], as registries and auth files name it."""
        return f"{self.host}:{self.port}" if self.port else self.host

    def __str__(self) -> str:
        return f"{self.address}/{self.prefix}"

    def repository(self, name: str) -> str:
        return f"{self}/{name}"


@dataclass(frozen=True)
class PushedImage:
    """One image pushed: its digest-pinned reference and how long the push took."""

    name: str
    reference: str  # HOST[:PORT]/PREFIX/NAME:TAG@sha256:...
    seconds: float


def auth_files(authfile: Path | None) -> list[Path]:
    """Where podman looks for credentials, in its order (`--authfile` alone when given)."""
    if authfile is not None:
        return [authfile]
    if os.environ.get("REGISTRY_AUTH_FILE"):
        return [Path(os.environ["REGISTRY_AUTH_FILE"])]
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    home = Path.home()
    return [Path(runtime) / "containers" / "auth.json",
            home / ".config" / "containers" / "auth.json", home / ".docker" / "config.json"]


def stored_login(address: str, authfile: Path | None) -> tuple[str, str, Path] | None:
    """(user, password, file) of the first auth file holding `address`'s `auth` entry; a file
    that exists but is not an auth file is an error naming it (podman would fail on it too)."""
    for path in auth_files(authfile):
        if not path.is_file():
            if authfile is not None:
                raise PushError(f"--authfile {path}: no such file")
            continue
        try:
            auths = json.loads(path.read_text()).get("auths") or {}
            entry = auths.get(address) or auths.get(f"https://{address}") or {}
            if not entry.get("auth"):
                continue
            user, colon, password = base64.b64decode(entry["auth"], validate=True).decode(
                ).partition(":")
        except (OSError, ValueError, AttributeError) as e:
            raise PushError(f"{path}: not a containers-auth.json file ({e}): expected "
                            '{"auths": {"HOST:PORT": {"auth": base64("USER:PASSWORD")}}}') from None
        if not colon:
            raise PushError(f"{path}: auths.{address}.auth is not base64 of USER:PASSWORD")
        return user, password, path
    return None


def _cert_dir(ca_file: Path | None, into: Path) -> Path | None:
    """A folder holding `ca_file` as ca.crt, for podman's --cert-dir."""
    if ca_file is None:
        return None
    into.mkdir(parents=True, exist_ok=True)
    (into / "ca.crt").write_bytes(ca_file.read_bytes())
    return into


def _podman_options(authfile: Path | None, cert_dir: Path | None) -> list[str]:
    return [*(["--authfile", str(authfile)] if authfile else []),
            *(["--cert-dir", str(cert_dir)] if cert_dir else [])]


def _v2_status(dest: Destination, ca_file: Path | None, basic: str | None
               ) -> tuple[int, str]:
    """(HTTP status, WWW-Authenticate) of GET https://HOST[:PORT]/v2/, the registry API's
    version check; PushError in one line when nothing answers there or TLS fails."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    request = urllib.request.Request(f"https://{dest.address}/v2/")
    if basic:
        request.add_header("Authorization", f"Basic {basic}")
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT, context=context) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("WWW-Authenticate", "")
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise PushError(f"registry {dest.address}: its certificate is not trusted "
                            f"({reason.verify_message}): give the CA that signed it with "
                            "--ca-file; nothing was pushed") from None
        if isinstance(reason, ssl.SSLError) and reason.reason == "WRONG_VERSION_NUMBER":
            raise PushError(f"registry {dest.address} answers without TLS (plain HTTP): chexflow "
                            "pushes over TLS only, as clusters pull; serve it with a "
                            "certificate (and --ca-file for a private CA)") from None
        raise PushError(f"registry {dest.address} does not answer on https://{dest.address}/v2/ "
                        f"({getattr(reason, 'strerror', None) or reason}); nothing was pushed"
                        ) from None


def check_registry(dest: Destination, authfile: Path | None, ca_file: Path | None) -> None:
    """PushError in one line unless the registry answers over TLS and, when it asks for a
    login, takes the stored one (checked here for basic auth; a token service is left to
    podman's push)."""
    status, challenge = _v2_status(dest, ca_file, None)
    if status == 200:
        return
    if status != 401:
        raise PushError(f"registry {dest.address}: GET /v2/ answered HTTP {status}, not an "
                        "OCI registry's 200 or 401; nothing was pushed")
    login = stored_login(dest.address, authfile)
    if login is None:
        files = ", ".join(str(p) for p in auth_files(authfile))
        raise PushError(f"registry {dest.address} asks for a login and none is stored for it in "
                        f"{files}: `podman login {dest.address}` (or give --authfile); nothing "
                        "was pushed")
    if not challenge.lower().startswith("basic"):
        return
    user, password, path = login
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    if _v2_status(dest, ca_file, basic)[0] == 401:
        raise PushError(f"registry {dest.address} refused the login of {path} (user {user!r}): "
                        "wrong user or password; nothing was pushed")


def _error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error")]
    return (errors or lines or ["(no output)"])[-1].removeprefix("Error: ")


def push_one(name: str, dest: Destination, tag: str | None, authfile: Path | None,
             cert_dir: Path | None, work: Path) -> PushedImage:
    """Push image `name` as built for this tree; its digest-pinned reference."""
    image = built_image(name)
    if image is None:  # checked before for all, but a build may have replaced it since
        raise PushError(f"{name}: not built for this tree: chexflow images build {name}")
    podman = Podman(images_cache() / "podman")
    start = time.monotonic()
    podman.ensure_loaded(image)
    target = f"{dest.repository(name)}:{tag or image.ref.rsplit(':', 1)[1]}"
    check_reference(target, "--registry/--tag")
    digest_file = work / f"{name}.digest"
    proc = podman.run("push", "--quiet", *_podman_options(authfile, cert_dir), "--digestfile",
                      str(digest_file), image.ref, f"docker://{target}", quiet=True,
                      check=False)
    if proc.returncode != 0 or not digest_file.is_file():
        raise PushError(f"pushing {name} to {target}: {_error_line(proc.stderr)}"
                        + ("; the registry failed to store it (a full disk answers so)"
                           if " 500 " in proc.stderr else "")
                        + f"; {name} is not tagged there, {images_file()} unchanged")
    digest = digest_file.read_text().strip()
    return PushedImage(name, check_reference(f"{target}@{digest}", "podman's digest"),
                  time.monotonic() - start)


def write_references(dest: Destination, done: list[PushedImage]) -> Path:
    """The references file, replaced whole (earlier entries of other names kept when they
    name the same registry)."""
    path = images_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}
    try:
        earlier = json.loads(path.read_text())
        if earlier.get("registry") == str(dest):
            images.update(earlier.get("images", {}))
    except (OSError, ValueError, AttributeError):
        pass
    images.update({p.name: p.reference for p in done})
    data = {"registry": str(dest), "pushed": datetime.now(UTC).isoformat(timespec="seconds"),
            "images": images}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def names_to_push(requested: list[str]) -> list[str]:
    """The images to push: those asked (checked), or the trainer, launcher and early-stopping
    images and the GPU trainer where it was built."""
    unknown = [n for n in requested if n not in PUSHABLE]
    if unknown:
        raise PushError(f"unknown image(s) {', '.join(unknown)}: push takes "
                        f"{', '.join(PUSHABLE)}")
    if requested:
        return list(dict.fromkeys(requested))
    return [*DEFAULT_PUSH, *(n for n in GPU_IMAGES if built_image(n) is not None)]


def push(requested: list[str], registry: str, tag: str | None = None,
         authfile: Path | None = None, ca_file: Path | None = None) -> list[PushedImage]:
    """Check everything, push each image, then write the references file."""
    dest = Destination.parse(registry)
    if tag is not None:
        try:
            check_reference(f"{dest.repository('trainer')}:{tag}", "--tag")
        except InvalidImage as e:
            raise PushError(str(e)) from None
    names = names_to_push(requested)
    never = [n for n in names if built_image(n) is None]
    if never:
        raise PushError(f"not built for this tree: {', '.join(never)}: `chexflow images build "
                        f"{' '.join(never)}` first; nothing was pushed")
    if ca_file is not None and not ca_file.is_file():
        raise PushError(f"--ca-file {ca_file}: no such file; nothing was pushed")
    check_registry(dest, authfile, ca_file)
    with tempfile.TemporaryDirectory(prefix="chexflow-push-") as tmp:
        cert_dir = _cert_dir(ca_file, Path(tmp) / "certs")
        done = []
        for name in names:
            print(f"pushing {name} to {dest.repository(name)} ...", file=sys.stderr, flush=True)
            done.append(push_one(name, dest, tag, authfile, cert_dir, Path(tmp)))
    write_references(dest, done)
    return done


def pull_secret(name: str, namespace: str | None, registry: str | None,
                authfile: Path | None) -> dict:
    """The kubernetes.io/dockerconfigjson Secret `name` holding the stored login for
    `registry` (HOST[:PORT]; default: the references file's registry)."""
    from chexflow.container_images import pushed
    from chexflow.jobs.render import MANAGED_BY

    if registry is None:
        found = pushed()
        if found is None or not found.registry:
            raise PushError(f"no references file ({images_file()}): give --registry HOST[:PORT], "
                            "or push first (chexflow images push)")
        address = Destination.parse(found.registry).address
    else:
        address = registry.strip().rstrip("/")
        if not re.fullmatch(rf"{_HOST}(?::[0-9]{{1,5}})?", address):
            raise PushError(f"--registry {registry!r}: expected HOST[:PORT]")
    login = stored_login(address, authfile)
    if login is None:
        files = ", ".join(str(p) for p in auth_files(authfile))
        raise PushError(f"no credentials for {address} in {files}: `podman login {address}` "
                        "(or give --authfile)")
    user, password, _ = login
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {address: {"username": user, "password": password, "auth": auth}}}
    metadata: dict = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata,
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}}


def apply_secret(secret: dict) -> str:
    """Create `secret` in the cluster of KUBECONFIG, or replace the one of that name;
    'NAMESPACE/NAME'."""
    from kubernetes import client

    from chexflow.katib.cluster.kubernetes import current_namespace
    from chexflow.kube import api_message, load_api_client

    namespace = secret["metadata"].setdefault("namespace", current_namespace())
    name = secret["metadata"]["name"]
    core = client.CoreV1Api(load_api_client())
    try:
        core.create_namespaced_secret(namespace, secret)
    except client.ApiException as e:
        if e.status != 409:
            raise PushError(f"creating Secret {namespace}/{name}: {api_message(e)}") from None
        try:
            core.replace_namespaced_secret(name, namespace, secret)
        except client.ApiException as e2:
            raise PushError(f"replacing Secret {namespace}/{name}: {api_message(e2)}") from None
    return f"{namespace}/{name}"
