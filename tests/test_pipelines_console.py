"""What `chexflow run` prints (chexflow.pipelines.console), with real kfp.local pipelines of
small components: step lines, the epoch bar, per-step log files, a failed step's log tail."""

import io
import json
from pathlib import Path

import pytest
from kfp import dsl, local

from chexflow.pipelines.console import Console, failure_cause, key_metrics, log_tail, step_logs


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def train_op(epochs: int, metrics: dsl.Output[dsl.Metrics]) -> int:
    for epoch in range(1, epochs + 1):
        print(f"[0]<stdout>:epoch={epoch} val_auroc={0.5 + epoch / 10} loss={2 / epoch}")
    metrics.log_metric("val_auroc", 0.8)
    metrics.log_metric("images_per_sec", 12.5)
    return epochs


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def broken_op(epochs: int):
    for line in range(30):
        print(f"working on part {line}")
    raise ValueError(f"part 30 of {epochs} is unreadable")


@dsl.pipeline
def good(epochs: int = 3):
    train_op(epochs=epochs)


@dsl.pipeline
def bad(epochs: int = 3):
    broken_op(epochs=train_op(epochs=epochs).outputs["Output"])


def run(pipeline, tmp_path: Path, verbose: bool = False) -> tuple[Console, str]:
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    terminal = io.StringIO()
    console = Console(tmp_path / "logs", verbose, epochs=3, terminal=terminal)
    try:
        with step_logs(console):
            pipeline()
    except RuntimeError:
        pass
    return console, terminal.getvalue()


def test_quiet_run_prints_step_lines_and_an_epoch_bar_and_logs_to_files(tmp_path):
    console, out = run(good, tmp_path)
    log = tmp_path / "logs" / "train-op.log"
    assert f"train-op: started (log: {log})" in out
    assert "train-op: done in" in out and "val_auroc=0.8 images_per_sec=12.5" in out
    assert "3/3" in out and "loss=0.667" in out  # the bar, at its last epoch
    assert "epoch=2" not in out and "Executing task" not in out
    assert "epoch=2 val_auroc=0.7" in log.read_text() and "Executing task" in log.read_text()
    assert console.failed is None and len(out.split("\n")) < 10


def test_verbose_run_also_shows_the_task_output(tmp_path):
    _, out = run(good, tmp_path, verbose=True)
    assert "epoch=2 val_auroc=0.7" in out and "train-op: done in" in out
    assert "epoch=2 val_auroc=0.7" in (tmp_path / "logs" / "train-op.log").read_text()


def test_failed_step_prints_its_error_and_last_20_log_lines(tmp_path):
    console, out = run(bad, tmp_path)
    assert console.failed is not None and console.failed.name == "broken-op"
    assert "broken-op: FAILED after" in out and "ValueError: part 30 of 3 is unreadable" in out
    tail = out.split(f"--- last 20 lines of {console.failed.log} ---\n")[1].split("\n")
    assert "working on part 29" in tail[18] and "part 30 of 3 is unreadable" in tail[19]
    assert "working on part 10" not in out and 'File "' not in out  # no traceback frames


def test_log_tail_and_cause_skip_kfp_status_lines_and_traceback_frames(tmp_path):
    log = tmp_path / "step.log"
    log.write_text("\n".join([
        "    job output 1", "    Traceback (most recent call last):",
        '      File "/x/steps.py", line 3, in run', "        run(spec)", "        ^^^^^^^^^",
        "    chexflow.jobs.spec.JobFailed: job train-w1: exited with status 2 after 3s",
        "    --- log tail ---", "    RuntimeError: Horovod detected a failure", "",
        "12:27:50.120 - ERROR - Task 'train-op' finished with status FAILURE", "-" * 80,
    ]))
    assert log_tail(log) == [
        "    job output 1",
        "    chexflow.jobs.spec.JobFailed: job train-w1: exited with status 2 after 3s",
        "    --- log tail ---", "    RuntimeError: Horovod detected a failure"]
    assert failure_cause(log) == "job train-w1: exited with status 2 after 3s"


def test_key_metrics_pick_the_telling_numbers():
    class Artifact:
        metadata = {"auroc_mean": 0.91234, "auroc_Hernia": 1.0, "images_per_sec_w2": 14.4,
                    "data_dir": "/x", "flag": True}

    assert key_metrics({"metrics": Artifact(), "Output": "text"}) == \
        "auroc_mean=0.9123 images_per_sec_w2=14.4"


@pytest.mark.parametrize("name", ["evaluate-op", "train-op"])
def test_step_logs_are_not_overwritten_by_a_second_task_of_the_same_name(tmp_path, name):
    console = Console(tmp_path, verbose=False, epochs=None, terminal=io.StringIO())
    first, second = console.open_step(name), console.open_step(name)
    console.close_step(first, {}, True)
    console.close_step(second, {}, True)
    assert (first.log.name, second.log.name) == (f"{name}.log", f"{name}-2.log")


def test_summary_prints_steady_state_images_per_sec_apart_from_the_warm_up():
    from chexflow.pipelines.kfp_local import print_summary

    train = {"images_per_sec": 61.23, "workers": 2.0, "wall_seconds": 98.4,
             "startup_seconds": 17.2, "first_step_seconds": 35.6}
    summary = {"pipeline": "chexnet-train", "wall_seconds": 140.0, "run_dir": "/r", "reports": [],
               "provenance": "generated", "tasks": {"train-op": {"artifacts": {
                   "metrics": {"metadata": train}}}}}
    out = io.StringIO()
    print_summary(summary, out)
    assert ("  training: 61.2 images/s in steady state with 2 worker(s); 98 s in all, of which "
            "warm-up 17 s start-up and 36 s first step (building the training graph)\n"
            ) in out.getvalue()


def _evaluated(auroc: dict) -> dict:
    """A run summary whose evaluate-op returned AUROC (its auroc.json) and logged its Metrics
    as evaluate_op does (finite values only)."""
    logged = {f"auroc_{k}": auroc[k] for k in ("mean", "ci_low", "ci_high")
              if auroc.get(k) is not None}
    return {"pipeline": "chexnet-train", "wall_seconds": 140.0, "run_dir": "/r", "reports": [],
            "provenance": "generated", "tasks": {"evaluate-op": {
                "parameters": {"Output": json.dumps(auroc)},
                "artifacts": {"metrics": {"metadata": logged}}}}}


def test_summary_line_says_bootstrap_0_drew_no_ci_and_which_classes_left_the_mean():
    """--bootstrap 0 (evaluate's "no CI") printed "95% CI nan-nan"; a class whose test labels
    are all one value left the mean (nanmean) unsaid."""
    from chexflow.pipelines.kfp_local import print_summary

    per_class = {"Atelectasis": {"positives": 3, "negatives": 5},
                 "Hernia": {"positives": 0, "negatives": 8},
                 "Mass": {"positives": 8, "negatives": 0}}
    auroc = {"classes": list(per_class), "per_class": per_class, "mean": 0.75, "ci_low": None,
             "ci_high": None, "skipped_classes": ["Hernia", "Mass"],
             "bootstrap": {"resamples": 0, "seed": 0, "percentiles": [2.5, 97.5]}}
    out = io.StringIO()
    print_summary(_evaluated(auroc), out)
    line = out.getvalue().splitlines()[-1]
    assert line.startswith(
        "run: mean test AUROC 0.750 (no CI: --bootstrap 0 draws no resamples) over 1 of 3 "
        "classes, leaving out Hernia (no positive image), Mass (no negative image); "
        "CheXNet's published mean is"), line
    out = io.StringIO()
    print_summary(_evaluated({**auroc, "ci_low": 0.6, "ci_high": 0.9, "skipped_classes": [],
                              "bootstrap": {"resamples": 200}}), out)
    assert out.getvalue().splitlines()[-1].startswith(
        "run: mean test AUROC 0.750 (95% CI 0.600-0.900); CheXNet's")
