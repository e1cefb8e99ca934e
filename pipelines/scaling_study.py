"""`scaling-study`: the same training at several worker counts (ParallelFor, one at a time so
runs do not compete for the machines) -> throughput and scaling efficiency vs workers.

On hosts without a GPU every worker gets `threads_per_worker` TensorFlow threads at every
count (as each gets one GPU on GPU hosts); the worker's own default, cores / ranks, would give
a 1-worker run every core and each of N workers 1/N of them, so the chart would measure thread
counts, not Horovod."""


from kfp import dsl

from chexflow.components.definitions import preprocess_op, scaling_report_op, train_op
from chexflow.container_images import trainer_image
from chexflow.pipelines.common import (
    DEFAULT_NAMESPACE,
    DEFAULT_PVC,
    DEFAULT_WORK_ROOT,
    MOUNT_PATH,
    cluster_parameters,
    job_target,
    step_pod,
)

NAME = "scaling-study"

# `chexflow run`'s settings for this pipeline where the signature's (a cluster's) are not
# small: they finish in a few minutes on 2 CPU cores.
RUN_DEFAULTS = {"backend": "local", "worker_counts": [1, 2], "gpus_per_worker": 0,
                "batch_size": 8, "image_size": 64, "steps_per_epoch": 8, "timeout_seconds": 3600}


def build(default_trainer_image: str | None = None, mount_path: str = MOUNT_PATH):
    @dsl.pipeline(name=NAME, description="Horovod throughput and scaling efficiency vs "
                  "workers (ParallelFor over worker counts), as PNG/HTML/Markdown.")
    @cluster_parameters
    def scaling_study(
        raw_dir: str,
        worker_counts: list = [1, 2, 4, 8],  # noqa: B006 - a KFP pipeline parameter default
        work_root: str = DEFAULT_WORK_ROOT,
        backend: str = "kubernetes",
        namespace: str = DEFAULT_NAMESPACE,
        data_pvc: str = DEFAULT_PVC,
        trainer_image: str = default_trainer_image or trainer_image(),
        model: str = "resnet50",
        gpus_per_worker: int = 1,
        slots_per_worker: int = 0,
        cpu_per_worker: str = "",
        memory_per_worker: str = "",
        threads_per_worker: int = 1,
        epochs: int = 1,
        batch_size: int = 64,
        image_size: int = 224,
        steps_per_epoch: int = 100,
        synthetic_data: bool = True,
        timeout_seconds: int = 7200,
        **cluster,  # node_selector, tolerations, ...: ClusterOptions' pipeline parameters
    ):
        target = job_target(work_root, backend, namespace, data_pvc, trainer_image,
                            timeout_seconds, mount_path=mount_path, **cluster).output
        prep = step_pod(preprocess_op(raw_dir=raw_dir, image_size=image_size, target=target),
                        data_pvc, mount_path)
        with dsl.ParallelFor(worker_counts, parallelism=1) as workers:
            # raw_dir, not prep's output, and a target made in the loop: kfp.local 2.17 hands a
            # loop body the loop item in place of an output from outside the loop (see
            # chexflow.components.steps.training_data)
            loop_target = job_target(work_root, backend, namespace, data_pvc, trainer_image,
                                     timeout_seconds, mount_path=mount_path, **cluster).output
            train = step_pod(train_op(
                data_dir=raw_dir, workers=workers, model=model, epochs=epochs,
                batch_size=batch_size, lr=1e-3, image_size=image_size, weights="none",
                steps_per_epoch=steps_per_epoch, validation_steps=1,
                synthetic_data=synthetic_data, seed=0, gpus_per_worker=gpus_per_worker,
                slots_per_worker=slots_per_worker,
                cpu_per_worker=cpu_per_worker, memory_per_worker=memory_per_worker,
                threads=threads_per_worker, target=loop_target, hparams_json="",
            ), data_pvc, mount_path).after(prep)
        step_pod(scaling_report_op(
            summaries=dsl.Collected(train.outputs["summary"]), target=target,
            title=f"Horovod scaling: {NAME}",
        ), data_pvc, mount_path)

    return scaling_study
