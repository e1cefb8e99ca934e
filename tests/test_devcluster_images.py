"""The image build's cache key covers exactly what the build context sends."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from chexflow.devcluster import images as build
from chexflow.devcluster.commands import cmd_images_build as cmd_build


def _tree(root):
    (root / "images" / "trainer").mkdir(parents=True)
    (root / "images" / "trainer" / "Dockerfile").write_text("FROM x\n")
    (root / "chexflow").mkdir()
    (root / "chexflow" / "a.py").write_text("A = 1\n")
    (root / "runs").mkdir()
    (root / "runs" / "out.txt").write_text("x")
    (root / "pkg" / "build").mkdir(parents=True)
    (root / "pkg" / "build" / "go.mod").write_text("module m\n")
    (root / "chexflow" / "__pycache__").mkdir()
    (root / "chexflow" / "__pycache__" / "a.pyc").write_text("")
    (root / ".dockerignore").write_text("# comment\n.git\nruns\nbuild\n**/__pycache__\n")


def test_context_files_follow_dockerignore(tmp_path):
    _tree(tmp_path)
    assert build.context_files(tmp_path) == [
        ".dockerignore", "chexflow/a.py", "images/trainer/Dockerfile", "pkg/build/go.mod"]


def test_content_key_changes_with_sources_and_arguments_only(tmp_path):
    _tree(tmp_path)
    args = {"CUDA_IMAGE": "chexflow.local/bookworm:1"}
    key = build.content_key("trainer", args, tmp_path)
    (tmp_path / "runs" / "out.txt").write_text("changed")
    assert build.content_key("trainer", args, tmp_path) == key
    assert build.content_key("trainer", {"CUDA_IMAGE": "other"}, tmp_path) != key
    (tmp_path / "chexflow" / "a.py").write_text("A = 2\n")
    assert build.content_key("trainer", args, tmp_path) != key


def test_cached_archive_is_reused_without_podman(tmp_path, monkeypatch):
    monkeypatch.setenv("CHEXFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "base_image", lambda podman: pytest.fail("rebuilt the base"))
    key = build.content_key("launcher", {"PYTHON_IMAGE": build.base_ref()})
    archive = tmp_path / "cache" / "images" / f"launcher-{key}.tar"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"archive")
    image = build.build_image("launcher")
    assert image.cached and image.archive == archive
    assert image.ref == f"chexflow.local/launcher:{key}"


def test_unknown_image_name_is_one_clear_error():
    import argparse

    with pytest.raises(build.ImageBuildError, match="unknown image.*expected trainer, launcher, "
                                                    "earlystopping, katib-.* or katib$"):
        cmd_build(argparse.Namespace(names=["trainr"], load=False, dir=None))


def test_failed_save_leaves_no_partial_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("CHEXFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "base_image", lambda podman: build.base_ref())

    def run(self, *args, **kwargs):  # podman: the build works, the save dies half-way
        if args[0] == "save":
            Path(args[args.index("-o") + 1]).write_bytes(b"half an archive")
            raise build.ImageBuildError("`podman save --format ...` exited 125")
        return subprocess.CompletedProcess(["podman", *args], 0)

    monkeypatch.setattr(build.Podman, "run", run)
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(build.ImageBuildError, match="podman save"):
        build._podman_build("katib-db-manager", "0123", tmp_path / "Dockerfile", tmp_path,
                            {}, [], 0.0)
    assert list((tmp_path / "cache" / "images").iterdir()) == []


@pytest.mark.realnode
def test_a_named_stage_outlives_older_builds_so_a_source_change_rebuilds_only_what_follows(
        tmp_path):
    """A two-stage build (as images/trainer/Dockerfile's `build` stage, which installs
    TensorFlow and builds Horovod), built again after a change of a file only the last stage
    copies: the stage's RUN (writing random bytes) is podman's cached layer, not run again,
    though the older build was dropped and podman's dangling images pruned in between."""
    podman = build.Podman(build.cache_root() / "podman")
    base = build.base_image(podman)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base} AS build\nRUN head -c 16 /dev/urandom | od -An -tx1 > /stage-marker\n"
        f"FROM {base}\nCOPY --from=build /stage-marker /stage-marker\nCOPY src.txt /src.txt\n")
    name, built, copied = "test-stages", [], []

    def layers(ref: str) -> list[str]:
        return json.loads(podman.run("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                     ref, quiet=True).stdout)

    try:
        for key in ("a", "b"):
            (tmp_path / "src.txt").write_text(key)
            built.append(build._podman_build(name, key, tmp_path / "Dockerfile", tmp_path,
                                             {}, [], 0.0, on_debian=False))
            copied.append(layers(built[-1].ref)[-2])  # the layer of COPY --from=build
        assert copied[1] == copied[0]  # the same marker: the stage's RUN was not run again
        assert podman.exists("chexflow.local/test-stages-build:b")
        assert not podman.exists("chexflow.local/test-stages-build:a")  # older tags dropped
        assert not podman.exists("chexflow.local/test-stages:a")
        assert not built[0].archive.exists() and built[1].archive.exists()
    finally:
        podman.run("rmi", "--ignore", "chexflow.local/test-stages:b",
                   "chexflow.local/test-stages-build:b", quiet=True, check=False)
        for image in built:
            image.archive.unlink(missing_ok=True)
