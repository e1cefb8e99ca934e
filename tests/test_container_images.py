"""The container images, checked without a Docker engine: hadolint lints both Dockerfiles,
dockerfile-parse and spython parse them, and they must run the same install scripts as the
local environments."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from spython.main.parse.parsers import SingularityParser

from chexflow import __version__
from chexflow import container_images as images
from tests.conftest import run_chexflow

REPO = Path(__file__).resolve().parent.parent
HADOLINT = str(Path(sys.executable).parent / "hadolint")


def parse(name: str) -> DockerfileParser:
    return DockerfileParser(path=str(REPO / images.DOCKERFILES[name]))


def instructions(parser: DockerfileParser, kind: str) -> list[str]:
    return [i["value"] for i in parser.structure if i["instruction"] == kind]


def exec_form(parser: DockerfileParser, kind: str) -> list[str]:
    (value,) = instructions(parser, kind)
    return json.loads(value)


@pytest.mark.parametrize("name", sorted(images.DOCKERFILES))
def test_hadolint_finds_nothing(name):
    proc = subprocess.run(
        [HADOLINT, "--no-color", "--format", "json", str(REPO / images.DOCKERFILES[name])],
        capture_output=True, text=True,
    )
    findings = json.loads(proc.stdout or "[]")
    assert proc.returncode == 0 and findings == [], findings
    # Every inline ignore carries its justification on the comment lines above it.
    lines = (REPO / images.DOCKERFILES[name]).read_text().splitlines()
    for n, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert lines[n - 1].startswith("# ") and "hadolint" not in lines[n - 1], line


def test_hadolint_is_a_real_linter(tmp_path):
    """The linter used above does report problems (an unpinned apt install, a root image)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
    proc = subprocess.run([HADOLINT, "--format", "json", str(bad)], capture_output=True, text=True)
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert proc.returncode != 0 and {"DL3006", "DL3008", "DL3009"} <= codes


def test_trainer_image_cuda_base_matches_tensorflow_2_20():
    df = parse("trainer")
    # TensorFlow 2.20 was built against CUDA 12.5 and cuDNN 9.3: a CUDA 12.5 devel image with
    # cuDNN (devel: nvcc and nccl.h for Horovod's NCCL build) on Ubuntu 24.04, whose Python is 3.12.
    # the build stage on the devel image (nvcc, nccl.h), the image on the same release's runtime
    build, runtime = df.parent_images
    assert re.fullmatch(r"nvidia/cuda:12\.5\.\d+-cudnn-devel-ubuntu24\.04", build)
    assert runtime == build.replace("-devel-", "-runtime-") == df.baseimage
    assert df.args["PYTHON_VERSION"] == "3.12"
    # the bases are build arguments (e.g. an NGC or mirrored CUDA image)
    other = DockerfileParser(path=df.dockerfile_path, build_args={
        "CUDA_IMAGE": "mirror/cuda:x", "RUNTIME_IMAGE": "mirror/cuda:y"})
    assert other.parent_images == ["mirror/cuda:x", "mirror/cuda:y"]
    assert 'ARG TF_PACKAGE="tensorflow[and-cuda]==2.20.0"' in df.content  # the build stage's


def test_trainer_image_installs_with_the_trainer_script():
    df = parse("trainer")
    runs = instructions(df, "RUN")
    install = [r for r in runs if "images/install-trainer.sh" in r]
    # the environment in the build stage, with the GPU TensorFlow and without chexflow ...
    assert len(install) == 1
    assert "install-trainer.sh /opt/chexflow/venv --no-project" in install[0]
    assert 'TF_PACKAGE="${TF_PACKAGE}"' in install[0]
    # ... then chexflow alone in the image's stage, after the environment's layer, so that a
    # change of the source leaves that layer cached (no dependency resolved, nothing downloaded)
    project = next(r for r in runs if "pip install" in r)
    assert "--no-deps" in project and "--no-index" in project and "/opt/chexflow/src" in project
    copies = instructions(df, "COPY")
    assert copies.index("--from=build /opt/chexflow/venv /opt/chexflow/venv") < copies.index(
        ". /opt/chexflow/src")
    build_apt, runtime_apt = (r for r in runs if "apt-get install" in r)
    for pkg in ("python${PYTHON_VERSION}-venv", "python${PYTHON_VERSION}-dev", "libopenmpi-dev",
                "openmpi-bin", "openssh-server", "openssh-client", "cmake"):
        assert re.search(rf"\b{re.escape(pkg)}\b", build_apt), pkg
    # the image itself: the environment built in the first stage, no compiler or headers
    for pkg in ("python${PYTHON_VERSION}", "openmpi-bin", "openssh-server", "openssh-client"):
        assert re.search(rf"(^|\s){re.escape(pkg)}(\s|$)", runtime_apt), pkg
    assert not re.search(r"-dev\b|build-essential|cmake", runtime_apt)
    # the script, what it sources, its pinned requirements and Horovod's patch are what is
    # copied in before the first install
    first_copy = instructions(df, "COPY")[0].split()
    assert first_copy[:4] == ["images/install-trainer.sh", "images/python.sh",
                              "images/requirements-trainer.txt",
                              "images/horovod-0.28.1-tf2.20.patch"]
    assert "PATH=/opt/chexflow/venv/bin" in " ".join(instructions(df, "ENV"))


def test_trainer_image_runs_as_the_mpi_operator_non_root_user():
    df = parse("trainer")
    assert df.args["USER_NAME"] != "root" and df.args["USER_UID"] != "0"
    assert instructions(df, "USER") == ["${USER_NAME}"]
    assert df.structure[-1]["instruction"] == "CMD"
    assert exec_form(df, "ENTRYPOINT") == ["chexflow"]
    setup = next(r for r in instructions(df, "RUN") if "useradd" in r)
    assert "images/trainer/sshd_config" in setup and "ssh_config.d/chexflow.conf" in setup
    # sshd as that user: its own pid file, the mounted key as host key, an unprivileged port
    sshd = (REPO / "images/trainer/sshd_config").read_text()
    assert "PidFile /home/@USER@/sshd.pid" in sshd and "HostKey /home/@USER@/.ssh/id_rsa" in sshd
    assert int(df.args["SSH_PORT"]) > 1024 and "Port @PORT@" in sshd
    assert "StrictHostKeyChecking no" in (REPO / "images/trainer/ssh_config").read_text()


def test_launcher_image_has_the_control_environment_and_kfp():
    df = parse("launcher")
    assert re.fullmatch(r"python:3\.11-slim-\w+", df.baseimage)
    install = [r for r in instructions(df, "RUN") if "images/install-control.sh" in r]
    assert len(install) == 2
    assert install[0].rstrip().endswith("--no-project")
    assert install[1].rstrip().endswith("--install")
    requirements = (REPO / "images/requirements-control.txt").read_text()
    assert re.search(r"^kfp==2\.17\.\d+$", requirements, re.M)
    assert instructions(df, "USER") == ["${USER_NAME}"] and df.args["USER_NAME"] != "root"
    assert exec_form(df, "ENTRYPOINT") == ["chexflow"]
    assert "PATH=/opt/chexflow/venv/bin" in " ".join(instructions(df, "ENV"))


def test_build_context_leaves_out_local_environments():
    ignored = (REPO / ".dockerignore").read_text().split()
    for path in (".venv", ".venv-*", ".git", "runs"):
        assert path in ignored


def test_apptainer_definition_bootstraps_from_the_trainer_image():
    text = (REPO / "images/trainer/apptainer.def").read_text()
    recipe = SingularityParser(str(REPO / "images/trainer/apptainer.def")).recipe["spython-base"]
    assert re.search(r"^Bootstrap:\s*docker\s*$", text, re.M)
    assert recipe.fromHeader.lower() == "{{ trainer_image }}"
    assert any("/opt/chexflow/venv/bin" in e for e in recipe.environ)
    assert "chexflow" in recipe.cmd
    # the build argument's default is the image chexflow.container_images names
    default = re.search(r"^%arguments\n\s+TRAINER_IMAGE=(\S+)$", text, re.M).group(1)
    assert default == f"{images.DEFAULT_REGISTRY}/trainer:{__version__}"


def test_image_names_come_from_one_module(monkeypatch):
    for var in (images.TRAINER_IMAGE_ENV, images.LAUNCHER_IMAGE_ENV, images.REGISTRY_ENV,
                images.TAG_ENV):
        monkeypatch.delenv(var, raising=False)
    assert images.images() == {
        "trainer": f"ghcr.io/chexflow/trainer:{__version__}",
        "launcher": f"ghcr.io/chexflow/launcher:{__version__}",
    }
    monkeypatch.setenv(images.REGISTRY_ENV, "registry.example.org:5000/ml/")
    monkeypatch.setenv(images.TAG_ENV, "2026.11")
    assert images.trainer_image() == "registry.example.org:5000/ml/trainer:2026.11"
    monkeypatch.setenv(images.LAUNCHER_IMAGE_ENV, "reg.io/x/launch@sha256:" + "a" * 64)
    assert images.launcher_image() == "reg.io/x/launch@sha256:" + "a" * 64
    monkeypatch.setenv(images.TRAINER_IMAGE_ENV, "Trainer Image")
    with pytest.raises(images.InvalidImage, match="CHEXFLOW_TRAINER_IMAGE='Trainer Image'"):
        images.trainer_image()


def test_committed_artefacts_say_their_images_are_placeholders_in_their_first_lines():
    committed = [*REPO.glob("pipelines/*.yaml"), *REPO.glob("components/*.yaml"),
                 REPO / "trainjob" / "horovod-runtime.yaml",
                 REPO / "serving" / "chexflow-runtime.yaml",
                 REPO / "katib" / "trial-templates.yaml", *REPO.glob("katib/specs/*.yaml")]
    naming = [p for p in committed if "ghcr.io/chexflow/" in p.read_text()]
    assert len(naming) >= 15
    for path in naming:
        head = path.read_text().splitlines()[:3]
        assert "PLACEHOLDER" in head[0] and "ErrImagePull" in head[1], path
        assert "chexflow images push --registry HOST[:PORT]/PREFIX, then chexflow" in head[2]


@pytest.mark.slow  # compiles every pipeline and component
def test_images_render_with_registry_and_tag_names_them_in_every_artefact(tmp_path):
    out = tmp_path / "rendered"
    proc = run_chexflow("images", "render", "--out", out, "--registry", "reg.example:5000/ml",
                        "--tag", "v7")
    assert proc.stderr.splitlines()[0] == "images chosen by --registry and --tag"
    texts = {p: p.read_text() for p in out.rglob("*.yaml")}
    assert len(texts) == len(proc.stdout.split()) >= 15
    assert not [p for p, text in texts.items() if "ghcr.io/chexflow" in text]
    runtime = texts[out / "trainjob" / "horovod-runtime.yaml"]
    assert runtime.count("image: reg.example:5000/ml/trainer:v7") == 2  # node and launcher
    assert "image: reg.example:5000/ml/trainer:v7" in texts[out / "serving" /
                                                           "chexflow-runtime.yaml"]
    assert "reg.example:5000/ml/launcher:v7" in texts[out / "pipelines" / "chexnet-train.yaml"]
    proc = run_chexflow("images", "render", "--out", tmp_path / "bad", "--tag", "v 7",
                        check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "chexflow images: error: --registry/--tag='ghcr.io/chexflow/trainer:v 7' is not an "
        "image reference: expected [registry/]name:tag or "
        "name@sha256:digest such as reg.example.org/chexflow/trainer:0.1.0 (lower-case name)"]


def test_references_that_are_missing_broken_or_without_a_version_are_one_line(tmp_path):
    missing = tmp_path / "none.json"
    proc = run_chexflow("images", "pull-secret", "--name", "regcred", check=False,
                        env={"CHEXFLOW_IMAGES_FILE": str(missing)})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"chexflow images: error: no references file ({missing}): give --registry HOST[:PORT], "
        "or push first (chexflow images push)")
    untagged = tmp_path / "untagged.json"
    untagged.write_text(json.dumps({"registry": "reg.example:5000/team",
                                    "images": {"trainer": "reg.example:5000/team/trainer"}}))
    proc = run_chexflow("job", "render", "--name", "t", "--", "chexflow", "train",
                        check=False, env={"CHEXFLOW_IMAGES_FILE": str(untagged)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{untagged}: images.trainer='reg.example:5000/team/trainer' has neither a tag nor " \
           "a digest" in lines[0]
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    proc = run_chexflow("images", "render", "--out", tmp_path / "out", check=False,
                        env={"CHEXFLOW_IMAGES_FILE": str(broken)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{broken}: not a references file of `chexflow images push`" in lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
