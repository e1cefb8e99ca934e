"""`tune-then-train`: a Katib sweep (`chexflow tune`: launch the Experiment, wait, read the
optimal trial; its trials train on this run's preprocessed data) -> final training with the best
hyperparameters -> evaluate -> report."""


from kfp import dsl

from chexflow.components.definitions import evaluate_op, preprocess_op, report_op, train_op, tune_op
from chexflow.container_images import launcher_image, trainer_image
from chexflow.pipelines.common import (
    DEFAULT_NAMESPACE,
    DEFAULT_PVC,
    DEFAULT_WORK_ROOT,
    MOUNT_PATH,
    cluster_parameters,
    job_target,
    step_pod,
)

NAME = "tune-then-train"

# `chexflow run`'s settings for this pipeline where the signature's (a cluster's) are not
# small: 2 trials of 1 epoch and the final training of 1 epoch, on 2 CPU cores.
RUN_DEFAULTS = {"backend": "local", "workers": 1, "gpus_per_worker": 0, "epochs": 1,
                "image_size": 64, "weights": "none", "bootstrap": 200, "timeout_seconds": 7200,
                "tune_args": ["--set", "spec.maxTrialCount=2", "--set",
                              "spec.maxFailedTrialCount=2", "--set", "spec.parallelTrialCount=1",
                              "--trial-arg", "epochs=1"]}


def build(default_trainer_image: str | None = None, default_launcher_image: str | None = None,
          mount_path: str = MOUNT_PATH):
    @dsl.pipeline(name=NAME, description="Katib hyperparameter sweep, then the final Horovod "
                  "training with the optimal trial's parameters, evaluation and report.")
    @cluster_parameters
    def tune_then_train(
        raw_dir: str,
        katib_spec: str,
        tune_args: list = [],  # noqa: B006 - a KFP pipeline parameter default
        work_root: str = DEFAULT_WORK_ROOT,
        backend: str = "kubernetes",
        namespace: str = DEFAULT_NAMESPACE,
        data_pvc: str = DEFAULT_PVC,
        trainer_image: str = default_trainer_image or trainer_image(),
        launcher_image: str = default_launcher_image or launcher_image(),
        model: str = "densenet121",
        workers: int = 2,
        gpus_per_worker: int = 1,
        slots_per_worker: int = 0,
        cpu_per_worker: str = "",
        memory_per_worker: str = "",
        epochs: int = 5,
        batch_size: int = 16,
        lr: float = 1e-3,
        image_size: int = 224,
        weights: str = "imagenet",
        steps_per_epoch: int = 0,
        bootstrap: int = 1000,
        timeout_seconds: int = 86400,
        **cluster,  # node_selector, tolerations, ...: ClusterOptions' pipeline parameters
    ):
        target = job_target(work_root, backend, namespace, data_pvc, trainer_image,
                            timeout_seconds, launcher_image, mount_path=mount_path,
                            **cluster).output
        prep = step_pod(preprocess_op(raw_dir=raw_dir, image_size=image_size, target=target),
                        data_pvc, mount_path)
        tune = step_pod(tune_op(
            spec_path=katib_spec, data_dir=prep.outputs["Output"], model=model,
            image_size=image_size, weights=weights, target=target, tune_args=tune_args,
        ), data_pvc, mount_path)
        train = step_pod(train_op(
            data_dir=prep.outputs["Output"], workers=workers, model=model, epochs=epochs,
            batch_size=batch_size, lr=lr, image_size=image_size, weights=weights,
            steps_per_epoch=steps_per_epoch, validation_steps=0, synthetic_data=False, seed=0,
            gpus_per_worker=gpus_per_worker, slots_per_worker=slots_per_worker,
            cpu_per_worker=cpu_per_worker,
            memory_per_worker=memory_per_worker, target=target,
            hparams_json=tune.outputs["Output"],
        ), data_pvc, mount_path)
        evaluate = step_pod(evaluate_op(
            data_dir=prep.outputs["Output"], model_path=train.outputs["model_path"],
            bootstrap=bootstrap, target=target,
        ), data_pvc, mount_path)
        step_pod(report_op(
            train_summary=train.outputs["summary"], auroc_json=evaluate.outputs["Output"],
            title="tune-then-train report",
        ), data_pvc, mount_path)

    return tune_then_train
