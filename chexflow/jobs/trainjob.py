"""Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): chexflow's Horovod ClusterTrainingRuntime
(trainjob/horovod-runtime.yaml, generated here) and the TrainJob that runs a JobSpec on it.

The runtime uses Trainer's `mlPolicy.mpi` (OpenMPI; Trainer makes the ssh keys Secret and the
/etc/mpi/hostfile ConfigMap) with `runLauncherAsNode`: the launcher pod runs mpirun and is itself
one of the job's nodes, so TrainJob.spec.trainer.resourcesPerNode (which Trainer v2.3 applies to
the launcher and, with runLauncherAsNode only, to the `node` pods) gives every node the same
resources, growing with its GPUs. The `node` pods run the trainer image's sshd (non-root user
chexflow, port 2222) and are Ready when it accepts connections; JobSet's InOrder startup policy
creates the launcher only once they are (the MPIJob's launcherCreationPolicy
WaitForWorkersReady). Pods are non-root, opted out of Istio, tolerate the GPU taint and mount a
memory /dev/shm, as render.py's MPIJob. The job's data PVC, node selector, extra tolerations and
pull secrets are the TrainJob's runtimePatches (Trainer's PodSpecPatch has no priorityClassName
and Trainer no gang-scheduling field of chexflow's: those are refused here).

Kueue (`queue`): the TrainJob is labelled kueue.x-k8s.io/queue-name, as Kueue's "Run A TrainJob"
writes it, and nothing else: Kueue's TrainJob webhook sets spec.suspend at creation (its docs: by
default Kueue sets it via the webhook) and adds its own runtime patch (manager
kueue.x-k8s.io/manager), through which it gives the node and launcher pods the admitted flavor's
node selector when it unsuspends the TrainJob.

Images: a TrainJob's `spec.trainer.image` (as Kubeflow's docs write it) reaches only the
launcher, whose replicated job Trainer marks as the `trainer` step; the `node` pods run the
runtime's image, and a runtime patch cannot change a container's image. So the runtime is
rendered with the chosen trainer image in both (chexflow.container_images: the references
`chexflow images push` wrote, else the placeholders the committed file carries), and the
backend refuses, before creating anything, a TrainJob whose image is not the runtime's
(`runtime_image_mismatch`): its nodes would run another image than its launcher.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

import chexflow.jobs.render as render
from chexflow.container_images import header_lines, trainer_image
from chexflow.jobs.spec import IMAGE_UID, ClusterOptions, JobSpec, JobSpecError

TRAINJOB_API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
RUNTIME_PLURAL = "clustertrainingruntimes"
RUNTIME_NAME = "chexflow-horovod"
RUNTIME_FILE = Path(__file__).resolve().parents[2] / "trainjob" / "horovod-runtime.yaml"
CONTAINER = "node"  # Trainer's MPI plugin mounts ssh keys and hostfile into containers so named
LAUNCHER, NODE = "launcher", "node"  # replicated jobs
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
PATCH_MANAGER = "chexflow.io/render"
RENDER_COMMAND = "chexflow images render [--out DIR]"
HEADER = ("# chexflow's Horovod runtime for Kubeflow Trainer v2: apply it once per cluster\n"
          "#   kubectl apply -f trainjob/horovod-runtime.yaml\n"
          "# then submit TrainJobs that name it (chexflow mpijob render --job-kind trainjob).\n"
          "# Its `node` and launcher images are both the trainer's: a TrainJob's\n"
          "# spec.trainer.image reaches only the launcher. Generated (from chexflow/jobs/\n"
          "# render.py's pieces) by `chexflow images render` for the chosen images;\n"
          "# tests/test_trainjob.py checks the committed file is current. Not edited by hand.\n")


def _runtime_pod(container: dict, volumes: list, role: str) -> dict[str, Any]:
    """A pod template of the runtime: render.py's (a GPU pod's: it tolerates the GPU taint),
    without what belongs to one job."""
    probe = JobSpec(name=RUNTIME_NAME, command=["true"], horovod=True)
    template = render.pod_template(probe, container, volumes, role, None, ClusterOptions())
    template["metadata"]["labels"].pop("chexflow.io/job")
    # Never, the launcher too: each failed attempt is a pod of its own that the Job controller
    # keeps, so `kubectl logs` still reads it once the TrainJob has failed (with OnFailure the
    # Job controller deletes the restarted pod, and its log, when it gives up)
    template["spec"]["restartPolicy"] = "Never"
    # Trainer v2.3 mounts the ssh private key with mode 0640 (root-owned): the image's user reads
    # it, as sshd's host key and ssh's identity, through the group the pod's fsGroup gives it
    template["spec"]["securityContext"] = {"fsGroup": IMAGE_UID,
                                           "fsGroupChangePolicy": "OnRootMismatch"}
    container.pop("resources")  # the TrainJob's resourcesPerNode
    return template


def _runtime_container(image: str, command: list[str] | None) -> tuple[dict, list]:
    probe = JobSpec(name=RUNTIME_NAME, command=["true"], horovod=True)
    volumes, mounts = render.pod_volumes(probe)
    container = render.container_spec(probe, CONTAINER, image, command or [],
                                  {"limits": {render.GPU_RESOURCE: 1}}, mounts, ClusterOptions())
    for key in ("env",) + (() if command else ("command",)):
        container.pop(key)
    return container, volumes


def horovod_runtime(image: str | None = None) -> dict[str, Any]:
    """chexflow's ClusterTrainingRuntime for Horovod over OpenMPI, its node and launcher pods
    in `image` (default: the chosen trainer image); Trainer sets the launcher's anew from a
    TrainJob's spec.trainer.image, never the nodes'."""
    image = image or trainer_image()
    node, volumes = _runtime_container(image, list(render.WORKER_COMMAND))
    node["readinessProbe"] = copy.deepcopy(render.WORKER_READINESS)
    launcher, _ = _runtime_container(image, None)
    node_pod = _runtime_pod(node, volumes, NODE)
    launcher_pod = _runtime_pod(launcher, copy.deepcopy(volumes), LAUNCHER)
    return {
        "apiVersion": TRAINJOB_API_VERSION,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME_NAME,
                     "labels": {**render.MANAGED_BY, "trainer.kubeflow.org/framework": "horovod"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": {
                "numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                "sshAuthMountPath": render.SSH_AUTH_MOUNT_PATH, "runLauncherAsNode": True}},
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": True},
                # nodes first: the launcher is created once their sshd is Ready
                "startupPolicy": {"startupPolicyOrder": "InOrder"},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": [LAUNCHER]},
                "replicatedJobs": [
                    {"name": NODE, "template": {"spec": {
                        "backoffLimit": 0, "template": node_pod}}},
                    {"name": LAUNCHER, "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                        "spec": {"backoffLimit": render.LAUNCHER_BACKOFF_LIMIT,
                                 "template": launcher_pod}}},
                ]}},
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key."""

    def increase_indent(self, flow: bool = False, indentless: bool = False):
        return super().increase_indent(flow, False)


def runtime_text() -> str:
    """trainjob/horovod-runtime.yaml as it should read for the chosen images."""
    return (header_lines(RENDER_COMMAND, ("trainer",)) + HEADER
            + yaml.dump(horovod_runtime(), Dumper=_Dumper, sort_keys=False, width=100))


def runtime_node_image(runtime: dict[str, Any]) -> str | None:
    """The image of a ClusterTrainingRuntime's `node` container (None if it has none)."""
    for rjob in runtime.get("spec", {}).get("template", {}).get("spec", {}).get(
            "replicatedJobs", []):
        if rjob.get("name") != NODE:
            continue
        pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            if container.get("name") == CONTAINER:
                return container.get("image")
    return None


def runtime_image_mismatch(runtime: dict[str, Any], trainjob: dict[str, Any]) -> str | None:
    """Why `trainjob` must not run on `runtime`: its spec.trainer.image (the launcher's) is
    not the image of the runtime's `node` pods; None when they agree."""
    node = runtime_node_image(runtime)
    image = (trainjob.get("spec", {}).get("trainer") or {}).get("image")
    if node is None or image is None or node == image:
        return None
    name = runtime.get("metadata", {}).get("name", RUNTIME_NAME)
    return (f"ClusterTrainingRuntime {name} runs its node pods in {node}, but the TrainJob's "
            f"spec.trainer.image (its launcher's) is {image}: Trainer sets only the launcher's "
            f"image, so the two would differ; apply the runtime rendered for {image} "
            f"(CHEXFLOW_TRAINER_IMAGE={image} chexflow images render --out DIR, then kubectl "
            f"apply -f DIR/trainjob/{RUNTIME_FILE.name})")


def _pod_patch(spec: JobSpec, options: ClusterOptions) -> dict[str, Any]:
    """The job's own part of both pods: data PVCs, node selector, tolerations, pull secrets."""
    volumes, mounts = render.pod_volumes(spec)
    pod: dict[str, Any] = {}
    data = [v for v in volumes if v["name"] != render.SHM_VOLUME]
    container: dict[str, Any] = {}
    if data:
        pod["volumes"] = data
        container["volumeMounts"] = [m for m in mounts if m["name"] != render.SHM_VOLUME]
    if options.run_as_user != IMAGE_UID:
        container["securityContext"] = {"runAsUser": options.run_as_user, "runAsNonRoot": True}
    if container:
        pod["containers"] = [{"name": CONTAINER, **container}]
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        pod["tolerations"] = [render.GPU_TOLERATION, *(dict(t) for t in options.tolerations)]
    if options.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in options.image_pull_secrets]
    return pod


def render_trainjob(
    spec: JobSpec,
    namespace: str = "default",
    image: str | None = None,
    runtime: str = RUNTIME_NAME,
    options: ClusterOptions | None = None,
) -> dict[str, Any]:
    """The TrainJob that runs `spec` (a Horovod job) on ClusterTrainingRuntime `runtime`."""
    options = options or ClusterOptions()
    if not spec.horovod:
        raise JobSpecError(f"job {spec.name}: a TrainJob runs Horovod jobs (mpirun); "
                           "a single-process step is a batch Job (--job-kind mpijob)")
    unsupported = [name for name, value in (("priority_class", options.priority_class),
                                            ("gang_scheduling", options.gang_scheduling)) if value]
    if unsupported:
        raise JobSpecError(f"job {spec.name}: {', '.join(unsupported)} not supported for a "
                           "TrainJob (Trainer's runtimePatches cannot set them): use the MPIJob")
    trainer: dict[str, Any] = {
        "image": image or render.image_for(spec.environment),
        "command": render.mpirun_args(spec),
        "numNodes": spec.workers,
        "numProcPerNode": spec.slots,
        "resourcesPerNode": render.worker_resources(spec),
        "env": render.container_env(spec),
    }
    patch = _pod_patch(spec, options)
    body: dict[str, Any] = {
        "runtimeRef": {"name": runtime, "apiGroup": TRAINJOB_GROUP,
                       "kind": "ClusterTrainingRuntime"},
        "trainer": trainer,
        "activeDeadlineSeconds": spec.timeout_seconds,
    }
    if patch:
        body["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [
                {"name": name, "template": {"spec": {"template": {"spec": copy.deepcopy(patch)}}}}
                for name in (NODE, LAUNCHER)]}}}}]
    return {"apiVersion": TRAINJOB_API_VERSION, "kind": "TrainJob",
            "metadata": render.job_metadata(spec, namespace, options), "spec": body}


def main(argv: list[str] | None = None) -> int:
    """Write trainjob/horovod-runtime.yaml (or the path given) for the chosen images."""
    parser = argparse.ArgumentParser(prog="python -m chexflow.jobs.trainjob",
                                     description=main.__doc__)
    parser.add_argument("path", nargs="?", type=Path, default=RUNTIME_FILE,
                        help=f"where to write it (default {RUNTIME_FILE})")
    path = parser.parse_args(argv).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(runtime_text())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
