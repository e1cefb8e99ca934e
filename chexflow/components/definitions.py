"""KFP v2 lightweight components. They run in the control (launcher) image and only describe
and launch jobs (chexflow.components.steps) through the backend a pipeline parameter picks,
then log what the jobs wrote as KFP artifacts: Metrics, ClassificationMetrics, HTML, Markdown.

Each function body imports what it needs: KFP ships the body's source to the pod. No
`from __future__ import annotations` here: KFP reads the annotations as types.
"""


from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Markdown, Metrics, Output

from chexflow.container_images import launcher_image

BASE_IMAGE = launcher_image()
COMPONENT = {"base_image": BASE_IMAGE, "install_kfp_package": False}


@dsl.component(**COMPONENT)
def target_op(
    work_root: str,
    run_id: str,
    backend: str,
    namespace: str,
    data_pvc: str,
    trainer_image: str,
    launcher_image: str,
    timeout_seconds: int,
    # the pipeline parameters of chexflow.jobs.spec.ClusterOptions, in its order (KFP reads a
    # component's inputs from this source; tests/test_pipelines_target.py checks them)
    node_selector: dict,
    tolerations: list,
    priority_class: str,
    image_pull_secrets: list,
    gang_scheduling: bool,
    queue: str,
    job_kind: str,
    mount_path: str = "",
) -> dict:
    """Where the run's jobs write (WORK_ROOT/RUN_ID) and run (backend local|kubernetes; for
    kubernetes the namespace, data PVC, images and what the cluster asks of the pods: node
    selector, tolerations, priority class, image pull secrets, gang scheduling, whether a Horovod
    job runs as an MPIJob or a TrainJob (job_kind); each job's time
    limit; where the jobs' pods mount the PVC, as the steps do, "" for /mnt/chexflow), checked
    once: the `target` every other step takes."""
    given = dict(locals())  # the inputs by name, before an import adds names
    from chexflow.components.steps import target_from_inputs

    return target_from_inputs(given).to_dict()


@dsl.component(**COMPONENT)
def preprocess_op(
    raw_dir: str,
    image_size: int,
    target: dict,
    dataset: Output[Dataset],
) -> str:
    """NIH-format folder -> TFRecords + manifest.json on the shared volume; returns that folder."""
    import json
    from pathlib import Path

    from chexflow.components.steps import Target, preprocess_step

    data_dir = preprocess_step(raw_dir, image_size, Target.from_dict(target))
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    Path(dataset.path).write_text(json.dumps(manifest, indent=2))
    dataset.metadata["data_dir"] = data_dir
    for split, info in manifest["splits"].items():
        dataset.metadata[f"{split}_images"] = info["images"]
    return data_dir


@dsl.component(**COMPONENT)
def train_op(
    data_dir: str,
    workers: int,
    gpus_per_worker: int,
    slots_per_worker: int,
    cpu_per_worker: str,
    memory_per_worker: str,
    target: dict,
    hparams_json: str,
    metrics: Output[Metrics],
    # TrainOptions fields (chexflow.train.options; tests/test_train_options.py checks them)
    model: str,
    epochs: int,
    batch_size: int,
    lr: float,
    image_size: int,
    weights: str,
    steps_per_epoch: int,
    validation_steps: int,
    synthetic_data: bool,
    seed: int,
    threads: int = 0,
    lr_schedule: str = "plateau",
    bn_momentum: float = 0.99,
    flip: bool = True,
) -> NamedTuple("TrainOutputs", [("model_path", str), ("summary", str)]):  # noqa: UP014
    """Horovod training as an MPIJob (or horovodrun locally); logs throughput and val AUROC.
    slots_per_worker 0: one rank per GPU; cpu/memory_per_worker "": a share per GPU (per rank
    without GPUs). The other inputs are `chexflow train`'s options (TrainOptions: threads,
    lr_schedule, bn_momentum, ...; 0 for an unset steps_per_epoch, validation_steps or
    threads), `flip` false its --no-flip; hparams_json overrides them with tuned values."""
    given = dict(locals())  # the inputs by name, before an import adds names
    import json
    from collections import namedtuple

    from chexflow.components.steps import train_inputs, train_step

    options, job_target = train_inputs(given)
    m = train_step(data_dir, workers, options, job_target)
    for key in ("workers", "processes", "batch_size_per_worker", "global_batch_size",
                "images_per_sec", "images_per_sec_std", "jitter", "step_time_ms", "val_auroc",
                "val_loss", "wall_seconds", "job_wall_seconds", "lr", "startup_seconds",
                "first_step_seconds"):
        value = m.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    for rank, ips in enumerate(m.get("images_per_sec_per_worker") or []):
        metrics.log_metric(f"images_per_sec_worker_{rank}", float(ips))
    outputs = namedtuple("TrainOutputs", ["model_path", "summary"])
    return outputs(m.get("best_model") or f"{m['out_dir']}/best_model.keras", json.dumps(m))


@dsl.component(**COMPONENT)
def evaluate_op(
    data_dir: str,
    model_path: str,
    bootstrap: int,
    target: dict,
    metrics: Output[Metrics],
    roc: Output[ClassificationMetrics],
    report: Output[HTML],
) -> str:
    """Test-split AUROC (per class, mean, bootstrap CI) and a micro-averaged ROC curve."""
    import json
    import math
    import shutil

    from chexflow.components.steps import Target, evaluate_step, micro_roc

    auroc = evaluate_step(data_dir, model_path, bootstrap, Target.from_dict(target))
    out_dir = auroc["out_dir"]
    for key in ("mean", "ci_low", "ci_high"):
        if isinstance(auroc.get(key), float) and math.isfinite(auroc[key]):
            metrics.log_metric(f"auroc_{key}", auroc[key])
    for name, v in (auroc.get("per_class") or {}).items():
        if isinstance(v.get("auroc"), float) and math.isfinite(v["auroc"]):
            metrics.log_metric(f"auroc_{name}", v["auroc"])
    # calibration and operating points (calibration.json): ece_*, threshold_*, sensitivity_*
    from chexflow.evaluate.calibration import calibration_metrics
    from chexflow.results import read_calibration

    for name, value in calibration_metrics(read_calibration(out_dir)).items():
        metrics.log_metric(name, value)
    curve = micro_roc(f"{out_dir}/predictions.npz")
    roc.log_roc_curve(curve["fpr"], curve["tpr"], curve["thresholds"])
    shutil.copyfile(f"{out_dir}/report.html", report.path)
    return json.dumps(auroc)


@dsl.component(**COMPONENT)
def deploy_op(
    model_path: str,
    name: str,
    target: dict,
) -> str:
    """The trained model as a KServe InferenceService `name` in the run's namespace (chexflow's
    ClusterServingRuntime, RawDeployment, the run folder mounted from the data PVC), once
    Ready; returns its in-cluster URL."""
    from chexflow.components.steps import Target, deploy_step

    return deploy_step(model_path, name, Target.from_dict(target))


@dsl.component(**COMPONENT)
def report_op(
    train_summary: str,
    auroc_json: str,
    title: str,
    report_html: Output[HTML],
    report_md: Output[Markdown],
) -> str:
    """The run report (training throughput + test AUROC + ROC plot) as HTML and Markdown;
    also written next to the evaluation on the shared volume. Returns that HTML path."""
    import json
    from pathlib import Path

    from chexflow.components.reports import run_report

    train = json.loads(train_summary)
    auroc = json.loads(auroc_json)
    out_dir = Path(auroc["out_dir"]).parent
    doc, md = run_report(train, auroc, str(Path(auroc["out_dir"]) / "roc.png"), title)
    Path(report_html.path).write_text(doc)
    Path(report_md.path).write_text(md)
    (out_dir / "report.html").write_text(doc)
    (out_dir / "report.md").write_text(md)
    return str(out_dir / "report.html")


@dsl.component(**COMPONENT)
def scaling_report_op(
    summaries: list[str],
    target: dict,
    title: str,
    metrics: Output[Metrics],
    chart: Output[dsl.Artifact],
    report_html: Output[HTML],
    report_md: Output[Markdown],
) -> str:
    """Throughput and scaling efficiency vs workers (PNG + HTML + Markdown + scaling.json)."""
    import json
    import shutil
    from pathlib import Path

    from chexflow.components.reports import scaling_chart, scaling_report, scaling_table
    from chexflow.components.steps import Target

    table = scaling_table([json.loads(s) for s in summaries])
    out_dir = Path(Target.from_dict(target).workdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "scaling.png"
    scaling_chart(table, png, title)
    doc, md = scaling_report(table, png, title)
    (out_dir / "scaling.html").write_text(doc)
    (out_dir / "scaling.md").write_text(md)
    (out_dir / "scaling.json").write_text(json.dumps(table, indent=2))
    shutil.copyfile(png, chart.path)
    chart.metadata["mime_type"] = "image/png"
    Path(report_html.path).write_text(doc)
    Path(report_md.path).write_text(md)
    for row in table:
        metrics.log_metric(f"images_per_sec_w{row['workers']}", float(row["images_per_sec"]))
        metrics.log_metric(f"efficiency_w{row['workers']}", float(row["efficiency"]))
    return json.dumps(table)


@dsl.component(**COMPONENT)
def tune_op(
    spec_path: str,
    data_dir: str,
    model: str,
    image_size: int,
    weights: str,
    target: dict,
    tune_args: list,
    metrics: Output[Metrics],
) -> str:
    """A Katib sweep (`chexflow tune`): runs the Experiment, waits, returns the optimal trial's
    parameters as JSON for the final training. Every trial trains on `data_dir` (preprocess's
    output) with the pipeline's model, image size and weights (`--trial-arg`). `tune_args`: more
    `chexflow tune` options (e.g. ["--set", "spec.maxTrialCount=4", "--trial-arg", "epochs=1"]).
    Metrics: each trial's (trialN_val_auroc, trialN_images_per_sec, ...) and the best's."""
    given = dict(locals())  # the inputs by name, before an import adds names
    import json

    from chexflow.components.steps import tune_inputs, tune_step, tune_trial_metrics

    spec_path, job_target, trial_args, extra_args = tune_inputs(given)
    optimal = tune_step(spec_path, job_target, trial_args, extra_args)
    for name, value in tune_trial_metrics(job_target).items():
        if isinstance(value, float):
            metrics.log_metric(name, value)
        else:
            metrics.metadata[name] = value
    for name, value in (optimal.get("metrics") or {}).items():
        if isinstance(value, (int, float)):
            metrics.log_metric(f"best_{name}", float(value))
    for name, value in optimal["parameters"].items():
        try:
            metrics.log_metric(f"param_{name}", float(value))
        except (TypeError, ValueError):
            metrics.metadata[f"param_{name}"] = str(value)
    return json.dumps(optimal["parameters"])
