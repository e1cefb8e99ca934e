"""What the three pipelines share: cluster defaults, the job target and per-task Kubernetes
settings."""

from __future__ import annotations

from kfp import dsl, kubernetes

from chexflow.components.definitions import target_op
from chexflow.components.steps import MOUNT_PATH

DEFAULT_WORK_ROOT = f"{MOUNT_PATH}/runs"
DEFAULT_PVC = "chexflow-data"
DEFAULT_NAMESPACE = "kubeflow"
# Component pods only launch and watch jobs.
COMPONENT_CPU, COMPONENT_MEMORY = "500m", "1Gi"
RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER


def on_cluster(task: dsl.PipelineTask, data_pvc, mount_path: str = MOUNT_PATH,
               cache: bool = False) -> dsl.PipelineTask:
    """Mount the data PVC at `mount_path` (where the jobs' pods mount it too), size the pod,
    and (by default) never reuse a cached result: a job's outputs live on the PVC, not in KFP's
    artifact store."""
    kubernetes.mount_pvc(task, pvc_name=data_pvc, mount_path=mount_path)
    task.set_cpu_request(COMPONENT_CPU).set_memory_request(COMPONENT_MEMORY)
    task.set_caching_options(cache)
    return task


def job_target(work_root, backend, namespace, data_pvc, trainer_image, timeout_seconds,
               launcher_image="", mount_path: str = MOUNT_PATH, **cluster) -> dsl.PipelineTask:
    """The run's job target (checked once), for every later step's `target` input. `cluster`:
    the pipeline's node_selector, tolerations, priority_class, image_pull_secrets,
    gang_scheduling and queue parameters. `mount_path` is fixed when the pipeline is built
    (KFP mounts a PVC at a constant path), not a run parameter."""
    return on_cluster(target_op(
        work_root=work_root, run_id=RUN_ID, backend=backend, namespace=namespace,
        data_pvc=data_pvc, trainer_image=trainer_image, launcher_image=launcher_image,
        timeout_seconds=timeout_seconds, mount_path=mount_path, **cluster,
    ), data_pvc, mount_path)
