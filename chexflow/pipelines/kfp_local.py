"""`chexflow run`: a pipeline run on this machine with kfp.local (SubprocessRunner, this
interpreter); its jobs run here (local job backend) or on the cluster of KUBECONFIG (kubernetes
backend). Without --data it generates a small NIH-format dataset from the run's --seed (the
same seed also seeds training).

With the kubernetes backend the steps here and the jobs' pods share files through the data
PVC: its folder on this machine (`pvc_host_path`, behind a hostPath or local PersistentVolume)
holds OUT, and the pods mount the PVC at that same path, so a path names the same file in both.

Layout of OUT/RUN (RUN = PIPELINE-TIMESTAMP):
  kfp/    kfp.local's pipeline root: one folder per task with executor_output.json and artifacts
  work/   the jobs' shared folder (what the data PVC is on a cluster): data/, train-wN/, evaluate/
  logs/   one log per step (STEP.log: the task's whole output) and kfp.log (kfp.local's own)
  summary.json   metrics of every task, report paths

The terminal gets one line per step as it starts and ends, a bar over training epochs and a
summary (chexflow.pipelines.console); `verbose` also shows every step's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.evaluate.report import SYNTH_MARKER, ci_words, data_provenance, mean_scope
from chexflow.folders import new_folder
from chexflow.pathologies import CHEXNET_MEAN_AUROC
from chexflow.pipelines.console import Console, step_logs
from chexflow.pipelines.registry import build, pipeline_names, run_defaults
from chexflow.processes import owned_by_this_process

SYNTH_IMAGES = 400
# After a SIGTERM, how often it goes again to the processes below the run (see
# steps_stopped_by_sigterm)
FORWARD_SECONDS = 0.5


class PipelineRunFailed(ChexflowError):
    """A local pipeline run ended with a failed task."""


class Stopped(BaseException):
    """SIGTERM arrived while no step was running (a BaseException, as KeyboardInterrupt: kfp's
    own `except Exception` must not swallow it)."""


@contextlib.contextmanager
def steps_stopped_by_sigterm() -> Iterator[list[int]]:
    """While the pipeline runs, SIGTERM to this process goes on to every process below it: the
    running steps (a component's Python runs under `sh -ec`, which dies at once) delete the jobs
    they created, as when a KFP run is terminated, and the run then fails. Between steps it
    stops the run at once. Without this, SIGTERM ends only this process, and a step waiting on
    a cluster job dies of its closed output pipe before it can delete the job. Yields the list
    of SIGTERMs received. Once one came it is sent again every FORWARD_SECONDS until the run
    ends: a step caught between its fork and its program's start loses a signal (the forked
    child still has this process's handler), and one that starts after it must get it too."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield received
        return
    ended = threading.Event()

    def terminate(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def keep_forwarding() -> None:
        while not ended.wait(FORWARD_SECONDS):
            terminate(descendants(os.getpid()))

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        running = descendants(os.getpid())
        if not running:
            raise Stopped()
        terminate(running)
        if len(received) == 1:
            threading.Thread(target=keep_forwarding, daemon=True).start()

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield received
    finally:
        ended.set()
        signal.signal(signal.SIGTERM, previous)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: children of each of its threads)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in map(int, task.read_text().split()):
                out += [child, *descendants(child)]
    return out


def synth_folder(out: Path, image_size: int, seed: int) -> Path:
    """Where a run into OUT generates its dataset (and a later run finds it)."""
    return out / f"synth-data-{image_size}px-seed{seed}"


def ensure_dataset(out: Path, image_size: int, log_dir: Path, verbose: bool = False,
                   seed: int = 0) -> Path:
    """OUT/synth-data-SIZEpx-seedSEED: generated once (NIH format) from `seed` and reused by
    later runs; the generator's output goes to LOG_DIR/synth.log (and to the terminal with
    `verbose`)."""
    from chexflow.jobs import JobSpec, run_job

    data = synth_folder(out, image_size, seed)
    marker = data / SYNTH_MARKER
    wanted = {"images": SYNTH_IMAGES, "size": image_size, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        print(f"run: reusing the generated dataset {data}")
        return data
    if data.exists() and any(data.iterdir()):
        raise ChexflowError(f"{data}: exists but is not a dataset chexflow generated; move it")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"run: generating {SYNTH_IMAGES} NIH-format images of {image_size} px in {data} "
          f"(log: {log_dir / 'synth.log'})", flush=True)
    spec = JobSpec(
        name="synth", environment="control",
        command=["chexflow", "data", "synth", "--out", str(data), "--images", str(SYNTH_IMAGES),
                 "--size", str(image_size), "--seed", str(seed)],
    )
    with open(os.devnull, "w") as quiet:  # the log file gets the output either way
        run_job(spec, stream=None if verbose else quiet, log_dir=log_dir)
    marker.write_text(json.dumps(wanted))
    print(f"run: generated in {time.monotonic() - started:.0f}s", flush=True)
    return data


def pipeline_arguments(name: str, data: Path | None, work_root: Path,
                       overrides: dict[str, Any]) -> dict[str, Any]:
    """What the pipeline gets: the local run's defaults, the options over them, the data (left
    out while it is not generated yet) and the jobs' shared folder."""
    args = {**run_defaults(name), **overrides, "work_root": str(work_root)}
    if data is not None:
        args["raw_dir"] = str(data)
    if args["backend"] == "local":
        args["data_pvc"] = ""  # nothing to mount: the jobs are processes here
    return args


def shared_folder(backend: str, pvc_host_path: Path | None, out: Path | None,
                  data: Path | None) -> tuple[Path, Path | None]:
    """(OUT, the folder the jobs' pods mount the data PVC at, or None for local jobs). With the
    kubernetes backend OUT (default PVC_HOST_PATH/runs) and --data must lie in PVC_HOST_PATH."""
    from chexflow.jobs import BACKENDS
    from chexflow.pipelines.checks import shown

    if backend not in BACKENDS:
        raise ChexflowError(f"--backend {shown(str(backend))}: expected one of "
                            f"{', '.join(BACKENDS)}")
    if backend == "local":
        if pvc_host_path is not None:
            raise ChexflowError("--pvc-host-path: only with --backend kubernetes (local jobs "
                                "use the folders as they are)")
        return Path(out or "runs").resolve(), None
    if pvc_host_path is None:
        raise ChexflowError("--backend kubernetes: needs --pvc-host-path DIR, the folder on "
                            "this machine behind --data-pvc, where the steps here and the jobs' "
                            "pods share the run's files")
    shared = pvc_host_path.resolve()
    if not shared.is_dir():
        raise ChexflowError(f"--pvc-host-path {pvc_host_path}: no such folder")
    out = Path(out or shared / "runs").resolve()
    for flag, path in (("--out", out), ("--data", data)):
        if path is not None and not path.resolve().is_relative_to(shared):
            raise ChexflowError(f"{flag} {path}: not inside --pvc-host-path {shared}, the only "
                                "folder the jobs' pods see")
    return out, shared


def print_checked(name: str, arguments: dict[str, Any], out: Path, generated: bool) -> dict:
    """`--dry-run`'s output: the checked arguments as JSON (the run's folder and generated data
    named as the run would make them); returns them."""
    shown = {**arguments, "work_root": f"{out}/{name}-YYYYmmdd-HHMMSS/work"}
    if generated:
        folder = synth_folder(out, arguments["image_size"], arguments.get("seed", 0))
        shown["raw_dir"] = f"{folder} (generated by the run unless there)"
    print(f"run: {name}: every parameter checked as its steps check them; nothing written or "
          "started (--dry-run). The pipeline's arguments:")
    print(json.dumps(shown, indent=2))
    return shown


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


def run_with_kfp_local(name: str, out: Path | None, data: Path | None,
                       overrides: dict[str, Any], verbose: bool = False,
                       pvc_host_path: Path | None = None, dry_run: bool = False) -> dict:
    """Run pipeline `name` with kfp.local; return (and write) the run summary. OUT defaults to
    ./runs, or PVC_HOST_PATH/runs with the kubernetes backend. Every argument is checked by the
    steps' rules before anything starts (chexflow.pipelines.checks); `dry_run` stops there and
    prints them. No process it starts outlives it, even if it is SIGKILLed
    (chexflow.processes.owned_by_this_process)."""
    from chexflow.pipelines.checks import check_arguments

    if name not in pipeline_names():
        raise ChexflowError(f"pipeline {name!r}: expected one of {', '.join(pipeline_names())}")
    defaults = run_defaults(name)
    backend = {**defaults, **overrides}["backend"]
    out, mount_path = shared_folder(backend, pvc_host_path, out, data)
    if data is not None and not data.exists():
        raise ChexflowError(f"--data {data}: no such folder")
    # the run's folders go under OUT: what the target step checks of its work_root holds there
    arguments = check_arguments(name, pipeline_arguments(name, data and data.resolve(), out,
                                                         overrides),
                                str(mount_path) if mount_path else None)
    if dry_run:
        return print_checked(name, arguments, out, data is None)
    run_dir = new_folder(out, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    # kfp.local starts each step with a Popen of its own, not tied to this process: without
    # this a SIGKILLed run left its running step, its job and the job's ranks running
    with owned_by_this_process():
        return _run(name, run_dir, data, overrides, verbose, backend, mount_path)


def _run(name: str, run_dir: Path, data: Path | None, overrides: dict[str, Any], verbose: bool,
         backend: str, mount_path: Path | None) -> dict:
    """The run itself, in RUN_DIR (see run_with_kfp_local)."""
    from kfp import local

    out, defaults = run_dir.parent, run_defaults(name)
    log_dir = run_dir / "logs"
    image_size = overrides.get("image_size", defaults["image_size"])
    if data is None:  # the run's seed also draws the generated data
        data = ensure_dataset(out, image_size, log_dir, verbose, overrides.get("seed", 0))
    work_root = run_dir / "work"
    if mount_path:  # the jobs' pods run as the images' user (UID 1000), not as this user
        work_root.mkdir()
        work_root.chmod(0o777)
    kfp_root = run_dir / "kfp"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(kfp_root),
               raise_on_error=True)
    arguments = pipeline_arguments(name, data.resolve(), work_root, overrides)
    pipeline = build(name, mount_path=str(mount_path) if mount_path else None)
    # what the pipeline gets: also the defaults the signature states by name (DEFAULT_PVC, ...)
    effective = {**{k: v.default for k, v in pipeline.component_spec.inputs.items()
                    if v.default is not None}, **arguments}
    where = "local job backend" if backend == "local" else (
        f"jobs on Kubernetes, namespace {effective['namespace']}, PVC {effective['data_pvc']} "
        f"at {mount_path}")
    print(f"run: {name} locally (kfp.local, {where}) in {run_dir}", flush=True)
    console = Console(log_dir, verbose, arguments.get("epochs"))
    started = time.monotonic()
    try:
        with step_logs(console), steps_stopped_by_sigterm() as stopped:
            pipeline(**arguments)
    except (RuntimeError, Stopped) as e:
        step = console.failed
        how = "stopped by SIGTERM" if stopped else "failed"
        where = f" at step {step.name}; its log: {step.log}" if step else (
            "" if stopped else f": {e}")
        raise PipelineRunFailed(f"pipeline {name} {how}{where}; outputs so far: {run_dir}") \
            from None
    tasks = collect_outputs(kfp_root)
    summary = {
        "pipeline": name, "run_dir": str(run_dir), "kfp_root": str(kfp_root),
        "work_dir": str(work_root), "logs": str(log_dir), "data": str(data),
        "provenance": data_provenance(data), "arguments": arguments,
        "wall_seconds": round(time.monotonic() - started, 1), "tasks": tasks,
        "reports": sorted(str(p) for p in work_root.glob("*/*.html")),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print_summary(summary)
    return summary


def task_metrics(summary: dict[str, Any], task: str) -> dict[str, Any]:
    """A task's logged Metrics (empty if it has none)."""
    arts = summary["tasks"].get(task, {}).get("artifacts", {})
    return (arts.get("metrics") or {}).get("metadata", {})


def task_output(summary: dict[str, Any], task: str) -> dict[str, Any]:
    """A task's returned JSON object (evaluate-op's: its auroc.json); empty if it has none."""
    text = summary["tasks"].get(task, {}).get("parameters", {}).get("Output")
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


def print_summary(summary: dict[str, Any], stream=sys.stdout) -> None:
    """Where the report is, throughput, and last the mean AUROC beside CheXNet's."""
    p = lambda *a: print(*a, file=stream)  # noqa: E731
    minutes, seconds = divmod(round(summary["wall_seconds"]), 60)
    p(f"run: {summary['pipeline']} finished in {minutes} min {seconds:02d} s; "
      f"outputs, logs and summary.json in {summary['run_dir']}")
    for report in summary["reports"]:
        p(f"  report: {report}")
    train = task_metrics(summary, "train-op")
    if "images_per_sec" in train:
        p(f"  training: {train['images_per_sec']:.1f} images/s in steady state with "
          f"{train['workers']:.0f} worker(s); {train.get('wall_seconds', 0):.0f} s in all"
          + (f", of which warm-up {train['startup_seconds']:.0f} s start-up and "
             f"{train['first_step_seconds']:.0f} s first step (building the training graph)"
             if "first_step_seconds" in train else ""))
    scaling = task_metrics(summary, "scaling-report-op")
    for key in sorted(k for k in scaling if k.startswith("images_per_sec_w")):
        w = key.removeprefix("images_per_sec_w")
        p(f"  {w} worker(s): {scaling[key]:.1f} images/s, scaling efficiency "
          f"{100 * scaling.get(f'efficiency_w{w}', float('nan')):.0f}%")
    p(f"  data: {summary['provenance']}")
    auroc = task_output(summary, "evaluate-op")
    if auroc.get("mean") is not None:
        generated = "generated" in summary["provenance"]
        p(f"run: mean test AUROC {auroc['mean']:.3f} ({ci_words(auroc)}){mean_scope(auroc)}; "
          f"CheXNet's published mean is {CHEXNET_MEAN_AUROC:.3f} on NIH ChestX-ray14"
          + ("; these data are generated, not NIH's X-rays" if generated else ""))
