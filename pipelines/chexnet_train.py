"""`chexnet-train`: preprocess -> train (MPIJob, Horovod) -> evaluate -> report, and with
deploy=True the model served by KServe (an InferenceService named serve_name)."""


from kfp import dsl

from chexflow.components.definitions import (
    deploy_op,
    evaluate_op,
    preprocess_op,
    report_op,
    train_op,
)
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

NAME = "chexnet-train"

# `chexflow run`'s settings for this pipeline where the signature's (a cluster's) are not small:
# a few minutes on 2 CPU cores (`make demo`), from scratch, on generated data where each class
# owns a cell of a grid. No flip (it mirrors a class's cell onto another's), BatchNorm momentum
# 0.9 (at 0.99 a short run validates another network than it trains), a cosine decay (the
# plateau rule on a few validation images cuts the rate too early).
RUN_DEFAULTS = {"backend": "local", "gpus_per_worker": 0, "epochs": 6, "image_size": 64,
                "lr_schedule": "cosine", "bn_momentum": 0.9, "flip": False, "weights": "none",
                "bootstrap": 200, "timeout_seconds": 3600}


def build(default_trainer_image: str | None = None, mount_path: str = MOUNT_PATH):
    """The pipeline function, with the trainer image as a parameter defaulting to ours; every
    pod (steps and jobs) mounts the data PVC at `mount_path`."""

    @dsl.pipeline(name=NAME, description="CheXNet-style training with Horovod: preprocess, "
                  "train as an MPIJob, evaluate test AUROC, report.")
    @cluster_parameters
    def chexnet_train(
        raw_dir: str,
        work_root: str = DEFAULT_WORK_ROOT,
        backend: str = "kubernetes",
        namespace: str = DEFAULT_NAMESPACE,
        data_pvc: str = DEFAULT_PVC,
        trainer_image: str = default_trainer_image or trainer_image(),
        model: str = "densenet121",
        workers: int = 2,
        gpus_per_worker: int = 1,
        slots_per_worker: int = 0,
        cpu_per_worker: str = "",
        memory_per_worker: str = "",
        epochs: int = 5,
        batch_size: int = 16,
        lr: float = 1e-3,
        lr_schedule: str = "plateau",
        bn_momentum: float = 0.99,
        flip: bool = True,
        image_size: int = 224,
        weights: str = "imagenet",
        steps_per_epoch: int = 0,
        validation_steps: int = 0,
        seed: int = 0,
        bootstrap: int = 1000,
        timeout_seconds: int = 86400,
        deploy: bool = False,
        serve_name: str = "chexnet",
        **cluster,  # node_selector, tolerations, ...: ClusterOptions' pipeline parameters
    ):
        target = job_target(work_root, backend, namespace, data_pvc, trainer_image,
                            timeout_seconds, mount_path=mount_path, **cluster).output
        prep = step_pod(preprocess_op(raw_dir=raw_dir, image_size=image_size, target=target),
                        data_pvc, mount_path)
        train = step_pod(train_op(
            data_dir=prep.outputs["Output"], workers=workers, model=model, epochs=epochs,
            batch_size=batch_size, lr=lr, image_size=image_size, weights=weights,
            steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            synthetic_data=False, seed=seed, lr_schedule=lr_schedule, bn_momentum=bn_momentum,
            flip=flip, gpus_per_worker=gpus_per_worker,
            slots_per_worker=slots_per_worker,
            cpu_per_worker=cpu_per_worker, memory_per_worker=memory_per_worker, target=target,
            hparams_json="",
        ), data_pvc, mount_path)
        evaluate = step_pod(evaluate_op(
            data_dir=prep.outputs["Output"], model_path=train.outputs["model_path"],
            bootstrap=bootstrap, target=target,
        ), data_pvc, mount_path)
        step_pod(report_op(
            train_summary=train.outputs["summary"], auroc_json=evaluate.outputs["Output"],
            title="chexnet-train report",
        ), data_pvc, mount_path)
        with dsl.If(deploy == True, name="deploy"):  # noqa: E712 (KFP builds the condition)
            step_pod(deploy_op(model_path=train.outputs["model_path"], name=serve_name,
                               target=target), data_pvc, mount_path).after(evaluate)

    return chexnet_train
