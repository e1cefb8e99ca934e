"""`chexflow run`: a pipeline run on this machine with kfp.local (SubprocessRunner, this
interpreter) and the local job backend. Without --data it generates a small NIH-format dataset.

Layout of OUT/RUN (RUN = PIPELINE-TIMESTAMP):
  kfp/    kfp.local's pipeline root: one folder per task with executor_output.json and artifacts
  work/   the jobs' shared folder (what the data PVC is on a cluster): data/, train-wN/, evaluate/
  summary.json   metrics of every task, report paths
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.pipelines.registry import build, pipeline_names

# Small defaults that finish in a few minutes on 2 CPU cores.
LOCAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "chexnet-train": {"model": "densenet121", "workers": 2, "gpus_per_worker": 0,
                      "epochs": 2, "batch_size": 16, "image_size": 64, "weights": "none",
                      "bootstrap": 200, "timeout_seconds": 3600},
    "scaling-study": {"model": "resnet50", "worker_counts": [1, 2], "gpus_per_worker": 0,
                      "epochs": 1, "batch_size": 8, "image_size": 64, "steps_per_epoch": 8,
                      "synthetic_data": True, "timeout_seconds": 3600},
    "tune-then-train": {"model": "densenet121", "workers": 1, "gpus_per_worker": 0,
                        "epochs": 1, "batch_size": 16, "image_size": 64, "weights": "none",
                        "bootstrap": 200, "timeout_seconds": 7200},
}
SYNTH_IMAGES, SYNTH_SEED = 400, 0


class PipelineRunFailed(ChexflowError):
    """A local pipeline run ended with a failed task."""


def ensure_dataset(out: Path, image_size: int) -> Path:
    """OUT/synth-data: generated once (NIH format) and reused by later runs."""
    from chexflow.jobs import JobSpec, run_job

    data = out / f"synth-data-{image_size}px"
    marker = data / "synth.json"
    wanted = {"images": SYNTH_IMAGES, "size": image_size, "seed": SYNTH_SEED}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        print(f"run: reusing generated dataset {data}")
        return data
    if data.exists() and any(data.iterdir()):
        raise ChexflowError(f"{data}: exists but is not a dataset chexflow generated; move it")
    run_job(JobSpec(
        name="synth", environment="control",
        command=["chexflow", "data", "synth", "--out", str(data), "--images", str(SYNTH_IMAGES),
                 "--size", str(image_size), "--seed", str(SYNTH_SEED)],
    ))
    marker.write_text(json.dumps(wanted))
    return data


def pipeline_arguments(name: str, data: Path, work_root: Path,
                       overrides: dict[str, Any]) -> dict[str, Any]:
    args = {**LOCAL_DEFAULTS[name], **overrides}
    args.update(raw_dir=str(data), work_root=str(work_root), backend="local", data_pvc="")
    return args


def collect_outputs(kfp_root: Path) -> dict[str, Any]:
    """Every task's output parameters and artifact metadata (Metrics live there locally)."""
    tasks: dict[str, Any] = {}
    for path in sorted(kfp_root.glob("*/*/executor_output.json")):
        out = json.loads(path.read_text())
        task = path.parent.name
        entry: dict[str, Any] = {"dir": str(path.parent)}
        params = out.get("parameterValues") or {}
        if params:
            entry["parameters"] = params
        for art_name, arts in (out.get("artifacts") or {}).items():
            for art in arts.get("artifacts", []):
                entry.setdefault("artifacts", {})[art_name] = {
                    "uri": art.get("uri"), "metadata": art.get("metadata", {}),
                }
        tasks[task] = entry
    return tasks


def run_local(name: str, out: Path, data: Path | None, overrides: dict[str, Any]) -> dict:
    """Run pipeline `name` with kfp.local; return (and write) the run summary."""
    from kfp import local

    if name not in pipeline_names():
        raise ChexflowError(f"pipeline {name!r}: expected one of {', '.join(pipeline_names())}")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir()
    image_size = overrides.get("image_size", LOCAL_DEFAULTS[name]["image_size"])
    if data is None:
        data = ensure_dataset(out, image_size)
    elif not data.exists():
        raise ChexflowError(f"--data {data}: no such folder")
    work_root = run_dir / "work"
    kfp_root = run_dir / "kfp"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(kfp_root),
               raise_on_error=True)
    arguments = pipeline_arguments(name, data.resolve(), work_root, overrides)
    print(f"run: {name} locally (kfp.local, local job backend) in {run_dir}", flush=True)
    started = time.monotonic()
    try:
        build(name)(**arguments)
    except RuntimeError as e:
        raise PipelineRunFailed(
            f"pipeline {name} failed: {e}; the failing task's log is above (its job's log tail "
            f"follows '--- log tail ---'); outputs so far: {run_dir}"
        ) from None
    tasks = collect_outputs(kfp_root)
    summary = {
        "pipeline": name, "run_dir": str(run_dir), "kfp_root": str(kfp_root),
        "work_dir": str(work_root), "data": str(data), "arguments": arguments,
        "wall_seconds": round(time.monotonic() - started, 1), "tasks": tasks,
        "reports": sorted(str(p) for p in work_root.glob("*/*.html")),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any], stream=sys.stdout) -> None:
    p = lambda *a: print(*a, file=stream)  # noqa: E731
    p(f"\nrun: {summary['pipeline']} finished in {summary['wall_seconds']}s")
    p(f"  artifacts (kfp.local pipeline root): {summary['kfp_root']}")
    p(f"  job outputs (data, models, evaluation): {summary['work_dir']}")
    for task, entry in summary["tasks"].items():
        for art_name, art in entry.get("artifacts", {}).items():
            numbers = {k: v for k, v in art["metadata"].items() if isinstance(v, (int, float))}
            if numbers and art_name in ("metrics",):
                shown = ", ".join(f"{k}={v:.4g}" for k, v in list(numbers.items())[:12])
                p(f"  metrics [{task}]: {shown}")
    for report in summary["reports"]:
        p(f"  report: {report}")
    p(f"  summary: {summary['run_dir']}/summary.json")
