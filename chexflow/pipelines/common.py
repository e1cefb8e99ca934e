"""What the three pipelines share: cluster defaults, the cluster parameters, the job target and
per-task Kubernetes settings."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from kfp import dsl, kubernetes

from chexflow.components.definitions import target_op
from chexflow.components.steps import MOUNT_PATH
from chexflow.jobs.spec import ClusterOptions

DEFAULT_WORK_ROOT = f"{MOUNT_PATH}/runs"
DEFAULT_PVC = "chexflow-data"
DEFAULT_NAMESPACE = "kubeflow"
# Component pods only launch and watch jobs.
COMPONENT_CPU, COMPONENT_MEMORY = "500m", "1Gi"
RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER


def step_pod(task: dsl.PipelineTask, data_pvc, mount_path: str = MOUNT_PATH,
             cache: bool = False) -> dsl.PipelineTask:
    """The step's own pod: the data PVC mounted at `mount_path` (where the jobs' pods mount it
    too), its size, and (by default) no reuse of a cached result: a job's outputs live on the
    PVC, not in KFP's artifact store. kfp.local ignores the first two, whatever the backend."""
    kubernetes.mount_pvc(task, pvc_name=data_pvc, mount_path=mount_path)
    task.set_cpu_request(COMPONENT_CPU).set_memory_request(COMPONENT_MEMORY)
    task.set_caching_options(cache)
    return task


def cluster_parameters(pipeline_func: Callable) -> Callable:
    """A pipeline function `f(..., **cluster)` with ClusterOptions' pipeline parameters
    (node_selector, tolerations, ...: chexflow.jobs.spec, their types and defaults) as its last
    parameters, where KFP reads them (the signature); `f` gets them as `cluster`, for
    `job_target`. A new ClusterOptions field marked PIPELINE_PARAMETER so reaches every
    pipeline."""
    own = inspect.signature(pipeline_func)
    if not any(p.kind is p.VAR_KEYWORD for p in own.parameters.values()):
        raise TypeError(f"{pipeline_func.__name__}: expected a **cluster parameter")
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                               annotation=typ)
             for name, (typ, default) in ClusterOptions.pipeline_parameters().items()]
    signature = own.replace(parameters=[
        *(p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD), *added])

    @functools.wraps(pipeline_func)
    def pipeline(*args, **kwargs):
        return pipeline_func(**signature.bind(*args, **kwargs).arguments)

    pipeline.__signature__ = signature
    return pipeline


def job_target(work_root, backend, namespace, data_pvc, trainer_image, timeout_seconds,
               launcher_image="", mount_path: str = MOUNT_PATH, **cluster) -> dsl.PipelineTask:
    """The run's job target (checked once), for every later step's `target` input. `cluster`:
    the pipeline's ClusterOptions parameters (`cluster_parameters`). `mount_path` is fixed when
    the pipeline is built (KFP mounts a PVC at a constant path), not a run parameter."""
    return step_pod(target_op(
        work_root=work_root, run_id=RUN_ID, backend=backend, namespace=namespace,
        data_pvc=data_pvc, trainer_image=trainer_image, launcher_image=launcher_image,
        timeout_seconds=timeout_seconds, mount_path=mount_path, **cluster,
    ), data_pvc, mount_path)
