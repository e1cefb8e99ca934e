"""Horovod's options reach Horovod: fp16 gradient compression and backward passes per step in a
real 2-worker run (its Horovod timeline shows float16 allreduces, one per gradient every second
step), the fusion threshold and cycle time as Horovod's variables, the default allreduce (MPI
tensor operations under horovodrun --mpi, yielding while idle) giving gloo's loss curve, the
MPIJob's allreduce environment on CPU and GPU workers, one-line refusals of bad values, and
validation of a model that diverged (float16 gradients can overflow) reporting nan rather than
failing the run."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from chexflow.bench.allreduce import gradient_steps, read_timeline
from chexflow.envs import trainer_python
from chexflow.jobs.allreduce import LOCAL_MPI_ENV, MPI_CPU_ENV, horovod_has_mpi, local_allreduce
from chexflow.jobs.render import render_mpijob
from chexflow.jobs.spec import JobSpec
from tests.conftest import REPO, read_json, run_chexflow

TINY = ("--synthetic-data", "--model", "resnet50", "--image-size", 32, "--batch-size", 4,
        "--epochs", 1, "--steps-per-epoch", 4, "--warmup-steps", 1, "--workers", 2,
        "--threads", 1, "--validation-steps", 1)


def timeline_allreduces(path: Path) -> dict[str, tuple[int, set[str]]]:
    """Horovod timeline -> {allreduced tensor: (allreduces, dtypes)}."""
    events = read_timeline(path)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    counts: collections.Counter = collections.Counter()
    dtypes: dict[str, set[str]] = collections.defaultdict(set)
    for e in events:
        name = names.get(e.get("pid"), "")
        if "Allreduce" not in name:
            continue
        if e.get("ph") == "B" and e.get("name") == "NEGOTIATE_ALLREDUCE":
            counts[name] += 1
        if "dtype" in e.get("args", {}):
            dtypes[name].add(e["args"]["dtype"])
    return {n: (counts[n], dtypes[n]) for n in counts}


@pytest.mark.trainer
@pytest.mark.slow
def test_fp16_allreduce_and_backward_passes_reach_horovod(tmp_path):
    timeline = tmp_path / "timeline.json"
    out = tmp_path / "run"
    run_chexflow("train", *TINY, "--controller", "gloo", "--fp16-allreduce",
                 "--backward-passes-per-step", 2, "--fusion-threshold-mb", 32, "--cycle-time-ms",
                 10, "--out", out,
                 env={"HOROVOD_TIMELINE": str(timeline)}, timeout=1800)
    m = read_json(out / "metrics.json")
    assert m["workers"] == 2 and m["images_per_sec"] > 0
    assert m["horovod"] == {"controller": "gloo", "cpu_operations": "gloo", "fp16_allreduce": True,
                            "backward_passes_per_step": 2, "fusion_threshold_bytes": 32 * 2**20,
                            "cycle_time_ms": 10.0}
    allreduces = timeline_allreduces(timeline)
    gradients = {n: v for n, v in allreduces.items() if "DistributedAdam_Allreduce" in n}
    assert len(gradients) > 200, sorted(allreduces)[:5]  # ResNet-50's 214 trainable tensors
    assert {count for count, _ in gradients.values()} == {2}  # 4 steps / 2 backward passes
    assert set().union(*(d for _, d in gradients.values())) == {"float16"}
    assert m["last_epoch"]["val_images"] == 8  # the synthetic run validates as a real one
    # the bench's allreduce account reads the same timeline: one record per step, every
    # gradient tensor in it, ResNet-50's ~23.6 M float16 gradients, phases inside the allreduce
    steps = gradient_steps(read_timeline(timeline))
    assert len(steps) == 2 and {s["tensors"] for s in steps} == {len(gradients)}
    assert all(44e6 < s["bytes"] < 50e6 for s in steps), steps
    assert all(s["allreduce_ms"] >= s["reduce_ms"] > 0 and s["copy_in_ms"] > 0 for s in steps)


@pytest.mark.trainer
@pytest.mark.parametrize("args, error", [
    (("--backward-passes-per-step", 0), "--backward-passes-per-step 0: must be >= 1"),
    (("--cycle-time-ms", 0), "--cycle-time-ms 0.0: must be > 0"),
    (("--fusion-threshold-mb", -1), "--fusion-threshold-mb -1.0: must be >= 0"),
])
def test_bad_horovod_option_values_are_refused_in_one_line(tmp_path, args, error):
    proc = run_chexflow("train", *TINY, *args, "--out", tmp_path / "run", check=False)
    assert proc.returncode == 2 and error in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.trainer
def test_mpi_controller_without_mpirun_is_refused_in_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = run_chexflow("train", *TINY, "--controller", "mpi", "--out", tmp_path / "run",
                        check=False, env={"PATH": str(empty)})
    assert proc.returncode == 2
    assert "--controller mpi: no mpirun on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


DIVERGED = """
import json, math
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from tensorflow import keras
from chexflow.train.callbacks import ValidationAUROC

hvd.init()
x = keras.Input((4, 4, 1), dtype="uint8")
nan = keras.layers.Lambda(lambda t: tf.fill([tf.shape(t)[0], 2], float("nan")))(x)
model = keras.Model(x, nan)
labels = np.array([[0, 1], [1, 0], [0, 1], [1, 0]], np.float32)
ds = tf.data.Dataset.from_tensors((np.zeros((4, 4, 4, 1), np.uint8), labels,
                                   np.ones_like(labels), np.array([b"a", b"b", b"c", b"d"])))
callback = ValidationAUROC(ds, 4, 2)
callback.set_model(model)
logs = {}
callback.on_epoch_end(0, logs)
print(json.dumps({k: None if math.isnan(v) else v for k, v in logs.items()}))
"""


@pytest.mark.trainer
def test_a_diverged_model_validates_to_nan_instead_of_failing():
    proc = subprocess.run([str(trainer_python()), "-c", DIVERGED], capture_output=True,
                          text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    logs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert logs == {"val_loss": None, "val_auroc": None, "val_images": 4}


@pytest.mark.trainer
@pytest.mark.slow
def test_the_default_allreduce_is_mpi_with_yield_and_gives_gloos_loss_curve(tmp_path):
    """The default launch (no --controller) runs the ranks under mpirun with MPI tensor
    operations and OpenMPI yielding while idle; that changes speed, not results: the same
    2-worker run over 3 epochs of 2 steps has --controller gloo's losses within float
    tolerance."""
    assert shutil.which("mpirun"), "no mpirun: images/install-system.sh installs openmpi-bin"
    curve, horovod = {}, {}
    for name, args in (("default", ()), ("gloo", ("--controller", "gloo"))):
        out = tmp_path / name
        proc = run_chexflow("train", *TINY, "--epochs", 3, "--steps-per-epoch", 2, *args,
                            "--out", out, timeout=1800)
        launch = next(line for line in proc.stdout.splitlines() if line.startswith("launch: "))
        m = read_json(out / "metrics.json")
        curve[name] = [(h["loss"], h["val_loss"]) for h in m["history"]]
        horovod[name] = (launch, m["horovod"]["controller"], m["horovod"]["cpu_operations"])
    default_launch = horovod["default"][0]
    assert default_launch.startswith(
        "launch: HOROVOD_CPU_OPERATIONS=MPI OMPI_MCA_mpi_yield_when_idle=1 ")
    assert " --mpi " in default_launch and horovod["default"][1:] == ("mpi", "mpi")
    assert " --gloo " in horovod["gloo"][0] and "HOROVOD_CPU_OPERATIONS" not in horovod["gloo"][0]
    assert horovod["gloo"][1:] == ("gloo", "gloo")
    assert len(curve["default"]) == 3
    assert np.allclose(curve["default"], curve["gloo"], rtol=1e-5, atol=1e-6), curve


def test_without_mpi_the_default_falls_back_to_gloo_with_a_note(tmp_path, monkeypatch):
    """No mpirun on PATH, or a Horovod whose library does not link libmpi: gloo, and why."""
    python = trainer_python()
    assert horovod_has_mpi(python)  # the project's build (images/install-trainer.sh)
    monkeypatch.setenv("PATH", str(tmp_path))
    no_mpirun = local_allreduce(None, python)
    assert no_mpirun.controller == "gloo" and not no_mpirun.env
    assert no_mpirun.note.startswith("allreduce over gloo: no mpirun on PATH")
    fake = tmp_path / "venv"
    lib = fake / "horovod" / "tensorflow"
    lib.mkdir(parents=True)
    (lib / "mpi_lib.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\0libgloo.so\0" * 10)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {fake / 'horovod'}\n")
    python.chmod(0o755)
    assert not horovod_has_mpi(python)
    # asked for: no fallback; no libfabric provider for OpenMPI's ofi btl on either
    assert local_allreduce("mpi", python).env == {**MPI_CPU_ENV, **LOCAL_MPI_ENV}
    assert local_allreduce("mpi", python, gpus=1).env == LOCAL_MPI_ENV  # GPU ranks keep NCCL


def test_cpu_mpijobs_get_mpi_tensor_operations_and_gpu_mpijobs_keep_nccl():
    """A CPU-only MPIJob's ranks get MPI tensor operations and yield when idle, forwarded by
    the launcher's mpirun (-x); a GPU job's get neither (NCCL); the user's env wins."""
    command = ["python", "-m", "chexflow.train.worker"]

    def containers(job):
        return [job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
                for role in ("Launcher", "Worker")]

    for gpus, expected in ((0, MPI_CPU_ENV), (1, {})):
        job = render_mpijob(JobSpec(name="j", command=command, workers=2, horovod=True,
                                    gpus_per_worker=gpus))
        for container in containers(job):
            env = {e["name"]: e["value"] for e in container["env"]}
            assert {k: env[k] for k in env if k in MPI_CPU_ENV} == expected, gpus
        launcher = containers(job)[0]["command"]
        forwarded = {launcher[i + 1] for i, w in enumerate(launcher) if w == "-x"}
        assert set(expected) <= forwarded
    mine = render_mpijob(JobSpec(name="j", command=command, workers=2, horovod=True,
                                 env={"HOROVOD_CPU_OPERATIONS": "gloo"}))
    launcher = containers(mine)[0]
    assert {"name": "HOROVOD_CPU_OPERATIONS", "value": "gloo"} in launcher["env"]
    assert launcher["command"].count("HOROVOD_CPU_OPERATIONS") == 1
    assert launcher["command"][launcher["command"].index("HOROVOD_CPU_OPERATIONS") - 1] == "-x"
