"""MPIJob on real pods vs local horovodrun, and TrainJob vs MPIJob on real pods: the same
`chexflow train` (model, image size, workers, threads per worker, batch, steps, the same
TFRecords) run locally under horovodrun, as an MPIJob and as a Kubeflow Trainer v2 TrainJob on
chexflow's Horovod runtime (both rendered by the kubernetes job backend, the trainer image built
from images/trainer/Dockerfile) on the real node of a local cluster, the three interleaved. Each
side's figure is the images/s of its metrics.json (warm-up steps excluded, summed over ranks);
the ratio MPIJob / local has the goal >= 0.95, TrainJob / MPIJob the goal >= 0.98. The TrainJob
side is a third side of this bench rather than a bench of its own: it shares the cluster, the
namespace, the data volume, the image and the MPIJob runs (each side's runs under the same
load), and the cluster starts once.

Each MPIJob's (TrainJob's) start is timed from its create call to the end of its first
training step, from pod events watched as they happen and the wall-clock times rank 0 writes
into metrics.json (`started_at`, `first_step_began_at`, `first_step_ended_at`; pods share the
host's clock): workers scheduled, their containers running, the launcher running (it is created
once the workers are ready; a TrainJob's "workers" are its `node` pods, the launcher being one
of the nodes under runLauncherAsNode, and JobSet creates the launcher once they are Ready),
rank 0's training code started (mpirun over ssh, Python, imports), TensorFlow, Horovod, model
and input ready, and the first step (graph tracing included). Local runs get the same split
from the horovodrun call on.

The cluster is started here (a control plane with one kwok node, the real node, Trainer and
JobSet) unless `kubeconfig` names a running `chexflow cluster up --real-node --trainer`. Pods
run in a namespace of their own whose annotations send them to the real node, with a
PersistentVolumeClaim bound to a hostPath volume: the bench's data folder, which the local side
reads too. The TrainJobs run on chexflow's runtime created under the namespace's name (its node
pods on the bench's image), deleted afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from chexflow.bench.core import Result, Side, interleave
from chexflow.errors import ChexflowError
from chexflow.jobs.kubernetes import KubernetesBackend
from chexflow.jobs.render import JOB_NAME_LABEL, LAUNCHER_ROLE_LABEL
from chexflow.jobs.spec import JobSpec, Volume
from chexflow.jobs.trainjob import (
    JOBSET_LABEL,
    REPLICATED_JOB_LABEL,
    RUNTIME_PLURAL,
    TRAINJOB_GROUP,
    TRAINJOB_VERSION,
    horovod_runtime,
)
from chexflow.kube import client_from_kubeconfig
from chexflow.train.options import TrainOptions

NAME = "MPIJob on real pods vs local horovodrun"
GOAL = 0.95
POD_SIDE, LOCAL_SIDE = "MPIJob on real pods", "horovodrun locally"
TRAINJOB_NAME, TRAINJOB_GOAL = "TrainJob vs MPIJob on real pods", 0.98
TRAINJOB_SIDE = "TrainJob on real pods"
MOUNT = "/data"
# Two workers and the launcher's 500m fit a 2-core node; the workers get no CPU limit (no CFS
# quota), as the local workers have none: both sides use the threads they are given.
WORKER_CPU_REQUEST = "750m"
WORKER_MEMORY = "3Gi"
JOB_TIMEOUT_SECONDS = 1800
# phases of the time from the MPIJob's creation (or horovodrun's start) to the first step's end
POD_PHASES = ("workers scheduled", "worker containers running", "launcher running",
              "rank 0 started", "TensorFlow, Horovod, model, input", "first step")
LOCAL_PHASES = POD_PHASES[3:]


class RealPodsError(ChexflowError):
    """The cluster, its real node or an MPIJob of the benchmark failed."""


@dataclass(frozen=True)
class Settings:
    """What both sides run."""

    model: str
    image_size: int
    batch: int
    steps: int
    workers: int = 2
    threads: int = 1

    def options(self, data: Path | str, out: Path | str) -> TrainOptions:
        return TrainOptions(data=Path(data), out=Path(out), model=self.model, epochs=1,
                            steps_per_epoch=self.steps, batch_size=self.batch,
                            image_size=self.image_size, weights="none", validation_steps=1,
                            threads=self.threads)


@dataclass
class Target:
    """Where the pods run: an API client, the real node's state folder, a namespace whose PVC
    `data` is the host folder `shared`."""

    api: object
    state_dir: Path
    namespace: str
    shared: Path
    image: str
    setup: dict


def phases(timeline: dict[str, float], names: tuple[str, ...]) -> dict[str, float]:
    """Durations between consecutive moments of `timeline` (seconds since the start), one per
    name; the first is measured from 0."""
    moments = [timeline[n] for n in names]
    return {n: round(m - p, 3) for n, m, p in zip(names, moments, [0.0, *moments], strict=False)}


def run_timeline(metrics: dict, start: float) -> dict[str, float]:
    """Seconds from `start` (Unix time) to rank 0's start, first step's start and end."""
    keys = {"rank 0 started": "started_at", "TensorFlow, Horovod, model, input":
            "first_step_began_at", "first step": "first_step_ended_at"}
    missing = [k for k in keys.values() if metrics.get(k) is None]
    if missing:
        raise RealPodsError(f"metrics.json lacks {', '.join(missing)}: a worker of another "
                            "chexflow version (rebuild the trainer image)")
    return {name: metrics[key] - start for name, key in keys.items()}


@dataclass(frozen=True)
class Kind:
    """How the bench finds a job kind's pods: the label naming the job, the label naming the
    pod's role and the values of it for the launcher and the workers."""

    job_kind: str
    name_label: str
    role_label: str
    launcher: str
    worker: str


MPIJOB = Kind("mpijob", JOB_NAME_LABEL, LAUNCHER_ROLE_LABEL, "launcher", "worker")
TRAINJOB = Kind("trainjob", JOBSET_LABEL, REPLICATED_JOB_LABEL, "launcher", "node")


class PodWatch(threading.Thread):
    """When each pod of an MPIJob (TrainJob) was first seen scheduled and with all containers
    running (Unix times, as the API reported them: the kubelet notices a started container
    within its one-second relist)."""

    def __init__(self, api, namespace: str, job: str, kind: Kind = MPIJOB):
        from kubernetes import client, watch

        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.kind = kind
        self.namespace, self.selector = namespace, f"{kind.name_label}={job}"
        self.watch = watch.Watch()
        self.seen: dict[str, dict] = {}
        self.error: BaseException | None = None
        # from this version on: no event is missed however late the stream connects
        self.version = self.core.list_namespaced_pod(
            namespace, label_selector=self.selector).metadata.resource_version

    def run(self) -> None:
        try:
            for event in self.watch.stream(self.core.list_namespaced_pod, self.namespace,
                                           label_selector=self.selector,
                                           resource_version=self.version,
                                           timeout_seconds=JOB_TIMEOUT_SECONDS):
                self.note(event["object"], time.time())
        except Exception as e:  # noqa: BLE001 - reported by times()
            self.error = e

    def note(self, pod, now: float) -> None:
        record = self.seen.setdefault(pod.metadata.name, {
            "role": (pod.metadata.labels or {}).get(self.kind.role_label, "")})
        if pod.spec.node_name:
            record.setdefault("scheduled", now)
        statuses = (pod.status.container_statuses if pod.status else None) or []
        if statuses and all(s.state and s.state.running for s in statuses):
            record.setdefault("running", now)

    def stop(self) -> None:
        self.watch.stop()
        self.join(timeout=10)

    def times(self, start: float) -> dict[str, float]:
        """Seconds from `start` until every worker was scheduled, every worker running, the
        launcher running."""
        workers = [r for r in self.seen.values() if r["role"] == self.kind.worker]
        launchers = [r for r in self.seen.values() if r["role"] == self.kind.launcher]
        try:
            return {"workers scheduled": max(r["scheduled"] for r in workers) - start,
                    "worker containers running": max(r["running"] for r in workers) - start,
                    "launcher running": min(r["running"] for r in launchers) - start}
        except (KeyError, ValueError):
            raise RealPodsError(f"pod events incomplete ({self.error or 'no error'}): "
                                f"{self.seen}") from None


class BenchBackend(KubernetesBackend):
    """The kubernetes backend, noting when the job is created and leaving the workers' CPU
    without a limit (see WORKER_CPU_REQUEST; a TrainJob's resourcesPerNode are every node's,
    the launcher's too)."""

    created_at = 0.0

    def render(self, spec: JobSpec) -> dict:
        obj = super().render(spec)
        if obj["kind"] == "TrainJob":
            obj["spec"]["trainer"]["resourcesPerNode"]["limits"].pop("cpu", None)
            return obj
        worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        worker["resources"]["limits"].pop("cpu", None)
        return obj

    def create(self, obj: dict) -> None:
        self.created_at = time.time()
        super().create(obj)


def pods_run(target: Target, settings: Settings, index: int,
             kind: Kind = MPIJOB) -> tuple[dict, dict]:
    """One MPIJob (TrainJob, on the runtime named by the namespace) to completion: its
    metrics.json and its timeline (seconds since creation)."""
    from kubernetes import client

    name = f"bench-{kind.job_kind[0]}{index}-{uuid.uuid4().hex[:4]}"
    run_dir = target.shared / "runs" / name
    options = settings.options(f"{MOUNT}/tfrecords", f"{MOUNT}/runs/{name}")
    spec = JobSpec(
        name=name, command=["chexflow", "train", "--launcher", "none", *options.to_argv()],
        workers=settings.workers, horovod=True, gpus_per_worker=0, cpu=WORKER_CPU_REQUEST,
        memory=WORKER_MEMORY, volumes=[Volume("data", MOUNT)],
        timeout_seconds=JOB_TIMEOUT_SECONDS)
    stream = io.StringIO()
    backend = BenchBackend(namespace=target.namespace, api_client=target.api, image=target.image,
                           poll_seconds=2, delete_policy="always", stream=stream,
                           job_kind=kind.job_kind, runtime=target.namespace)
    pods = PodWatch(target.api, target.namespace, name, kind)
    pods.start()
    try:
        backend.run(spec)  # deletes the job however it ends
    except ChexflowError as e:
        pods.stop()
        attempts = "".join(f"\n--- attempt {key} ---\n{tail[-1500:]}"
                           for key, tail in backend.failed_attempts.items())
        raise RealPodsError(f"{e}\n--- the job backend's log ---\n{stream.getvalue()[-3000:]}"
                            f"{attempts}") from None
    except BaseException:
        pods.stop()
        raise
    wait_pods_gone(client.CoreV1Api(target.api), target.namespace, name, kind)
    pods.stop()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    return metrics, {**pods.times(backend.created_at),
                     **run_timeline(metrics, backend.created_at)}


def local_run(shared: Path, settings: Settings, index: int) -> tuple[dict, dict]:
    """One `chexflow train --workers N` (horovodrun with the default allreduce: MPI where
    OpenMPI is): its metrics.json and its timeline (seconds since the command started)."""
    out = shared / "runs" / f"local-{index}-{uuid.uuid4().hex[:4]}"
    cmd = [sys.executable, "-m", "chexflow.cli", "train", "--workers", str(settings.workers),
           *settings.options(shared / "tfrecords", out).to_argv()]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RealPodsError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return metrics, run_timeline(metrics, start)


def wait_pods_gone(core, namespace: str, job: str, kind: Kind = MPIJOB,
                    timeout: float = 120) -> None:
    """Until the job's pods are deleted (none may take CPU from the next local run)."""
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace, label_selector=f"{kind.name_label}={job}").items:
        if time.monotonic() > deadline:
            raise RealPodsError(f"pods of {kind.job_kind} {namespace}/{job} still there "
                                f"{timeout:.0f} s after it was deleted")
        time.sleep(0.5)


@contextlib.contextmanager
def cluster(work: Path, kubeconfig: Path | None, katib: bool = False,
            trainer: bool = False) -> Iterator[tuple[object, Path, dict]]:
    """(API client, state folder, what it took): the running cluster of `kubeconfig` (with a
    real node, and Katib if `katib`, Trainer if `trainer`), else one started here (stopped
    afterwards)."""
    from chexflow.devcluster import addons
    from chexflow.devcluster.controlplane import LocalCluster

    wanted = ["real-node", *(["katib"] if katib else []), *(["trainer"] if trainer else [])]
    if kubeconfig is not None:
        state_dir = Path(kubeconfig).resolve().parent
        try:
            running = LocalCluster.attach(state_dir)
        except ChexflowError:
            running = None
        flag, what = ("--katib", "Katib") if katib else ("--real-node", "a real node")
        if trainer:
            flag, what = f"{flag} --trainer", f"{what} and Trainer"
        if running is None or not running.running() or not all(map(running.has, wanted)):
            raise RealPodsError(f"--kubeconfig {kubeconfig}: not the kubeconfig of a running "
                                f"`chexflow cluster up {flag}` (its cluster.json, beside it, "
                                f"must record {what})")
        yield client_from_kubeconfig(kubeconfig), state_dir, {
            "cluster": f"running, from {kubeconfig}"}
        return
    start = time.monotonic()
    local = LocalCluster(work / "cluster", nodes=1, die_with_parent=True,
                         addons=addons.named(wanted))
    local.start(timeout=600 if katib else 300)
    setup = {"cluster": "started by the bench",
             "cluster_start_s": round(time.monotonic() - start, 1)}
    try:
        yield local.api_client(), local.state_dir, setup
    finally:
        local.stop()


@contextlib.contextmanager
def runtime(api, name: str, image: str) -> Iterator[str]:
    """chexflow's ClusterTrainingRuntime under `name`, its node pods on `image`; deleted
    afterwards."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom = client.CustomObjectsApi(api)
    body = horovod_runtime(image=image)
    body["metadata"]["name"] = name
    custom.create_cluster_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL, body)
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, RUNTIME_PLURAL,
                                                name)


@contextlib.contextmanager
def namespace(api, shared: Path) -> Iterator[str]:
    """A namespace sending its pods to the real node, with PVC `data` bound to a hostPath
    volume of `shared`; deleted afterwards with the PersistentVolume."""
    from kubernetes import client

    from chexflow.devcluster.realnode import namespace_annotations

    core = client.CoreV1Api(api)
    name = f"bench-real-pods-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name, "annotations": namespace_annotations()}})
    pv = f"{name}-data"
    try:
        core.create_persistent_volume({
            "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                     "storageClassName": "",
                     "hostPath": {"path": str(shared), "type": "Directory"},
                     "claimRef": {"namespace": name, "name": "data"}}})
        core.create_namespaced_persistent_volume_claim(name, {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}})
        yield name
    finally:
        _delete_volume_and_namespace(core, name, pv)


def _delete_volume_and_namespace(core, namespace: str, pv: str, timeout: float = 60) -> None:
    """Delete the claim, the namespace and the volume, and wait until the volume is gone (its
    protection finalizer holds it while the claim exists)."""
    from kubernetes.client.rest import ApiException

    for delete, args in ((core.delete_namespaced_persistent_volume_claim, ("data", namespace)),
                         (core.delete_namespace, (namespace,)),
                         (core.delete_persistent_volume, (pv,))):
        try:
            delete(*args)
        except ApiException as e:
            if e.status != 404:
                raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_persistent_volume(pv)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        time.sleep(0.5)
    raise RealPodsError(f"PersistentVolume {pv} not deleted {timeout:.0f} s after its claim")


def load_trainer_image(state_dir: Path) -> tuple[str, dict]:
    """The trainer image (built or cached) in the real node's containerd; its reference."""
    from chexflow.devcluster.images import build_image
    from chexflow.devcluster.realnode import RealNode

    image = build_image("trainer")
    node = RealNode(state_dir)
    start = time.monotonic()
    loaded = node.has_image(image.ref)
    if not loaded:
        node.import_image(image.archive)
    return image.ref, {"image": image.ref, "image_build_s": round(image.seconds, 1),
                       "image_cached": image.cached,
                       "image_import_s": 0.0 if loaded else round(time.monotonic() - start, 1)}


def shared_folder(work: Path, data: Path) -> Path:
    """The host folder behind the pods' PVC: a copy of the TFRecords and the run folders
    (writable by the image's non-root user)."""
    shared = (work / "real-pods").resolve()
    shutil.rmtree(shared / "runs", ignore_errors=True)
    if not (shared / "tfrecords" / "manifest.json").exists():
        shutil.rmtree(shared / "tfrecords", ignore_errors=True)
        shutil.copytree(data, shared / "tfrecords")
    (shared / "runs").mkdir(parents=True)
    for folder in (shared, shared / "runs"):
        folder.chmod(0o777)
    return shared


def run(work: Path, data: Path, settings: Settings, repeats: int,
        kubeconfig: Path | None = None) -> list[Result]:
    """The three sides interleaved `repeats` times each (local, MPIJob, TrainJob; the order
    reversed every other round): the Results MPIJob vs local and TrainJob vs MPIJob, whose
    notes hold the settings, each run's start-up timeline and phases, the controllers and the
    cluster setup."""
    shared = shared_folder(work, data)
    load_start = [round(x, 2) for x in os.getloadavg()]
    sides = (POD_SIDE, LOCAL_SIDE, TRAINJOB_SIDE)
    timelines: dict[str, list[dict]] = {name: [] for name in sides}
    controllers: dict[str, set[str]] = {name: set() for name in sides}
    loads: list[tuple[str, float]] = []  # 1-minute load average as each run starts

    def side(name: str, fn) -> Side:
        def one() -> float:
            loads.append((name, round(os.getloadavg()[0], 2)))
            metrics, timeline = fn(len(timelines[name]))
            timelines[name].append(timeline)
            controllers[name].add(str((metrics.get("horovod") or {}).get("controller")))
            return float(metrics["images_per_sec"])
        return Side(name, one)

    with cluster(work, kubeconfig, trainer=True) as (api, state_dir, setup):
        image, image_setup = load_trainer_image(state_dir)
        with namespace(api, shared) as ns, runtime(api, ns, image):
            target = Target(api, state_dir, ns, shared, image, {**setup, **image_setup})
            local = side(LOCAL_SIDE, lambda i: local_run(shared, settings, i))
            pods = side(POD_SIDE, lambda i: pods_run(target, settings, i))
            trainjobs = side(TRAINJOB_SIDE, lambda i: pods_run(target, settings, i, TRAINJOB))
            interleave(NAME, [local, pods, trainjobs], repeats)
    notes = {
        "model": settings.model, "image_size": settings.image_size,
        "batch_per_worker": settings.batch, "steps": settings.steps,
        "workers": settings.workers, "threads_per_worker": settings.threads,
        "worker_cpu_request": WORKER_CPU_REQUEST, "worker_cpu_limit": None,
        "worker_memory": WORKER_MEMORY, "load_average_start": load_start,
        "load_average_per_run": loads,
        "controllers": {k: sorted(v) for k, v in controllers.items()},
        **target.setup,
        "startup": {name: [{"to_first_step_s": round(t["first step"], 3),
                            "phases": phases(t, LOCAL_PHASES if name == LOCAL_SIDE
                                             else POD_PHASES)} for t in ts]
                    for name, ts in timelines.items()},
    }

    def only(*names: str) -> dict:
        return {**notes, "controllers": {n: notes["controllers"][n] for n in names},
                "startup": {n: notes["startup"][n] for n in names}}

    return [Result(NAME, "images/s", pods.name, local.name, pods.samples, local.samples, GOAL,
                   only(POD_SIDE, LOCAL_SIDE), figure_name="ratio pods/local"),
            Result(TRAINJOB_NAME, "images/s", trainjobs.name, pods.name, trainjobs.samples,
                   pods.samples, TRAINJOB_GOAL, only(TRAINJOB_SIDE, POD_SIDE),
                   figure_name="ratio TrainJob/MPIJob")]


def markdown(result: dict) -> str:
    """The start-up section: each run's phases, then the medians."""
    startup = result["notes"]["startup"]
    head = ["side", *POD_PHASES, "to first step"]
    lines = [f"\n### {result['name']}: start-up (s)\n",
             f"From the job's create call (pods; a TrainJob's workers are its `node` pods, its "
             f"launcher a node too) or the horovodrun call (local) to the end of "
             f"the first training step; workers {result['notes']['workers']}, controllers "
             f"{result['notes']['controllers']}, load average "
             f"{result['notes']['load_average_start'][0]:g} at the start.\n",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for side, runs in startup.items():
        for i, run_ in enumerate(runs, 1):
            cells = [f"{run_['phases'][p]:.2f}" if p in run_["phases"] else "–"
                     for p in POD_PHASES]
            lines.append(f"| {side} #{i} | " + " | ".join(cells)
                         + f" | {run_['to_first_step_s']:.2f} |")
        if runs:
            medians = [f"{statistics.median(r['phases'][p] for r in runs):.2f}"
                       if p in runs[0]["phases"] else "–" for p in POD_PHASES]
            to_first = statistics.median(r["to_first_step_s"] for r in runs)
            lines.append(f"| **{side} median** | " + " | ".join(medians)
                         + f" | **{to_first:.2f}** |")
    return "\n".join(lines) + "\n"


def plot_startup(result: dict, path: Path) -> None:
    """Each run's start-up as a stacked horizontal bar of its phases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(f"{side} #{i}", r["phases"]) for side, rs in result["notes"]["startup"].items()
            for i, r in enumerate(rs, 1)]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(runs) + 1.6))
    colors = plt.get_cmap("tab10").colors
    for y, (_, ph) in enumerate(runs):
        left = 0.0
        for k, name in enumerate(POD_PHASES):
            if name in ph:
                ax.barh(y, ph[name], left=left, color=colors[k], label=name)
                left += ph[name]
    ax.set_yticks(range(len(runs)), [label for label, _ in runs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the end of the first training step")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one entry per phase
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    ax.set_title(f"{result['name']}: start-up", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

