"""`chexflow images push` against a real registry: distribution's, built from its Go module
(chexflow/devcluster/build/registry, cached by content) and served by devcluster.registry over
TLS with the test CA and htpasswd auth. What is pushed is pulled back by digest with podman,
every artefact rendered after the push names the pushed references, and each bad push is one
line that leaves the references file as it was (bad references files: test_container_images).

The images pushed are small ones made here with podman and saved where `chexflow images build`
keeps this tree's archives (CHEXFLOW_CACHE): the push reads them as it reads built ones and does
not look inside, and building the trainer for a test would take many minutes."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from chexflow.devcluster import certs, registry
from chexflow.devcluster.images import LOCAL_REGISTRY, Podman, image_key
from chexflow.ports import free_port
from tests.conftest import run_chexflow

# slow: the registry's Go build when not cached, and podman's images
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    subprocess.run(["which", "podman"], capture_output=True).returncode != 0,
    reason="podman is not installed (images/install-system.sh)")]

NAMES = ("trainer", "launcher", "earlystopping")
DIGEST_REF = r"(?P<repo>[^\s@]+):(?P<tag>[0-9a-f]{12})@(?P<digest>sha256:[0-9a-f]{64})"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A registry on 127.0.0.1: (Registry, its CA certificate)."""
    root = tmp_path_factory.mktemp("registry")
    pki = certs.make_pki(root / "state")
    bin_dir = registry.ensure_binaries()
    reg = registry.Registry(root / "registry", "127.0.0.1", free_port())
    reg.configure(pki, bin_dir)
    proc = reg.start(bin_dir, pki.ca)
    yield reg, pki.ca
    registry.stop(proc)


def _save_image(cache: Path, name: str, data: bytes | None = None) -> None:
    """A one-file image (`data`, default its name) saved as this tree's archive of `name`
    under `cache`."""
    ref = f"{LOCAL_REGISTRY}/{name}:{image_key(name)}"
    podman = Podman(cache / "podman")
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = data or f"chexflow {name}\n".encode()
        info = tarfile.TarInfo(f"etc/chexflow-{name}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["podman", "import", "-", ref], input=layer.getvalue(), env=podman.env(),
                   capture_output=True, check=True)
    archive = cache / "images" / f"{name}-{image_key(name)}.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    podman.run("save", "-o", str(archive), ref, quiet=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A chexflow cache holding an archive of each image as `chexflow images build` names it."""
    cache = tmp_path_factory.mktemp("cache")
    for name in NAMES:
        _save_image(cache, name)
    return cache


def _env(cache: Path, refs: Path, **more: str) -> dict[str, str]:
    return {"CHEXFLOW_CACHE": str(cache), "CHEXFLOW_IMAGES_FILE": str(refs), **more}


def _push(served, cache: Path, refs: Path, *extra: str, check: bool = True):
    reg, ca = served
    return run_chexflow("images", "push", "--registry", f"{reg.address}/team", "--authfile",
                        reg.auth_file, "--ca-file", ca, *extra, env=_env(cache, refs),
                        check=check, timeout=300)


def _served_digest(reg: registry.Registry, ca: Path, repo: str, tag: str) -> str:
    """The digest the registry serves for REPO:TAG (its Docker-Content-Digest header)."""
    request = urllib.request.Request(
        f"https://{reg.address}/v2/{repo}/manifests/{tag}", method="HEAD",
        headers={"Authorization": f"Basic {reg.credentials().basic()}",
                 "Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                           "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)),
                                timeout=30) as response:
        return response.headers["Docker-Content-Digest"]


def test_push_prints_and_records_digests_the_registry_serves_and_podman_pulls_by_digest(
        served, built, tmp_path):
    reg, ca = served
    refs = tmp_path / "pushed.json"
    proc = _push(served, built, refs)
    printed = proc.stdout.split()
    assert len(printed) == len(NAMES)
    recorded = json.loads(refs.read_text())
    assert recorded["registry"] == f"{reg.address}/team"
    assert recorded["images"] == dict(zip(NAMES, printed, strict=True))
    puller = Podman(tmp_path / "puller")  # a store that never held these images
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    (cert_dir / "ca.crt").write_bytes(ca.read_bytes())
    for name, ref in zip(NAMES, printed, strict=True):
        m = re.fullmatch(DIGEST_REF, ref)
        assert m and m["repo"] == f"{reg.address}/team/{name}", ref
        assert m["tag"] == image_key(name)
        assert _served_digest(reg, ca, f"team/{name}", m["tag"]) == m["digest"]
        puller.run("pull", "--quiet", "--authfile", str(reg.auth_file), "--cert-dir",
                   str(cert_dir), f"{m['repo']}@{m['digest']}", quiet=True)
        inspected = puller.run("image", "inspect", "--format", "{{.Digest}}",
                               f"{m['repo']}@{m['digest']}", quiet=True)
        assert inspected.stdout.strip() == m["digest"]


def test_after_a_push_every_artefact_names_the_pushed_images_and_no_placeholder(
        served, built, tmp_path):
    reg, _ = served
    refs = tmp_path / "pushed.json"
    _push(served, built, refs)
    pushed = json.loads(refs.read_text())["images"]
    env = _env(built, refs)
    out = tmp_path / "rendered"
    run_chexflow("images", "render", "--out", out, env=env)
    texts = {p: p.read_text() for p in out.rglob("*.yaml")}
    assert {p.relative_to(out).parts[0] for p in texts} == {
        "pipelines", "components", "trainjob", "serving", "katib"}
    assert not [p for p, text in texts.items() if "ghcr.io/chexflow" in text]
    runtime = yaml.safe_load(texts[out / "trainjob" / "horovod-runtime.yaml"])
    images = {job["name"]: job["template"]["spec"]["template"]["spec"]["containers"][0]["image"]
              for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    assert images == {"launcher": pushed["trainer"], "node": pushed["trainer"]}
    assert pushed["trainer"] in texts[out / "katib" / "trial-templates.yaml"]
    pipeline = texts[out / "pipelines" / "chexnet-train.yaml"]
    assert pushed["trainer"] in pipeline and pushed["launcher"] in pipeline
    assert pipeline.startswith(f"# IMAGES: trainer {pushed['trainer']}\n")
    mpijob = yaml.safe_load(run_chexflow("job", "render", "--name", "t", "--", "chexflow",
                                         "train", env=env).stdout)
    pods = [r["template"]["spec"] for r in mpijob["spec"]["mpiReplicaSpecs"].values()]
    assert {c["image"] for pod in pods for c in pod["containers"]} == {pushed["trainer"]}
    secret = yaml.safe_load(run_chexflow("images", "pull-secret", "--name", "regcred",
                                         "--authfile", reg.auth_file, env=env).stdout)
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    stored = json.loads(reg.auth_file.read_text())["auths"][reg.address]["auth"]
    assert config["auths"][reg.address]["auth"] == stored


def _bad_authfile(reg: registry.Registry, tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.json"
    if kind == "wrong-password":
        auth = base64.b64encode(f"{registry.USER}:not-the-password".encode()).decode()
        path.write_text(json.dumps({"auths": {reg.address: {"auth": auth}}}))
    else:
        path.write_text("{not json")
    return path


@pytest.mark.parametrize("case, expected", [
    ("unreachable", "does not answer on https://127.0.0.1:"),
    ("wrong-password", "refused the login of"),
    ("broken-authfile", "not a containers-auth.json file"),
    ("untrusted", "its certificate is not trusted"),
    ("never-built", "not built for this tree: trainer-gpu"),
    ("bad-tag", "--tag="),
])
def test_a_bad_push_is_one_line_and_leaves_the_references_file_as_it_was(
        served, built, tmp_path, case, expected):
    reg, ca = served
    refs = tmp_path / "pushed.json"
    refs.write_text('{"registry": "earlier", "images": {}}\n')
    where, auth, extra = f"{reg.address}/team", reg.auth_file, ["--ca-file", ca]
    if case == "unreachable":
        where = f"127.0.0.1:{free_port()}/team"
    elif case in ("wrong-password", "broken-authfile"):
        auth = _bad_authfile(reg, tmp_path, case)
    elif case == "untrusted":
        extra = []
    elif case == "never-built":
        extra += ["trainer-gpu"]
    elif case == "bad-tag":
        extra += ["--tag", "a/b"]
    proc = run_chexflow("images", "push", "--registry", where, "--authfile", auth, *extra,
                        env=_env(built, refs), check=False, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("chexflow images: error: ") and expected in lines[0], lines[0]
    assert refs.read_text() == '{"registry": "earlier", "images": {}}\n'


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs for the registry's storage")
def test_a_registry_whose_disk_is_full_fails_the_push_in_one_line_and_tags_nothing(tmp_path):
    """The registry's storage a 256 KiB tmpfs, the image's layer 1 MiB of random bytes."""
    storage = tmp_path / "storage"
    storage.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(storage)],
                   check=True)
    try:
        pki = certs.make_pki(tmp_path / "state")
        bin_dir = registry.ensure_binaries()
        reg = registry.Registry(tmp_path / "registry", "127.0.0.1", free_port(), storage)
        reg.configure(pki, bin_dir)
        proc = reg.start(bin_dir, pki.ca)
        try:
            cache, refs = tmp_path / "cache", tmp_path / "pushed.json"
            _save_image(cache, "trainer", os.urandom(1 << 20))
            pushed = _push((reg, pki.ca), cache, refs, "trainer", check=False)
            request = urllib.request.Request(
                f"https://{reg.address}/v2/team/trainer/tags/list", headers={
                    "Authorization": f"Basic {reg.credentials().basic()}"})
            try:
                with urllib.request.urlopen(request, context=ssl.create_default_context(
                        cafile=str(pki.ca)), timeout=30) as response:
                    tags = json.loads(response.read())["tags"] or []
            except urllib.error.HTTPError as e:
                tags = [] if e.code == 404 else [f"HTTP {e.code}"]
        finally:
            registry.stop(proc)
    finally:
        subprocess.run(["umount", str(storage)], check=True)
        # podman leaves its storage's overlay mounted (a bind mount) after a failed push
        overlay = tmp_path / "cache" / "podman" / "storage" / "overlay"
        if f" {overlay} " in Path("/proc/self/mountinfo").read_text():
            subprocess.run(["umount", str(overlay)], check=True)
    lines = pushed.stderr.strip().splitlines()
    assert pushed.returncode == 2 and lines[:-1] == [
        f"pushing trainer to {reg.address}/team/trainer ..."], pushed.stderr
    assert lines[-1].startswith(f"chexflow images: error: pushing trainer to {reg.address}/team/"
                                "trainer:"), lines[-1]
    assert "500 Internal Server Error; the registry failed to store it (a full disk answers " \
           f"so); trainer is not tagged there, {refs} unchanged" in lines[-1]
    assert tags == [] and not refs.exists()


def test_a_registry_answering_plain_http_is_one_line_saying_push_needs_tls(built, tmp_path):
    """A server that answers HTTP without TLS (Python's http.server) where the registry is."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "http.server did not listen"
                time.sleep(0.1)
        refs = tmp_path / "pushed.json"
        proc = run_chexflow("images", "push", "launcher", "--registry", f"127.0.0.1:{port}/team",
                            env=_env(built, refs), check=False, timeout=120)
    finally:
        server.terminate()
        server.wait(10)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"chexflow images: error: registry 127.0.0.1:{port} answers without TLS (plain HTTP): "
        "chexflow pushes over TLS only, as clusters pull; serve it with a certificate (and "
        "--ca-file for a private CA)")
    assert not refs.exists()
