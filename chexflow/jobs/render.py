"""Render a JobSpec as a Kubernetes object: an MPIJob (kubeflow.org/v2beta1, mpi-operator v0.8)
for Horovod jobs, a batch/v1 Job for single-process steps.

MPIJob layout: the launcher (no GPU) runs `mpirun -np WORKERS*SLOTS ... COMMAND` and is retried on
failure (restartPolicy OnFailure, runPolicy.backoffLimit); workers run sshd (the operator wires ssh
keys and /etc/mpi/hostfile) and get `nvidia.com/gpu` = the JobSpec's GPUs, with a toleration of
that taint; CPU-only workers get MPI tensor operations and OpenMPI yielding while it waits
(HOROVOD_CPU_OPERATIONS, OMPI_MCA_mpi_yield_when_idle: chexflow.jobs.allreduce). Every container
runs as the images' numeric user (runAsUser, runAsNonRoot: as mpi-operator's examples), and every
pod is annotated `sidecar.istio.io/inject: "false"` (Kubeflow profile namespaces inject Istio, and
a launcher with a sidecar never completes). ClusterOptions add node selector, tolerations, priority
class, image pull secrets and gang scheduling.
The data PVC is mounted in launcher and workers; /dev/shm is a memory emptyDir of `shm_size`.
"""

from __future__ import annotations

import copy
from typing import Any

from chexflow.container_images import launcher_image, trainer_image
from chexflow.jobs.allreduce import cpu_env
from chexflow.jobs.spec import ClusterOptions, JobSpec

MPIJOB_API_VERSION = "kubeflow.org/v2beta1"
MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
CLEAN_POD_POLICIES = ("All", "Running", "None")
LAUNCHER_ROLE_LABEL = "training.kubeflow.org/job-role"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MANAGED_BY = {"app.kubernetes.io/managed-by": "chexflow"}
SHM_VOLUME = "dshm"
GPU_RESOURCE = "nvidia.com/gpu"
# GPU nodes are commonly tainted with their resource (what ExtendedResourceToleration adds).
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# Kueue: the LocalQueue a job is submitted to (ClusterOptions.queue)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_ANNOTATIONS = {"sidecar.istio.io/inject": "false"}
# Launcher attempts after the first (a transient ssh or DNS failure must not end the run);
# a rerun of the training command resumes from its last checkpoint.
LAUNCHER_BACKOFF_LIMIT = 2
# What the launcher asks for: it only runs mpirun.
LAUNCHER_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
# The trainer image runs as user chexflow with sshd on port 2222 (images/trainer/Dockerfile).
SSH_AUTH_MOUNT_PATH = "/home/chexflow/.ssh"
WORKER_COMMAND = ["/usr/sbin/sshd", "-De", "-f", "/home/chexflow/.sshd_config"]
SSH_PORT = 2222  # the trainer image's sshd port (images/trainer/Dockerfile, SSH_PORT)
# A worker is Ready when its sshd accepts connections: with launcherCreationPolicy
# WaitForWorkersReady the launcher's mpirun then never finds a worker that refuses ssh.
WORKER_READINESS = {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 1, "failureThreshold": 1}


def image_for(environment: str) -> str:
    """The image that holds `environment`: trainer (TensorFlow/Horovod) or control (launcher)."""
    return trainer_image() if environment == "trainer" else launcher_image()


def mpirun_args(spec: JobSpec) -> list[str]:
    """mpirun options for Horovod over OpenMPI (as in the Horovod/mpi-operator examples)."""
    args = ["mpirun", "-np", str(spec.processes), "-bind-to", "none"]
    args += ["-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    # Ranks start over ssh and do not inherit the container's environment: forward it.
    forwarded = ("PATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", "NCCL_DEBUG",
                 *sorted({*_allreduce_env(spec), *spec.env}))
    for name in forwarded:
        args += ["-x", name]
    return [*args, *spec.command]


def _allreduce_env(spec: JobSpec) -> dict[str, str]:
    """CPU-only Horovod ranks: MPI tensor operations, OpenMPI yielding while it waits
    (chexflow.jobs.allreduce); GPU ranks keep NCCL, so nothing for them."""
    return cpu_env(spec.gpus_per_worker) if spec.horovod else {}


def container_env(spec: JobSpec) -> list[dict[str, str]]:
    """A job container's environment: chexflow's defaults, then the spec's own."""
    base = {"PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "WARN", "CHEXFLOW_JOB_NAME": spec.name,
            **_allreduce_env(spec)}
    return [{"name": k, "value": str(v)} for k, v in {**base, **spec.env}.items()]


def pod_volumes(spec: JobSpec) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): shared memory and the spec's PVCs."""
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}
    ]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    for i, vol in enumerate(spec.volumes):
        name = f"data-{i}"
        volumes.append(
            {
                "name": name,
                "persistentVolumeClaim": {"claimName": vol.claim, "readOnly": vol.read_only},
            }
        )
        mounts.append({"name": name, "mountPath": vol.mount_path, "readOnly": vol.read_only})
    return volumes, mounts


def container_spec(
    spec: JobSpec, name: str, image: str, command: list[str], resources: dict, mounts: list,
    options: ClusterOptions,
) -> dict[str, Any]:
    """One container of a job's pods: its command, resources, mounts and environment."""
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": container_env(spec),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {"runAsUser": options.run_as_user, "runAsNonRoot": True},
    }
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    return container


def worker_resources(spec: JobSpec) -> dict[str, dict[str, Any]]:
    requests = {"cpu": spec.worker_cpu, "memory": spec.worker_memory}
    limits: dict[str, Any] = dict(requests)
    if spec.gpus_per_worker:
        limits[GPU_RESOURCE] = spec.gpus_per_worker
    return {"requests": requests, "limits": limits}


def job_metadata(spec: JobSpec, namespace: str, options: ClusterOptions) -> dict[str, Any]:
    """A job object's name, namespace and labels (Kueue's queue among them)."""
    labels = {**MANAGED_BY, "chexflow.io/job": spec.name, **spec.labels}
    if options.queue:  # Kueue's webhook suspends the job until its queue admits it
        labels[QUEUE_LABEL] = options.queue
    return {"name": spec.name, "namespace": namespace, "labels": labels}


def pod_template(
    spec: JobSpec, container: dict, volumes: list, role: str, service_account: str | None,
    options: ClusterOptions,
) -> dict[str, Any]:
    """A pod template of `role` around `container`: placement, tolerations, labels."""
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if service_account:
        pod["serviceAccountName"] = service_account
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    gpu = GPU_RESOURCE in container["resources"]["limits"]
    tolerations = [*([GPU_TOLERATION] if gpu else []), *options.tolerations]
    if tolerations:
        pod["tolerations"] = [dict(t) for t in tolerations]
    if options.priority_class:
        pod["priorityClassName"] = options.priority_class
    if options.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in options.image_pull_secrets]
    labels = {**MANAGED_BY, "chexflow.io/job": spec.name, "chexflow.io/role": role}
    return {"metadata": {"labels": labels, "annotations": dict(POD_ANNOTATIONS)}, "spec": pod}


def scheduling_policy(spec: JobSpec, options: ClusterOptions,
                      launcher_creation_policy: str = "WaitForWorkersReady"
                      ) -> dict[str, Any] | None:
    """runPolicy.schedulingPolicy: what a gang scheduler (Volcano or scheduler-plugins, as the
    operator is configured) makes of the job's PodGroup; None when nothing needs saying.

    mpi-operator started with --gang-scheduling makes a PodGroup for every MPIJob, whether the
    job asks for gang scheduling or not, with minMember = schedulingPolicy.minAvailable, or
    workers + 1 when unset (pkg/controller/podgroup.go, calculateMinAvailable). With
    WaitForWorkersReady it creates the launcher only once the workers are ready, so a gang
    that counts the launcher holds the workers for a pod that never comes: minAvailable is the
    workers whenever the launcher waits for them (a cluster without gang scheduling ignores
    it), and the workers + 1 with AtStartup. Queue and priority class only for --gang-scheduling."""
    waits = launcher_creation_policy == "WaitForWorkersReady"
    if not (options.gang_scheduling or waits):
        return None
    policy: dict[str, Any] = {"minAvailable": options.min_available
                              or spec.workers + (0 if waits else 1)}
    if options.volcano_queue:
        policy["queue"] = options.volcano_queue
    if options.gang_scheduling and options.priority_class:
        policy["priorityClass"] = options.priority_class
    return policy


def render_mpijob(
    spec: JobSpec,
    namespace: str = "default",
    image: str | None = None,
    clean_pod_policy: str = "Running",
    service_account: str | None = None,
    launcher_creation_policy: str = "WaitForWorkersReady",
    options: ClusterOptions | None = None,
) -> dict[str, Any]:
    """The MPIJob (kubeflow.org/v2beta1) that runs `spec` as a Horovod job."""
    if clean_pod_policy not in CLEAN_POD_POLICIES:
        raise ValueError(f"clean_pod_policy must be one of {CLEAN_POD_POLICIES}")
    options = options or ClusterOptions()
    image = image or image_for(spec.environment)
    volumes, mounts = pod_volumes(spec)
    launcher = container_spec(
        spec,
        "launcher",
        image,
        mpirun_args(spec),
        {"requests": dict(LAUNCHER_RESOURCES), "limits": dict(LAUNCHER_RESOURCES)},
        mounts,
        options,
    )
    worker = container_spec(
        spec, "worker", image, list(WORKER_COMMAND), worker_resources(spec), mounts, options
    )
    worker["readinessProbe"] = copy.deepcopy(WORKER_READINESS)
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": clean_pod_policy,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "activeDeadlineSeconds": spec.timeout_seconds,
        "backoffLimit": LAUNCHER_BACKOFF_LIMIT if spec.backoff_limit is None
        else spec.backoff_limit,
    }
    policy = scheduling_policy(spec, options, launcher_creation_policy)
    if policy is not None:
        run_policy["schedulingPolicy"] = policy
    return {
        "apiVersion": MPIJOB_API_VERSION,
        "kind": "MPIJob",
        "metadata": job_metadata(spec, namespace, options),
        "spec": {
            "slotsPerWorker": spec.slots,
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": launcher_creation_policy,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": pod_template(
                        spec, launcher, volumes, "launcher", service_account, options
                    ),
                },
                "Worker": {
                    "replicas": spec.workers,
                    "restartPolicy": "Never",
                    "template": pod_template(
                        spec, worker, volumes, "worker", service_account, options
                    ),
                },
            },
        },
    }


def render_batch_job(
    spec: JobSpec,
    namespace: str = "default",
    image: str | None = None,
    service_account: str | None = None,
    options: ClusterOptions | None = None,
) -> dict[str, Any]:
    """The batch/v1 Job that runs a single-process `spec`."""
    options = options or ClusterOptions()
    image = image or image_for(spec.environment)
    volumes, mounts = pod_volumes(spec)
    container = container_spec(
        spec, "main", image, list(spec.command), worker_resources(spec), mounts, options
    )
    template = pod_template(spec, container, volumes, "main", service_account, options)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": job_metadata(spec, namespace, options),
        "spec": {
            "backoffLimit": spec.backoff_limit or 0,
            "activeDeadlineSeconds": spec.timeout_seconds,
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            "template": template,
        },
    }


def render(spec: JobSpec, namespace: str = "default", **kwargs: Any) -> dict[str, Any]:
    """MPIJob for Horovod jobs, batch Job otherwise."""
    if spec.horovod:
        return render_mpijob(spec, namespace, **kwargs)
    kwargs.pop("clean_pod_policy", None)
    kwargs.pop("launcher_creation_policy", None)
    return render_batch_job(spec, namespace, **kwargs)
