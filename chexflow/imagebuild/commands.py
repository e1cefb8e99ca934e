"""`chexflow images build [NAME...] [--load]`: the images, built locally with podman.

    chexflow images build trainer --load     # build (cached by content), load into the cluster
    chexflow images build katib              # Katib's five images (chexflow/imagebuild/katib.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chexflow.imagebuild import katib
from chexflow.imagebuild.build import IMAGE_NAMES, ImageBuildError


def register(subparsers: argparse._SubParsersAction) -> None:
    from chexflow.localcluster.commands import DEFAULT_DIR

    p = subparsers.add_parser(
        "images", help="build the trainer/launcher/Katib images locally (podman, Debian base)",
        description="Build images/<name>/Dockerfile (Katib's: images/katib/<name>/, with its Go "
                    "program built from Katib's module) with podman on a debootstrapped Debian "
                    "bookworm base; cached by content in ~/.cache/chexflow/images.")
    sub = p.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build (or reuse) images; prints name and archive")
    build.add_argument("names", nargs="*", metavar="NAME",
                       help=f"images to build: {', '.join(IMAGE_NAMES)}, or {katib.GROUP} for "
                            f"all {len(katib.IMAGES)} Katib images (default: all)")
    build.add_argument("--load", action="store_true",
                       help="load them into the real node's containerd of the cluster in --dir")
    build.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                       help=f"the cluster's state folder for --load (default {DEFAULT_DIR})")
    build.set_defaults(func=cmd_build)


def image_names(requested: list[str]) -> list[str]:
    """The images to build, in order, once each: `katib` stands for Katib's; none means all."""
    unknown = [n for n in requested if n not in IMAGE_NAMES and n != katib.GROUP]
    if unknown:
        raise ImageBuildError(f"unknown image(s) {', '.join(unknown)}: expected "
                              f"{', '.join(IMAGE_NAMES)} or {katib.GROUP}")
    names: list[str] = []
    for n in requested or list(IMAGE_NAMES):
        for name in katib.IMAGES if n == katib.GROUP else [n]:
            if name not in names:
                names.append(name)
    return names


def cmd_build(args: argparse.Namespace) -> int:
    from chexflow.imagebuild.build import build_image
    from chexflow.localcluster.controlplane import ClusterError, LocalCluster
    from chexflow.localcluster.realnode import RealNode

    names = image_names(args.names)
    node = None
    if args.load:
        cluster = LocalCluster.attach(args.dir)
        if not cluster.real_node or not cluster.running():
            raise ClusterError(f"--load: no running cluster with a real node in {args.dir} "
                               "(start one: chexflow cluster up --real-node)")
        node = RealNode(args.dir)
    for name in names:
        image = build_image(name)
        how = "cached" if image.cached else f"built in {image.seconds:.0f} s"
        print(f"{image.name}: {image.ref} ({how}) {image.archive}", file=sys.stderr)
        if node:
            node.import_image(image.archive)
            print(f"{image.name}: loaded into {node.containerd_socket}", file=sys.stderr)
        print(image.ref)
    return 0
