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
def preprocess_op(
    raw_dir: str,
    work_root: str,
    run_id: str,
    image_size: int,
    backend: str,
    namespace: str,
    data_pvc: str,
    trainer_image: str,
    timeout_seconds: int,
    dataset: Output[Dataset],
) -> str:
    """NIH-format folder -> TFRecords + manifest.json on the shared volume; returns that folder."""
    import json
    from pathlib import Path

    from chexflow.components.steps import Target, preprocess_step

    target = Target(backend=backend, namespace=namespace, data_pvc=data_pvc,
                    trainer_image=trainer_image, timeout_seconds=timeout_seconds)
    data_dir = preprocess_step(raw_dir, f"{work_root}/{run_id}", image_size, run_id, target)
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    Path(dataset.path).write_text(json.dumps(manifest, indent=2))
    dataset.metadata["data_dir"] = data_dir
    for split, info in manifest["splits"].items():
        dataset.metadata[f"{split}_images"] = info["images"]
    return data_dir


@dsl.component(**COMPONENT)
def train_op(
    data_dir: str,
    work_root: str,
    run_id: str,
    workers: int,
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
    gpus_per_worker: int,
    cpu_per_worker: str,
    memory_per_worker: str,
    backend: str,
    namespace: str,
    data_pvc: str,
    trainer_image: str,
    timeout_seconds: int,
    hparams_json: str,
    metrics: Output[Metrics],
) -> NamedTuple("TrainOutputs", [("model_path", str), ("summary", str)]):  # noqa: UP014
    """Horovod training as an MPIJob (or horovodrun locally); logs throughput and val AUROC."""
    import json
    from collections import namedtuple

    from chexflow.components.steps import Target, apply_hparams, train_step
    from chexflow.train.options import TrainOptions

    target = Target(backend=backend, namespace=namespace, data_pvc=data_pvc,
                    trainer_image=trainer_image, gpus_per_worker=gpus_per_worker,
                    cpu=cpu_per_worker, memory=memory_per_worker,
                    timeout_seconds=timeout_seconds)
    options = apply_hparams(TrainOptions(
        model=model, epochs=epochs, batch_size=batch_size, lr=lr, image_size=image_size,
        weights=weights, steps_per_epoch=steps_per_epoch or None,  # 0: the worker's default
        validation_steps=validation_steps or None, synthetic_data=synthetic_data, seed=seed,
    ), hparams_json)
    out_dir = f"{work_root}/{run_id}/train-w{workers}"
    m = train_step(data_dir, out_dir, workers, options, run_id, target)
    for key in ("workers", "processes", "batch_size_per_worker", "global_batch_size",
                "images_per_sec", "images_per_sec_std", "jitter", "step_time_ms", "val_auroc",
                "val_loss", "wall_seconds", "job_wall_seconds", "lr"):
        value = m.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    for rank, ips in enumerate(m.get("images_per_sec_per_worker") or []):
        metrics.log_metric(f"images_per_sec_worker_{rank}", float(ips))
    outputs = namedtuple("TrainOutputs", ["model_path", "summary"])
    return outputs(m.get("best_model") or f"{out_dir}/best_model.keras", json.dumps(m))


@dsl.component(**COMPONENT)
def evaluate_op(
    data_dir: str,
    model_path: str,
    work_root: str,
    run_id: str,
    bootstrap: int,
    backend: str,
    namespace: str,
    data_pvc: str,
    trainer_image: str,
    timeout_seconds: int,
    metrics: Output[Metrics],
    roc: Output[ClassificationMetrics],
    report: Output[HTML],
) -> str:
    """Test-split AUROC (per class, mean, bootstrap CI) and a micro-averaged ROC curve."""
    import json
    import math
    import shutil

    from chexflow.components.steps import Target, evaluate_step, micro_roc

    target = Target(backend=backend, namespace=namespace, data_pvc=data_pvc,
                    trainer_image=trainer_image, timeout_seconds=timeout_seconds)
    out_dir = f"{work_root}/{run_id}/evaluate"
    auroc = evaluate_step(data_dir, model_path, out_dir, bootstrap, run_id, target)
    for key in ("mean", "ci_low", "ci_high"):
        if isinstance(auroc.get(key), float) and math.isfinite(auroc[key]):
            metrics.log_metric(f"auroc_{key}", auroc[key])
    for name, v in (auroc.get("per_class") or {}).items():
        if isinstance(v.get("auroc"), float) and math.isfinite(v["auroc"]):
            metrics.log_metric(f"auroc_{name}", v["auroc"])
    curve = micro_roc(f"{out_dir}/predictions.npz")
    roc.log_roc_curve(curve["fpr"], curve["tpr"], curve["thresholds"])
    shutil.copyfile(f"{out_dir}/report.html", report.path)
    auroc["out_dir"] = out_dir
    return json.dumps(auroc)


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
    work_root: str,
    run_id: str,
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

    table = scaling_table([json.loads(s) for s in summaries])
    out_dir = Path(work_root) / run_id
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
    work_root: str,
    run_id: str,
    backend: str,
    namespace: str,
    data_pvc: str,
    launcher_image: str,
    timeout_seconds: int,
    tune_args: str,
    metrics: Output[Metrics],
) -> str:
    """A Katib sweep (`chexflow tune`): runs the Experiment, waits, returns the optimal trial's
    parameters as JSON for the final training. `tune_args`: a JSON list of extra `chexflow tune`
    options (e.g. ["--set", "spec.maxTrialCount=4", "--volume", "data=/mnt/chexflow"])."""
    import json

    from chexflow.components.steps import Target, tune_step

    target = Target(backend=backend, namespace=namespace, data_pvc=data_pvc,
                    launcher_image=launcher_image, timeout_seconds=timeout_seconds)
    extra = json.loads(tune_args) if tune_args else []
    optimal = tune_step(spec_path, f"{work_root}/{run_id}/tune", run_id, target, extra)
    for name, value in (optimal.get("metrics") or {}).items():
        if isinstance(value, (int, float)):
            metrics.log_metric(f"best_{name}", float(value))
    for name, value in optimal["parameters"].items():
        try:
            metrics.log_metric(f"param_{name}", float(value))
        except (TypeError, ValueError):
            metrics.metadata[f"param_{name}"] = str(value)
    return json.dumps(optimal["parameters"])
