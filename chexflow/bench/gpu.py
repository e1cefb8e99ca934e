"""`chexflow bench --gpu`: ResNet-50 and DenseNet-121 at 224 px on one GPU, AMP and XLA on and
off, synthetic and real data, a batch-size sweep; printed like tf_cnn_benchmarks and written as
bench-gpu.json, bench-gpu.md and bench-gpu.png."""

from __future__ import annotations

import itertools
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from chexflow.bench.core import machine
from chexflow.bench.training import train_command
from chexflow.envs import trainer_python
from chexflow.errors import ChexflowError

# TensorFlow logs this (once per process) when XLA auto-clustering compiled a cluster
XLA_COMPILED = "Compiled cluster using XLA"


def gpu_count() -> int:
    """GPUs TensorFlow sees in the trainer environment."""
    proc = subprocess.run(
        [str(trainer_python()), "-c",
         "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"],
        capture_output=True, text=True, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )
    lines = proc.stdout.strip().splitlines()
    return int(lines[-1]) if proc.returncode == 0 and lines else 0


def require_gpu() -> int:
    n = gpu_count()
    if n == 0:
        raise ChexflowError(
            "--gpu: TensorFlow in the trainer environment sees no GPU on this machine. Run it "
            "on a GPU node with the trainer image, or a trainer environment built with "
            "TF_PACKAGE='tensorflow[and-cuda]==2.15.1' images/install-trainer.sh .venv-trainer"
        )
    return n


@dataclass(frozen=True)
class SweepPlan:
    """Which `chexflow train` runs the sweep makes: every combination of the tuples."""

    models: tuple[str, ...] = ("resnet50", "densenet121")
    batches: tuple[int, ...] = (32, 64, 128, 256)
    amp: tuple[bool, ...] = (False, True)
    xla: tuple[bool, ...] = (False, True)
    synthetic: tuple[bool, ...] = (True, False)
    image_size: int = 224
    steps: int = 100
    warmup_steps: int = 10

    @classmethod
    def quick(cls) -> SweepPlan:
        return cls(batches=(64,), steps=20)


def sweep(work: Path, data: Path, plan: SweepPlan) -> list[dict]:
    """Every combination, each a real one-worker `chexflow train` run; returns their rows."""
    rows = []
    for model, amp, xla, synthetic, batch in itertools.product(
        plan.models, plan.amp, plan.xla, plan.synthetic, plan.batches
    ):
        out = work / f"{model}-b{batch}-amp{int(amp)}-xla{int(xla)}-syn{int(synthetic)}"
        extra = ("--warmup-steps", str(plan.warmup_steps), *["--amp"] * amp, *["--xla"] * xla)
        cmd = train_command(out, data, model=model, size=plan.image_size, batch=batch,
                            steps=plan.steps, synthetic=synthetic, extra=extra)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        row = {"model": model, "batch": batch, "amp": amp, "xla": xla, "synthetic": synthetic}
        if proc.returncode != 0:
            row["error"] = proc.stderr.strip().splitlines()[-1:] or ["failed"]
        else:
            m = json.loads((out / "metrics.json").read_text())
            row.update({k: m[k] for k in ("images_per_sec", "jitter", "step_time_ms")})
            row["xla_compiled"] = XLA_COMPILED in proc.stdout + proc.stderr
        rows.append(row)
        print(tf_cnn_line(row), flush=True)
    return rows


def label(row: dict) -> str:
    return (f"{row['model']} amp={int(row['amp'])} xla={int(row['xla'])} "
            f"{'synthetic' if row['synthetic'] else 'real'}")


def tf_cnn_line(row: dict) -> str:
    head = (f"{row['model']:<12} batch {row['batch']:>4} amp={int(row['amp'])} "
            f"xla={int(row['xla'])} {'synthetic' if row['synthetic'] else 'real     '}")
    if "error" in row:
        return f"{head}  FAILED: {row['error'][0]}"
    return (f"{head}  total images/sec: {row['images_per_sec']:.2f} "
            f"+/- {row['jitter']:.2f} (jitter)  step {row['step_time_ms']:.1f} ms")


def markdown(rows: list[dict], gpus: int, host: dict) -> str:
    lines = [
        f"Measured on {gpus} GPU(s), {host['cpus']} CPUs, {host['platform']}, {host['when']}.",
        "",
        "| model | batch | AMP | XLA | data | images/s | jitter | step ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        data = "synthetic" if r["synthetic"] else "TFRecords"
        speed = ("FAILED | | " if "error" in r else
                 f"{r['images_per_sec']:.1f} | {r['jitter']:.1f} | {r['step_time_ms']:.1f} ")
        xla = "off" if not r["xla"] else "on" if r.get("xla_compiled") else "on (not compiled)"
        lines.append(f"| {r['model']} | {r['batch']} | {'on' if r['amp'] else 'off'} | "
                     f"{xla} | {data} | {speed}|")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """Images/s against batch size, one line per model, AMP, XLA and data source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        ok = [r for r in rows if r["model"] == model and "error" not in r]
        for name in sorted({label(r) for r in ok}):
            line = sorted((r["batch"], r["images_per_sec"]) for r in ok if label(r) == name)
            ax.plot(*zip(*line, strict=True), marker="o",
                    label=name.removeprefix(model + " "))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size per GPU")
        ax.set_ylabel("images/s")
        ax.set_title(model)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: list[dict], out: Path, gpus: int, plan: SweepPlan) -> dict:
    """bench-gpu.json, bench-gpu.md and bench-gpu.png in `out`; returns the JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    host = machine()
    doc = {"machine": host, "gpus": gpus, "plan": asdict(plan), "runs": rows}
    (out / "bench-gpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "bench-gpu.md").write_text(markdown(rows, gpus, host))
    plot(rows, out / "bench-gpu.png")
    return doc
