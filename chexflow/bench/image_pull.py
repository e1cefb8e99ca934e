"""The trainer image pulled from the cluster's registry vs side-loaded into the node: `chexflow
bench --only image-pull`.

A cluster of its own (a kwok node, a real node and the `registry` add-on) gets the trainer
image (built or cached) both ways, and each way is timed from the creation of an MPIJob (two
workers, the trainer image, a launcher running `true` through mpirun) to all its workers'
containers running, as pod events report them:

    registry, first pull   pushed (by digest), the node's copy removed: the kubelet pulls it
                           with the namespace's pull Secret and containerd unpacks it
    registry, cached       the same again: the image is on the node
    side-loaded, first     `ctr images import` of the archive (timed), then the MPIJob
    side-loaded, cached    the same again: the image is on the node

and the push itself: `chexflow images push trainer` to the registry emptied first (every layer
compressed and sent; a new repository alone is not enough, podman mounts the layers the
registry has under another), and again (podman finds every layer there). Every image but
pause is removed from the node before each first run; the sides interleave, `repeats` rounds.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from chexflow.bench.core import Result, cpu_model
from chexflow.bench.real_pods import MPIJOB, BenchBackend, PodWatch, RealPodsError, wait_pods_gone
from chexflow.jobs.spec import ClusterOptions, JobSpec

SIDES = ("registry, first pull", "registry, cached", "side-loaded, first", "side-loaded, cached")
PUSHES = ("push, empty registry", "push again")
JOB_TIMEOUT_SECONDS = 900
SECRET = "registry-login"
# a job's first start on a node may take at most this much longer pulling from the cluster's
# registry than from an image loaded by hand (its import counted)
GOAL_EXTRA_SECONDS = 60.0
# with the image on the node, where it came from should not matter
GOAL_CACHED_EXTRA_SECONDS = 5.0


def _remove_images(node, keep: set[str]) -> None:
    """Every image of the node but `keep` (the names it had at start: pause) gone, with its
    content and snapshots (containerd's garbage collection, synchronously): a pull of any name
    of the trainer then fetches every layer again. The exited containers of the deleted pods go
    first (the kubelet removes them only on its next collection): their snapshots would keep
    the layers, and containerd skips fetching a layer whose snapshot exists."""
    running = {line.split()[0] for line in
               node.ctr("tasks", "list").stdout.splitlines()[1:] if "RUNNING" in line}
    exited = set(node.ctr("containers", "list", "--quiet").stdout.split()) - running
    if exited:
        node.ctr("containers", "delete", *sorted(exited), check=False)
    names = set(node.ctr("images", "list", "--quiet").stdout.split()) - keep
    if names:
        node.ctr("images", "remove", "--sync", *sorted(names))


def _empty_storage(storage: Path) -> None:
    """The registry's blobs and repositories gone (it keeps no cache of them in this
    configuration): the next push sends every layer."""
    shutil.rmtree(storage / "docker", ignore_errors=True)


def _start_seconds(api, namespace: str, image: str, index: int) -> float:
    """Seconds from the MPIJob's creation to both workers' containers running."""
    from kubernetes import client

    name = f"pull-{index}-{uuid.uuid4().hex[:4]}"
    spec = JobSpec(name=name, command=["true"], workers=2, horovod=True, gpus_per_worker=0,
                   cpu="250m", memory="1Gi", timeout_seconds=JOB_TIMEOUT_SECONDS)
    stream = io.StringIO()
    backend = BenchBackend(namespace=namespace, api_client=api, image=image, poll_seconds=1,
                           delete_policy="always", stream=stream, job_kind="mpijob",
                           options=ClusterOptions(image_pull_secrets=[SECRET]))
    pods = PodWatch(api, namespace, name, MPIJOB)
    pods.start()
    try:
        backend.run(spec)
    except Exception as e:
        raise RealPodsError(f"{e}\n{stream.getvalue()[-2000:]}") from None
    finally:
        pods.stop()
    wait_pods_gone(client.CoreV1Api(api), namespace, name)
    return pods.times(backend.created_at)["worker containers running"]


def _push(registry, ca: Path, repository: str, refs_file: Path) -> tuple[float, str]:
    """`chexflow images push trainer` to ADDRESS/`repository`: (seconds, the reference)."""
    env = {**os.environ, "REGISTRY_AUTH_FILE": str(registry.auth_file),
           "CHEXFLOW_IMAGES_FILE": str(refs_file)}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "chexflow.cli", "images", "push", "trainer",
                          "--registry", f"{registry.address}/{repository}", "--ca-file", str(ca)],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RealPodsError(f"push to {registry.address}/{repository}: {out.stderr.strip()}")
    return time.monotonic() - start, out.stdout.strip()


def run(work: Path, repeats: int) -> list[Result]:
    """The sides interleaved `repeats` times; a Result per way of getting the image, each
    with every run's seconds."""
    from kubernetes import client

    from chexflow.devcluster import addons
    from chexflow.devcluster.controlplane import LocalCluster
    from chexflow.devcluster.images import build_image
    from chexflow.devcluster.realnode import RealNode, drop_images, namespace_annotations
    from chexflow.devcluster.registry import ClusterRegistry

    image = build_image("trainer")
    storage = work / "registry-storage"  # its own: the first push sends every layer
    shutil.rmtree(storage, ignore_errors=True)
    cluster = LocalCluster(work / "cluster", nodes=1, die_with_parent=True,
                           addons=addons.resolve([ClusterRegistry(storage=storage),
                                                  *addons.named(["real-node"])]))
    started = time.monotonic()
    cluster.start(timeout=300)
    setup = {"cluster_start_s": round(time.monotonic() - started, 1), "image": image.ref,
             "image_archive_bytes": image.archive.stat().st_size}
    seconds: dict[str, list[float]] = {name: [] for name in (*SIDES, *PUSHES, "import")}
    try:
        api = cluster.api_client()
        core = client.CoreV1Api(api)
        registry = cluster.addon("registry").at(cluster)
        node = RealNode(cluster.state_dir)
        namespace = f"bench-pull-{uuid.uuid4().hex[:5]}"
        core.create_namespace({"metadata": {"name": namespace,
                                            "annotations": namespace_annotations()}})
        secret_env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
                      "REGISTRY_AUTH_FILE": str(registry.auth_file)}
        subprocess.run([sys.executable, "-m", "chexflow.cli", "images", "pull-secret", "--name",
                        SECRET, "--namespace", namespace, "--registry", registry.address,
                        "--apply"], env=secret_env, check=True, capture_output=True, timeout=60)
        keep = set(node.ctr("images", "list", "--quiet").stdout.split())
        for index in range(repeats):
            _empty_storage(storage)
            repository = f"bench-{index}-{uuid.uuid4().hex[:4]}"
            took, pushed = _push(registry, cluster.pki.ca, repository, work / "images.json")
            seconds["push, empty registry"].append(took)
            seconds["push again"].append(_push(registry, cluster.pki.ca, repository,
                                               work / "images.json")[0])
            _remove_images(node, keep)
            seconds["registry, first pull"].append(_start_seconds(api, namespace, pushed, index))
            seconds["registry, cached"].append(_start_seconds(api, namespace, pushed, index))
            _remove_images(node, keep)
            started = time.monotonic()
            node.import_image(image.archive)
            imported = time.monotonic() - started
            seconds["import"].append(imported)
            seconds["side-loaded, first"].append(
                imported + _start_seconds(api, namespace, image.ref, index))
            seconds["side-loaded, cached"].append(_start_seconds(api, namespace, image.ref,
                                                                 index))
        core.delete_namespace(namespace)
    finally:
        cluster.stop()
        drop_images(cluster.state_dir)
        shutil.rmtree(storage, ignore_errors=True)
    return comparisons(seconds, repeats, setup)


def comparisons(seconds: dict[str, list[float]], repeats: int, setup: dict) -> list[Result]:
    """Three comparisons, each side's seconds per run: a job's first start on a node with the
    image pulled against side-loaded (its import counted), the same with the image on the node,
    and a push again against the first push to a repository. Every side's runs in the notes."""
    notes = {"runs": {name: [round(s, 1) for s in values] for name, values in seconds.items()},
             "repeats": repeats, **setup, "cpu": cpu_model(),
             "load_average": [round(x, 2) for x in os.getloadavg()]}
    return [Result(name, "s", a, b, seconds[a], seconds[b], goal, dict(notes), goal_is_max=True,
                   figure_name="seconds more (A - B)")
            for name, a, b, goal in (
                ("image pull: first start on a node", "registry, first pull",
                 "side-loaded, first", GOAL_EXTRA_SECONDS),
                ("image pull: image on the node", "registry, cached", "side-loaded, cached",
                 GOAL_CACHED_EXTRA_SECONDS),
                ("image push: again vs first", "push again", "push, empty registry", 0.0))]


def markdown(result: dict) -> str:
    """Every side's runs (seconds; the import is the side-loaded first start's first part)."""
    runs = result["notes"]["runs"]
    rows = ["image pull and push: every side's runs (s)", "", "| side | runs |", "|---|---|"]
    rows += [f"| {name} | {', '.join(map(str, values))} |" for name, values in runs.items()]
    return "\n".join(rows)
