"""`chexflow images build [trainer|launcher] [--load]`: the images, built locally with podman.

    chexflow images build trainer --load     # build (cached by content), load into the cluster
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chexflow.container_images import DOCKERFILES


def register(subparsers: argparse._SubParsersAction) -> None:
    from chexflow.localcluster.commands import DEFAULT_DIR

    p = subparsers.add_parser(
        "images", help="build the trainer/launcher images locally (podman, Debian base)",
        description="Build images/<name>/Dockerfile with podman on a debootstrapped Debian "
                    "bookworm base; cached by content in ~/.cache/chexflow/images.")
    sub = p.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build (or reuse) images; prints name and archive")
    build.add_argument("names", nargs="*", metavar="NAME",
                       help=f"images to build: {', '.join(DOCKERFILES)} (default: all)")
    build.add_argument("--load", action="store_true",
                       help="load them into the real node's containerd of the cluster in --dir")
    build.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                       help=f"the cluster's state folder for --load (default {DEFAULT_DIR})")
    build.set_defaults(func=cmd_build)


def cmd_build(args: argparse.Namespace) -> int:
    from chexflow.imagebuild.build import ImageBuildError, build_image
    from chexflow.localcluster.controlplane import ClusterError, LocalCluster
    from chexflow.localcluster.realnode import RealNode

    unknown = [n for n in args.names if n not in DOCKERFILES]
    if unknown:
        raise ImageBuildError(f"unknown image(s) {', '.join(unknown)}: expected "
                              f"{' or '.join(DOCKERFILES)}")
    node = None
    if args.load:
        cluster = LocalCluster.attach(args.dir)
        if not cluster.real_node or not cluster.running():
            raise ClusterError(f"--load: no running cluster with a real node in {args.dir} "
                               "(start one: chexflow cluster up --real-node)")
        node = RealNode(args.dir)
    for name in args.names or list(DOCKERFILES):
        image = build_image(name)
        how = "cached" if image.cached else f"built in {image.seconds:.0f} s"
        print(f"{image.name}: {image.ref} ({how}) {image.archive}", file=sys.stderr)
        if node:
            node.import_image(image.archive)
            print(f"{image.name}: loaded into {node.containerd_socket}", file=sys.stderr)
        print(image.ref)
    return 0
