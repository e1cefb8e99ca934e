"""What `chexflow run` prints: one line per pipeline step as it starts and as it ends (time, key
metrics, its log file), a progress bar over training epochs, and for a failed step the last lines
of its log. Each step's full output goes to LOGS/STEP.log; `--verbose` also shows it.

kfp.local runs each task in a subprocess and prints the task's output, and its own logging, to
sys.stdout from the thread that runs the task (tasks of a ParallelFor run in threads). While a
pipeline runs, sys.stdout and sys.stderr are a TaskStreams, which sends each write to the log
file of the task its thread runs; `step_logs` wraps kfp.local's task dispatcher to open and close
those files around each task."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

TAIL_LINES = 20
EPOCH_LINE = re.compile(r"\bepoch=(\d+)\b(.*)")
EPOCH_SHOWN = ("loss", "val_loss", "val_auroc")
# The last line of a component's traceback: `chexflow.jobs.spec.JobFailed: job ...: exited ...`
ERROR_LINE = re.compile(
    r"^\s*((?:[a-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Failed|Timeout|Interrupt))): (.+)$")
# kfp.local's own log lines (`12:16:02.123 - INFO - ...`), horizontal rules and blank lines
KFP_NOISE = re.compile(r"^\s*(\d\d:\d\d:\d\d\.\d+ - [A-Z]+ - .*|-*)\s*$")
TRACEBACK_HEAD = "Traceback (most recent call last):"
TRACEBACK_FRAME = re.compile(r'^\s*File ".*", line \d+')
KEY_METRICS = ("train_images", "val_images", "test_images", "val_auroc", "val_loss",
               "images_per_sec", "auroc_mean", "auroc_ci_low", "auroc_ci_high")
SHOWN_PREFIXES = ("images_per_sec_w", "efficiency_w", "best_")


@dataclass
class Step:
    """One running kfp.local task: its log file and, for training, its epoch bar."""

    name: str
    log: Path
    file: TextIO
    started: float
    bar: Any = None
    partial: str = ""


class TaskStreams(io.TextIOBase):
    """sys.stdout/sys.stderr during a pipeline run: a write goes to the log of the task its
    thread runs (anything else to the run's own log), and with `verbose` also to the terminal."""

    def __init__(self, terminal: TextIO, run_log: TextIO, verbose: bool):
        self.terminal, self.run_log, self.verbose = terminal, run_log, verbose
        self.local = threading.local()

    def writable(self) -> bool:
        return True

    @property
    def step(self) -> Step | None:
        return getattr(self.local, "step", None)

    def write(self, text: str) -> int:
        step = self.step
        (step.file if step else self.run_log).write(text)
        if self.verbose:
            self.terminal.write(text)
        elif step is not None and step.bar is not None:
            watch_epochs(step, text)
        return len(text)

    def flush(self) -> None:
        step = self.step
        (step.file if step else self.run_log).flush()
        self.terminal.flush()


def watch_epochs(step: Step, text: str) -> None:
    """Advance the step's bar on each `epoch=N loss=...` line (the trainer's Katib lines)."""
    lines = (step.partial + text).split("\n")
    step.partial = lines.pop()
    for line in lines:
        match = EPOCH_LINE.search(line)
        if not match:
            continue
        epoch = int(match.group(1))
        values = dict(kv.split("=", 1) for kv in match.group(2).split() if "=" in kv)
        shown = [f"{k}={float(values[k]):.3f}" for k in EPOCH_SHOWN if k in values]
        step.bar.set_postfix_str(" ".join(shown), refresh=False)
        step.bar.update(max(0, epoch - step.bar.n))


def key_metrics(outputs: dict[str, Any]) -> str:
    """`name=value ...` of a finished task's most telling numbers (Metrics/Dataset metadata)."""
    numbers: dict[str, float] = {}
    for value in outputs.values():
        for k, v in (getattr(value, "metadata", None) or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                numbers[k] = v
    keys = [k for k in KEY_METRICS if k in numbers]
    keys += [k for k in numbers if k.startswith(SHOWN_PREFIXES)]
    return " ".join(f"{k}={numbers[k]:.4g}" for k in keys)


def log_tail(log: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines of a step's log, without kfp.local's own status lines and the
    frames of Python tracebacks (the error line itself is kept)."""
    kept: list[str] = []
    frame_indent = None  # inside a traceback frame: its `File ...` line's indentation
    for line in log.read_text(errors="replace").splitlines():
        indent = len(line) - len(line.lstrip())
        if frame_indent is not None and indent > frame_indent:
            continue  # the frame's source line and its ^^^ markers
        frame_indent = None
        if TRACEBACK_FRAME.match(line):
            frame_indent = indent
        elif not KFP_NOISE.match(line) and line.strip() != TRACEBACK_HEAD:
            kept.append(line)
    return kept[-lines:]


def failure_cause(log: Path) -> str:
    """The failed component's error message (the last exception line of its traceback)."""
    causes = [m for line in log.read_text(errors="replace").splitlines()
              if (m := ERROR_LINE.match(line))]
    # chexflow's own errors say what is wrong (a job's log tail may follow them); else name the
    # last exception
    ours = [m.group(3) for m in causes if m.group(1).startswith("chexflow.")]
    if ours:
        return ours[-1]
    return f"{causes[-1].group(2)}: {causes[-1].group(3)}" if causes else "see its log"


def clock() -> str:
    return time.strftime("%H:%M:%S")


class Console:
    """Step lines, bars and failure tails for one `chexflow run`."""

    def __init__(self, log_dir: Path, verbose: bool, epochs: int | None,
                 terminal: TextIO | None = None):
        self.log_dir, self.verbose, self.epochs = log_dir, verbose, epochs
        self.terminal = terminal or sys.stdout
        self.failed: Step | None = None
        self.lock = threading.Lock()

    def say(self, line: str) -> None:
        with self.lock:
            print(line, file=self.terminal, flush=True)

    def open_step(self, name: str) -> Step:
        with self.lock:
            log = self.log_dir / f"{name}.log"
            n = 2
            while log.exists():
                log, n = self.log_dir / f"{name}-{n}.log", n + 1
            step = Step(name, log, open(log, "w"), time.monotonic())  # noqa: SIM115
        self.say(f"[{clock()}] {name}: started (log: {log})")
        if name.startswith("train-op") and not self.verbose and self.epochs:
            from tqdm import tqdm

            step.bar = tqdm(total=self.epochs, desc=f"  {name}", unit="epoch",
                            file=self.terminal, leave=True, dynamic_ncols=True)
        return step

    def close_step(self, step: Step, outputs: dict[str, Any] | None, ok: bool) -> None:
        step.file.close()
        if step.bar is not None:
            step.bar.close()
        seconds = time.monotonic() - step.started
        if ok:
            metrics = key_metrics(outputs or {})
            self.say(f"[{clock()}] {step.name}: done in {seconds:.0f}s"
                     + (f"  {metrics}" if metrics else ""))
            return
        self.failed = step
        tail = log_tail(step.log)
        self.say(f"[{clock()}] {step.name}: FAILED after {seconds:.0f}s: "
                 f"{failure_cause(step.log)}")
        if not self.verbose:
            self.say(f"--- last {len(tail)} lines of {step.log} ---\n" + "\n".join(tail)
                     + "\n---")


@contextlib.contextmanager
def step_logs(console: Console) -> Iterator[None]:
    """Route kfp.local's task output to per-step logs (see the module docstring)."""
    from kfp.local import executor_input_utils, status, task_dispatcher

    console.log_dir.mkdir(parents=True, exist_ok=True)
    original = task_dispatcher.run_single_task_implementation

    def run_task(*args: Any, **kwargs: Any):
        name = executor_input_utils.get_local_task_resource_name(kwargs["component_name"])
        step = console.open_step(name)
        streams.local.step = step
        outputs, ok = None, False
        try:
            outputs, task_status = original(*args, **kwargs)
            ok = task_status == status.Status.SUCCESS
            return outputs, task_status
        finally:
            streams.local.step = None
            console.close_step(step, outputs, ok)

    with open(console.log_dir / "kfp.log", "a") as run_log:
        streams = TaskStreams(console.terminal, run_log, console.verbose)
        task_dispatcher.run_single_task_implementation = run_task
        try:
            with contextlib.redirect_stdout(streams), contextlib.redirect_stderr(streams):
                yield
        finally:
            task_dispatcher.run_single_task_implementation = original
