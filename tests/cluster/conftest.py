"""Fixtures for tests against the development Kubernetes cluster (marker `cluster`).

The clusters and images are package fixtures: started by the first test here that needs them,
stopped after the last test in tests/cluster, so they do not run idle beside the local tests.

`k8s_cluster`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
(4 nodes x 8 nvidia.com/gpu) and mpi-operator, with the MPIJob and Experiment CRDs, and a real
node (containerd, kubelet, CoreDNS; tainted, so only pods that ask for it land there). The
binaries come from ~/.cache/chexflow/k8s/, built by build/build.sh and build/build-node.sh on
first use (cold: about 6 + 4 minutes on 2 idle cores). `k8s_namespace`: a fresh namespace per
test, deleted afterwards.
`KUBECONFIG` points at the cluster's admin kubeconfig while it runs.
`katib_cluster`: a second cluster with Katib and kube-proxy on its real node (one such
cluster per machine: it waits for another run's to stop); `katib_namespace`: a fresh namespace
there with Katib's metrics-collector label whose pods go to the real node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chexflow.devcluster import addons, binaries
from chexflow.devcluster.controlplane import LocalCluster
from chexflow.envs import REPO_ROOT

NODES = 4
GPUS_PER_NODE = 8


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Among the tests here: those marked before_katib_cluster first (the Katib cluster holds
    the machine's one kube-proxy until the last test here), those on the Katib cluster last, so
    it starts after the other cluster tests (k8s_cluster up: its KUBECONFIG set) instead of
    idling beside their real-pod trainings; each keeps its place in the collection otherwise."""
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if here in Path(item.path).parents]

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("before_katib_cluster"):
            return 0
        return 2 if "katib_cluster" in item.fixturenames else 1

    for place, item in zip(places, sorted((items[i] for i in places), key=rank), strict=True):
        items[place] = item


@pytest.fixture(scope="package")
def k8s_cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    go_path = "/usr/local/go/bin:" + os.environ.get("PATH", "")
    if binaries.missing(binaries.cache_dir()) and shutil.which("go", path=go_path) is None:
        pytest.skip("no Kubernetes binaries cached and no Go toolchain to build them")
    cluster = LocalCluster(tmp_path_factory.mktemp("k8s"), nodes=NODES,
                           gpus_per_node=GPUS_PER_NODE, die_with_parent=True,
                           addons=addons.named(["real-node", "registry"]))
    cluster.start(timeout=240)
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    try:
        yield cluster
    finally:
        cluster.stop()
        drop_node_images(cluster)
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


@pytest.fixture(scope="package")
def k8s_api(k8s_cluster: LocalCluster):
    """kubernetes.client.ApiClient as the cluster admin."""
    return k8s_cluster.api_client()


@pytest.fixture
def k8s_namespace(k8s_api, request) -> Iterator[str]:
    """A namespace of its own for one test (deleted afterwards, with everything in it)."""
    from kubernetes import client

    name = f"t-{request.node.name.lower().replace('_', '-')[:40].strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(c for c in name if c.isalnum() or c == "-")
    core = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="package")
def trainer_image(k8s_cluster) -> str:
    """images/trainer/Dockerfile built on the Debian base (cached by content in
    ~/.cache/chexflow/images) and loaded into the real node's containerd."""
    from chexflow.devcluster.images import build_image

    return load_image(k8s_cluster.state_dir, build_image("trainer"))


@pytest.fixture(scope="package")
def pushed_trainer(k8s_cluster, trainer_image, tmp_path_factory) -> tuple[dict, str]:
    """The trainer (built for the session: trainer_image) pushed to the cluster's registry:
    (the environment naming the references file the push wrote, the pushed reference)."""
    registry = k8s_cluster.addon("registry").at(k8s_cluster)
    env = {**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig),
           "REGISTRY_AUTH_FILE": str(registry.auth_file),
           "CHEXFLOW_IMAGES_FILE": str(tmp_path_factory.mktemp("pushed") / "images.json")}
    out = subprocess.run(
        [sys.executable, "-m", "chexflow.cli", "images", "push", "trainer", "--registry",
         f"{registry.address}/chexflow", "--ca-file", str(k8s_cluster.pki.ca)],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    reference = out.stdout.strip()
    assert reference.startswith(f"{registry.address}/chexflow/trainer:") and "@sha256:" in reference
    return env, reference


@pytest.fixture(scope="package")
def trainer_cluster(k8s_cluster, trainer_image):
    """The session cluster with Trainer and JobSet, and chexflow's runtime whose pods use the
    locally built trainer image."""
    from chexflow.devcluster.trainer import Trainer

    if not k8s_cluster.has("trainer"):
        start = time.monotonic()
        k8s_cluster.add(Trainer(), timeout=180)
        print(f"Trainer and JobSet up in {time.monotonic() - start:.1f} s", file=sys.stderr)
    apply_runtime(k8s_cluster.api_client(), trainer_image)
    return k8s_cluster


def apply_runtime(api, image: str) -> None:
    """chexflow's runtime whose pods use `image`, created or (on a resumed cluster) patched."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from chexflow.jobs.trainjob import (
        RUNTIME_NAME,
        RUNTIME_PLURAL,
        TRAINJOB_GROUP,
        TRAINJOB_VERSION,
        horovod_runtime,
    )

    custom, body = client.CustomObjectsApi(api), horovod_runtime(image=image)
    try:
        custom.create_cluster_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL,
                                            body)
    except ApiException as e:
        if e.status != 409:
            raise
        custom.patch_cluster_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL,
                                           RUNTIME_NAME, {"spec": body["spec"]})


def load_image(state_dir: Path, image) -> str:
    """Import a built image (images.BuiltImage) into a real node's containerd unless it is
    there already (its reference names its content); returns the reference. An earlier test
    (the real-pods bench) may have loaded it: importing the 3 GB trainer archive again took
    46 s on an idle machine and 189 s under load for nothing."""
    from chexflow.devcluster.realnode import RealNode

    node = RealNode(state_dir)
    if not node.has_image(image.ref):
        node.import_image(image.archive)
    return image.ref


@pytest.fixture
def real_namespace(k8s_api, k8s_namespace, tmp_path) -> Iterator[tuple[str, Path]]:
    """A namespace whose pods all run on the real node (namespace annotations), with a
    PersistentVolumeClaim `data` bound to a hostPath volume of a fresh host folder (returned)."""
    from kubernetes import client

    from chexflow.devcluster.realnode import namespace_annotations

    core = client.CoreV1Api(k8s_api)
    core.patch_namespace(k8s_namespace, {"metadata": {"annotations": namespace_annotations()}})
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the image's user (uid 1000) writes here
    pv = hostpath_claim(core, k8s_namespace, "data", data)
    yield k8s_namespace, data
    core.delete_persistent_volume(pv)


def hostpath_claim(core, namespace: str, claim: str, folder: Path) -> str:
    """PersistentVolumeClaim `claim` in `namespace` bound to a hostPath PersistentVolume of
    `folder` (ReadWriteMany); returns the volume's name (delete it after the namespace)."""
    pv = f"{namespace}-{claim}"
    core.create_persistent_volume({
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "storageClassName": "", "hostPath": {"path": str(folder), "type": "Directory"},
                 "claimRef": {"namespace": namespace, "name": claim}}})
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    return pv


def generated_tfrecords(root: Path, images: int = 64, size: int = 64) -> Path:
    """`images` generated X-rays as `chexflow preprocess` writes them at `size` px, in
    root/tfrecords (returned): every class in at least 30% of the images and a large
    validation split (50/40/10), so val_auroc is defined after a few steps."""
    for cmd in (["data", "synth", "--out", str(root / "raw"), "--images", str(images), "--size",
                 "64", "--min-prevalence", "0.3"],
                ["preprocess", "--csv", str(root / "raw" / "Data_Entry_2017.csv"), "--images",
                 str(root / "raw" / "images"), "--out", str(root / "tfrecords"),
                 "--image-size", str(size), "--split", "50/40/10"]):
        subprocess.run([sys.executable, "-m", "chexflow.cli", *cmd], check=True, cwd=REPO_ROOT,
                       capture_output=True)
    return root / "tfrecords"


def katib_data_claim(core, namespace: str, shared: Path) -> tuple[Path, str]:
    """PVC chexflow-data (the trial templates' claim) in `namespace` on folder `shared`, holding
    160 generated X-rays at 32 px in tfrecords/ (80 to train: one step of 32 x 2 workers) and
    runs/katib/ writable by the image's user; returns the folder and the volume's name."""
    (shared / "runs" / "katib").mkdir(parents=True)
    for folder in (shared, shared / "runs", shared / "runs" / "katib"):
        folder.chmod(0o777)  # the image's user writes the trials' run folders
    generated_tfrecords(shared, images=160, size=32)
    return shared, hostpath_claim(core, namespace, "chexflow-data", shared)


@pytest.fixture(scope="package")
def katib_cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    """A second cluster with Katib (and kube-proxy) on its real node; kube-proxy runs for one
    cluster per machine, so it first waits (up to 15 min) for another run's to stop."""
    from chexflow.devcluster import kubeproxy

    deadline = time.monotonic() + 900
    while kubeproxy.holder() and time.monotonic() < deadline:
        time.sleep(5)
    cluster = LocalCluster(tmp_path_factory.mktemp("katib"), nodes=1, gpus_per_node=0,
                           die_with_parent=True, addons=addons.named(["katib"]))
    cluster.start(timeout=600)
    try:
        yield cluster
    finally:
        cluster.stop()
        drop_node_images(cluster)


def drop_node_images(cluster: LocalCluster) -> None:
    """After a stop: the real nodes' images, as `chexflow cluster down` removes them."""
    from chexflow.devcluster.realnode import drop_images

    drop_images(cluster.state_dir)


@pytest.fixture
def katib_namespace(katib_cluster, request) -> Iterator[str]:
    """A fresh namespace of the Katib cluster: its pods go to the real node and Katib injects
    its metrics collector into trial pods there."""
    from kubernetes import client

    from chexflow.devcluster.katib import INJECTION_LABEL
    from chexflow.devcluster.realnode import namespace_annotations

    name = f"k-{request.node.name.lower().replace('_', '-')[:40].strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(c for c in name if c.isalnum() or c == "-")
    client.CoreV1Api(katib_cluster.api_client()).create_namespace(
        {"metadata": {"name": name, "labels": INJECTION_LABEL,
                      "annotations": namespace_annotations()}})
    yield name
    # a client of now: a test that stopped and started the cluster may have moved its apiserver
    # (another cluster took its /24 or port meanwhile), and the kubeconfig says where it is
    client.CoreV1Api(katib_cluster.api_client()).delete_namespace(name)


@pytest.fixture(scope="package")
def katib_base_image(katib_cluster) -> str:
    """The Debian base image, loaded into the Katib cluster's real node."""
    from chexflow.devcluster.images import base_archive

    return load_image(katib_cluster.state_dir, base_archive())


def _katib_image(katib_cluster, name: str) -> str:
    from chexflow.devcluster.images import build_image

    return load_image(katib_cluster.state_dir, build_image(name))


@pytest.fixture(scope="package")
def katib_trainer_image(katib_cluster) -> str:
    """The trainer image (images/trainer/Dockerfile built on the Debian base, cached by
    content), loaded into the Katib cluster's real node."""
    return _katib_image(katib_cluster, "trainer")


@pytest.fixture(scope="package")
def katib_trainer(katib_cluster, katib_trainer_image):
    """The Katib cluster with Trainer and JobSet added (Katib's controller restarted to watch
    TrainJobs) and chexflow's runtime whose pods use the trainer image loaded there."""
    from chexflow.devcluster.trainer import Trainer

    if not katib_cluster.has("trainer"):
        katib_cluster.add(Trainer(), timeout=300)
    apply_runtime(katib_cluster.api_client(), katib_trainer_image)  # the node pods' image
    return katib_cluster


@pytest.fixture(scope="package")
def katib_launcher_image(katib_cluster) -> str:
    """The launcher image (images/launcher/Dockerfile: the control environment), loaded into
    the Katib cluster's real node."""
    return _katib_image(katib_cluster, "launcher")
