"""`chexflow cluster up|down|env|build` and `chexflow images build`: the dev cluster by hand.

    chexflow cluster up                 # builds binaries on first use, then starts (~20 s)
    eval "$(chexflow cluster env)"      # export KUBECONFIG=... PATH=DIR/bin:... (its kubectl)
    chexflow cluster status             # which components run, which are down, restarts
    chexflow cluster down               # a later `up` resumes it with its objects (--fresh: not)
    chexflow images build trainer --load     # build (cached by content), load into the cluster
    chexflow images build katib              # Katib's five images (katib_images.py)
    chexflow images push --registry HOST[:PORT]/PREFIX   # pushed, pinned by digest (push.py)
    chexflow images render [--out DIR]       # the artefacts for the pushed images
    chexflow images pull-secret --name N     # a pull Secret from the push's credentials
"""


from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chexflow.devcluster import katib_images
from chexflow.devcluster.images import DEFAULT_NAMES, IMAGE_NAMES, ImageBuildError

if TYPE_CHECKING:
    from chexflow.devcluster.addon import AddOn

DEFAULT_DIR = Path(os.environ.get("CHEXFLOW_CLUSTER_DIR",
                                  Path.home() / ".cache" / "chexflow" / "cluster"))


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_cluster(subparsers)
    _register_images(subparsers)


def _register_cluster(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "cluster", help="the development Kubernetes cluster on this machine (apiserver, "
        "scheduler, mpi-operator, kwok)",
        description="A real Kubernetes control plane on loopback, built from Go modules: etcd, "
                    "kube-apiserver, kube-controller-manager, kube-scheduler, kwok GPU nodes and "
                    "mpi-operator, with the MPIJob and Katib Experiment CRDs installed.")
    sub = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")

    up = sub.add_parser("up", help="start the cluster (detached unless --foreground)")
    _dir_arg(up)
    up.add_argument("--nodes", type=int, default=4, help="kwok GPU nodes (default 4)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="nvidia.com/gpu per node")
    _addon_flags(up, lambda addon: addon.help)
    up.add_argument("--real-nodes", type=int, default=1, metavar="N",
                    help="with --real-node: N real nodes, each its own containerd, kubelet, "
                         "bridge and pod /24, routed to each other on the host (implies "
                         "--real-node; default 1)")
    up.add_argument("--timeout", type=float, default=180, help="seconds to wait for readiness")
    up.add_argument("--foreground", action="store_true",
                    help="stay attached (restarting components that exit); Ctrl-C stops the "
                         "cluster")
    up.add_argument("--fresh", action="store_true",
                    help="start from an empty etcd (by default a state folder used before is "
                         "resumed with its objects: Deployments, MPIJobs, Experiments)")
    up.set_defaults(func=cmd_up)

    status = sub.add_parser("status", help="which components run, which are down (and how to "
                            "recover), with restart counts; exit 1 when one is down")
    _dir_arg(status)
    status.set_defaults(func=cmd_status)

    down = sub.add_parser("down", help="stop the cluster started from --dir; its real nodes' "
                          "images are removed (they are in the registry or the images cache)")
    _dir_arg(down)
    down.add_argument("--keep-images", action="store_true",
                      help="keep the real nodes' containerd content (the pulled and loaded "
                           "images, several GB with the trainer's) for the next `cluster up`")
    down.set_defaults(func=cmd_down)

    env = sub.add_parser("env", help="print `export KUBECONFIG=...` and PATH with its kubectl, "
                                     "for eval")
    _dir_arg(env)
    env.set_defaults(func=cmd_env)

    build = sub.add_parser("build", help="build (or locate) the binaries; prints their folder")
    _addon_flags(build, lambda addon: f"also what --{addon.name} runs")
    build.set_defaults(func=cmd_cluster_build)


def _addon_flags(p: argparse.ArgumentParser, help_of: Callable[[type[AddOn]], str]) -> None:
    """A --NAME flag for each add-on of the table (chexflow.devcluster.addons), its help
    `help_of(add-on class)`."""
    from chexflow.devcluster.addons import TABLE

    for addon in TABLE.values():
        p.add_argument(f"--{addon.name}", action="store_true", help=help_of(addon))


def _asked(args: argparse.Namespace) -> list[AddOn]:
    """The add-ons the --NAME flags ask for (--real-nodes N > 1 implies --real-node), with
    what they require."""
    from chexflow.devcluster.addons import TABLE, resolve
    from chexflow.devcluster.realnode import RealNodes

    asked: list[AddOn] = [cls() for cls in TABLE.values() if cls is not RealNodes
                          and getattr(args, cls.name.replace("-", "_"))]
    if args.real_node or args.real_nodes > 1:
        asked.append(RealNodes(count=args.real_nodes))
    return resolve(asked)


def _dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help=f"state folder: pki, kubeconfig, logs, etcd data (default {DEFAULT_DIR})")


def cmd_up(args: argparse.Namespace) -> int:
    from chexflow.devcluster.controlplane import LocalCluster, check_state_dir
    from chexflow.devcluster.supervisor import DevClusterError

    if args.nodes < 1 or args.gpus_per_node < 0 or args.real_nodes < 1:
        raise DevClusterError(f"--nodes and --real-nodes must be >= 1 and --gpus-per-node >= 0 "
                              f"(got {args.nodes}, {args.real_nodes}, {args.gpus_per_node})")
    check_state_dir(args.dir)
    _clean_unfinished_start(args.dir)
    start = time.monotonic()
    # --foreground: the cluster goes with this command, however it ends; detached: it outlives
    # the command once ready (a watcher stops it if the command dies before)
    cluster = LocalCluster(args.dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                           addons=_asked(args), supervise=not args.foreground,
                           die_with_parent=args.foreground)
    resumed = not args.fresh and (args.dir / "etcd").is_dir()
    cluster.start(timeout=args.timeout, fresh=args.fresh)
    print(f"cluster up in {time.monotonic() - start:.1f} s: {cluster.server}, "
          f"{args.nodes} kwok nodes x {args.gpus_per_node} nvidia.com/gpu"
          + "".join(f", {addon.describe(cluster)}" for addon in cluster.addons)
          + (f"; resumed the objects in {args.dir / 'etcd'}" if resumed else ""),
          file=sys.stderr)
    print(f"logs: {cluster.log_dir}", file=sys.stderr)
    print(exports(cluster))
    if not args.foreground:
        return 0
    print("Ctrl-C stops it; components that exit are restarted", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while True:
            time.sleep(1)
            for name in cluster.supervisor.restart_dead():
                print(f"{time.strftime('%H:%M:%S')} {name} exited: restarted (restart "
                      f"{cluster.processes[name]['restarts']}; see {cluster.log_dir}/{name}.log)",
                      file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("cluster stopped", file=sys.stderr)
    return 0


def _clean_unfinished_start(state_dir: Path) -> None:
    """Refuse while a cluster runs from `state_dir` or is being started; stop what a start that
    did not finish left (its `chexflow cluster up` was killed, and so was its watcher)."""
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.supervisor import STATE_FILE, DevClusterError

    if not (state_dir / STATE_FILE).exists():
        return
    cluster = LocalCluster.attach(state_dir)
    if cluster.starting():
        raise DevClusterError(f"a cluster is being started from {state_dir} by pid "
                              f"{cluster.starter} (`chexflow cluster up`): wait for it, or "
                              f"`chexflow cluster down --dir {state_dir}`")
    if cluster.ready and cluster.running():
        raise DevClusterError(f"a cluster is already running from {state_dir}: "
                              f"`chexflow cluster down --dir {state_dir}` first")
    if not cluster.ready:
        print(f"stopping what an unfinished `chexflow cluster up` (pid {cluster.starter}) left "
              f"in {state_dir}", file=sys.stderr)
    cluster.stop()


def cmd_down(args: argparse.Namespace) -> int:
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.realnode import drop_images

    cluster = LocalCluster.attach(args.dir)
    cluster.stop()
    freed = 0 if args.keep_images else drop_images(args.dir)
    print(f"cluster in {args.dir} stopped" + (f"; its nodes' images removed ({freed / 1e9:.1f} "
          "GB; --keep-images keeps them)" if freed else ""), file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Each component as asked of `cluster up` (running, DOWN, or never started), the
    supervisor, and whether the start finished; 1 when anything is missing, with how to
    recover."""
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.supervisor import STATE_FILE, watcher

    if not (args.dir / STATE_FILE).exists() and (args.dir / "etcd").is_dir():
        print(f"no cluster runs from {args.dir}; its objects are kept (etcd): `chexflow cluster "
              f"up --dir {args.dir}` resumes it")
        return 1
    cluster = LocalCluster.attach(args.dir)
    down = set(cluster.supervisor.dead())
    missing = [n for n in cluster.components() if n not in cluster.processes]
    keeper = watcher(args.dir)
    print(f"cluster in {args.dir}: {cluster.server}; supervised by "
          + (f"pid {keeper['pid']}" if keeper else
             "nobody: its supervisor is gone" if cluster.supervise and cluster.ready else
             "nobody (a `cluster up --foreground` restarts what exits while it runs)"))
    for name in [*cluster.processes, *missing]:
        state = ("NOT STARTED" if name in missing else "DOWN" if name in down
                 else f"running (pid {cluster.processes[name]['pid']})")
        restarts = cluster.processes.get(name, {}).get("restarts", 0)
        print(f"  {name:<24} {state:<22} restarts {restarts}")
    verdict = _status_verdict(cluster, sorted(down), missing, keeper is not None)
    if verdict:
        print(verdict)
    return 1 if verdict else 0


def _status_verdict(cluster, down: list[str], missing: list[str], supervised: bool
                    ) -> str | None:
    """What is wrong with the cluster and how to recover, in one line; None when it is up as
    asked."""
    where = cluster.state_dir
    redo = (f"`chexflow cluster down --dir {where}` then `chexflow cluster up --dir {where}` "
            f"(resumes with the objects)")
    if cluster.starting():
        return (f"starting: `chexflow cluster up` (pid {cluster.starter}) has not finished"
                + (f"; not started yet: {', '.join(missing)}" if missing else ""))
    if not cluster.ready:
        return (f"its start did not finish: the `chexflow cluster up` that started it (pid "
                f"{cluster.starter}) is gone"
                + (f"; never started: {', '.join(missing)}" if missing else "")
                + (f"; down: {', '.join(down)}" if down else "")
                + f"; `chexflow cluster up --dir {where}` stops what is left and starts it "
                  f"again (`chexflow cluster down --dir {where}` only stops it)")
    if down or missing:
        how = "the supervisor restarts it within seconds" if supervised and not missing else redo
        return f"down: {', '.join([*down, *missing])}; {how}; logs in {cluster.log_dir}/"
    if cluster.supervise and not supervised:
        return f"its supervisor is gone: nothing restarts a component that exits; {redo}"
    return None


def exports(cluster) -> str:
    """The shell lines that point kubectl (the cluster's own, on PATH first) at the cluster."""
    return (f"export KUBECONFIG={cluster.kubeconfig}\n"
            f'export PATH="{cluster.path_dir}:$PATH"')


def cmd_env(args: argparse.Namespace) -> int:
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.supervisor import DevClusterError

    cluster = LocalCluster.attach(args.dir)
    if not cluster.running():
        raise DevClusterError(f"the cluster recorded in {args.dir} is not running "
                           "(start it: chexflow cluster up)")
    print(exports(cluster))
    return 0


def cmd_cluster_build(args: argparse.Namespace) -> int:
    from chexflow.devcluster.addons import TABLE
    from chexflow.devcluster.binaries import ensure_binaries

    print(ensure_binaries())
    for addon in TABLE.values():
        if getattr(args, addon.name.replace("-", "_")):
            for built in addon().build():
                print(built)
    return 0


def _register_images(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "images", help="build the trainer/launcher/Katib images locally (podman, Debian base), "
        "push them to a registry, render the artefacts for them",
        description="Build images/<name>/Dockerfile (Katib's: images/katib/<name>/, with its Go "
                    "program built from Katib's module) with podman on a debootstrapped Debian "
                    "bookworm base; cached by content in ~/.cache/chexflow/images. Push them to "
                    "a registry, pinned by digest, and render every artefact for what was "
                    "pushed.")
    sub = p.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build (or reuse) images; prints name and archive")
    build.add_argument("names", nargs="*", metavar="NAME",
                       help=f"images to build: {', '.join(IMAGE_NAMES)}, or {katib_images.GROUP} "
                            f"for all {len(katib_images.IMAGES)} Katib images (default: all but "
                            "trainer-gpu, which needs network access to its CUDA bases)")
    build.add_argument("--load", action="store_true",
                       help="load them into the real node's containerd of the cluster in --dir")
    build.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                       help=f"the cluster's state folder for --load (default {DEFAULT_DIR})")
    build.set_defaults(func=cmd_images_build)
    _register_push(sub)
    _register_render(sub)
    _register_pull_secret(sub)


def _register_push(sub: argparse._SubParsersAction) -> None:
    from chexflow.container_images import images_file
    from chexflow.devcluster.push import DEFAULT_PUSH, PUSHABLE

    push = sub.add_parser(
        "push", help="push built images to a registry; prints and records their references "
        "pinned by digest",
        description="Push the images built for this tree (chexflow images build; never builds) "
                    "with podman, then write their digest-pinned references to "
                    f"{images_file()} (CHEXFLOW_IMAGES_FILE), which chexflow compile, images "
                    "render, job render|submit, run --backend kubernetes and tune --cluster "
                    "then use.")
    push.add_argument("names", nargs="*", metavar="NAME",
                      help=f"of {', '.join(PUSHABLE)} (default: {', '.join(DEFAULT_PUSH)}, and "
                           "trainer-gpu where it was built)")
    push.add_argument("--registry", required=True, metavar="HOST[:PORT]/PREFIX",
                      help="where: each image goes to HOST[:PORT]/PREFIX/NAME:TAG")
    push.add_argument("--tag", default=None,
                      help="the tag (default: each image's content key, as built)")
    push.add_argument("--authfile", type=Path, default=None,
                      help="credentials (containers-auth.json); default: REGISTRY_AUTH_FILE, "
                           "else podman's and docker's usual files")
    push.add_argument("--ca-file", type=Path, default=None,
                      help="the CA that signed the registry's certificate, if not a public one")
    push.set_defaults(func=cmd_images_push)


def _register_render(sub: argparse._SubParsersAction) -> None:
    render = sub.add_parser(
        "render", help="write the pipelines, components, TrainJob runtime, Katib trial "
        "templates and specs for the chosen images",
        description="Every artefact a cluster is given, with the images chexflow.container_"
                    "images chooses (the references of `chexflow images push`, or "
                    "CHEXFLOW_TRAINER_IMAGE/CHEXFLOW_LAUNCHER_IMAGE, or "
                    "CHEXFLOW_IMAGE_REGISTRY/CHEXFLOW_IMAGE_TAG): pipelines/*.yaml, "
                    "components/*.yaml, trainjob/horovod-runtime.yaml, "
                    "katib/trial-templates.yaml and katib/specs/*.yaml.")
    render.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write them under DIR (pipelines/, components/, trainjob/, katib/); "
                             "default: the project's own folders, in place")
    render.add_argument("--registry", metavar="HOST[:PORT]/PREFIX", default=None,
                        help="instead of the references file: each image is "
                             "HOST[:PORT]/PREFIX/NAME:TAG (CHEXFLOW_IMAGE_REGISTRY)")
    render.add_argument("--tag", default=None,
                        help="with or without --registry: the tag of every image "
                             "(CHEXFLOW_IMAGE_TAG; default: chexflow's version)")
    render.set_defaults(func=cmd_images_render)


def _register_pull_secret(sub: argparse._SubParsersAction) -> None:
    secret = sub.add_parser(
        "pull-secret", help="print (or create) the image pull Secret of the pushed images' "
        "registry, for --image-pull-secret",
        description="A kubernetes.io/dockerconfigjson Secret holding the credentials podman "
                    "pushed with (--authfile, REGISTRY_AUTH_FILE, podman's and docker's files) "
                    "for the registry of the references file; jobs name it with "
                    "--image-pull-secret NAME (pipelines: image_pull_secrets).")
    secret.add_argument("--name", required=True, help="the Secret's name")
    secret.add_argument("--namespace", default=None, help="its namespace (default: none "
                        "written, or the kubeconfig's with --apply)")
    secret.add_argument("--registry", default=None, metavar="HOST[:PORT]",
                        help="default: the registry of the references file")
    secret.add_argument("--authfile", type=Path, default=None,
                        help="default: REGISTRY_AUTH_FILE, else podman's and docker's files")
    secret.add_argument("--apply", action="store_true",
                        help="create or replace it in the cluster of KUBECONFIG instead of "
                             "printing it")
    secret.set_defaults(func=cmd_images_pull_secret)


def image_names(requested: list[str]) -> list[str]:
    """The images to build, in order, once each: `katib` stands for Katib's; none means all."""
    unknown = [n for n in requested if n not in IMAGE_NAMES and n != katib_images.GROUP]
    if unknown:
        raise ImageBuildError(f"unknown image(s) {', '.join(unknown)}: expected "
                              f"{', '.join(IMAGE_NAMES)} or {katib_images.GROUP}")
    names: list[str] = []
    for n in requested or list(DEFAULT_NAMES):
        for name in katib_images.IMAGES if n == katib_images.GROUP else [n]:
            if name not in names:
                names.append(name)
    return names


def cmd_images_build(args: argparse.Namespace) -> int:
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.images import build_image
    from chexflow.devcluster.realnode import all_nodes
    from chexflow.devcluster.supervisor import DevClusterError

    names = image_names(args.names)
    node_list = []
    if args.load:
        cluster = LocalCluster.attach(args.dir)
        if not cluster.has("real-node") or not cluster.running():
            raise DevClusterError(f"--load: no running cluster with a real node in {args.dir} "
                               "(start one: chexflow cluster up --real-node)")
        node_list = all_nodes(args.dir)
    for name in names:
        image = build_image(name)
        how = "cached" if image.cached else f"built in {image.seconds:.0f} s"
        print(f"{image.name}: {image.ref} ({how}) {image.archive}", file=sys.stderr)
        for node in node_list:
            node.import_image(image.archive)
            print(f"{image.name}: loaded into {node.name}'s containerd {node.containerd_socket}",
                  file=sys.stderr)
        print(image.ref)
    return 0


def cmd_images_push(args: argparse.Namespace) -> int:
    from chexflow.container_images import images_file
    from chexflow.devcluster.push import push

    done = push(args.names, args.registry, args.tag, args.authfile, args.ca_file)
    for pushed in done:
        print(f"{pushed.name}: pushed in {pushed.seconds:.0f} s", file=sys.stderr)
        print(pushed.reference)
    print(f"references written to {images_file()}", file=sys.stderr)
    return 0


def cmd_images_render(args: argparse.Namespace) -> int:
    from chexflow.container_images import (
        DEFAULT_REGISTRY,
        DEFAULT_TAG,
        REGISTRY_ENV,
        TAG_ENV,
        check_reference,
        image_source,
    )
    from chexflow.devcluster.render import render_all

    if args.registry is not None or args.tag is not None:
        check_reference(f"{(args.registry or DEFAULT_REGISTRY).rstrip('/')}/trainer:"
                        f"{args.tag or DEFAULT_TAG}", "--registry/--tag")
    # the chosen images are container_images' choice: these flags are its variables, here
    for value, variable in ((args.registry, REGISTRY_ENV), (args.tag, TAG_ENV)):
        if value is not None:
            os.environ[variable] = value
    flags = " and ".join(f for f, v in (("--registry", args.registry), ("--tag", args.tag)) if v)
    print(f"images chosen by {flags or image_source()}", file=sys.stderr)
    for path in render_all(args.out):
        print(path)
    return 0


def cmd_images_pull_secret(args: argparse.Namespace) -> int:
    import yaml

    from chexflow.devcluster.push import apply_secret, pull_secret

    secret = pull_secret(args.name, args.namespace, args.registry, args.authfile)
    if not args.apply:
        yaml.safe_dump(secret, sys.stdout, sort_keys=False)
        return 0
    where = apply_secret(secret)
    print(f"Secret {where} of type kubernetes.io/dockerconfigjson applied", file=sys.stderr)
    return 0
