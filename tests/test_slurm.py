"""`chexflow slurm render|submit`: the rendered sbatch script, and a real single-node Slurm
(munged + slurmctld + slurmd on localhost) running 2 Horovod ranks of training."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import read_json, run_chexflow
from tests.support.slurm import LocalSlurm, missing_requirements

TRAIN = ["--model", "densenet121", "--epochs", 1, "--batch-size", 4, "--image-size", 64,
         "--steps-per-epoch", 2]


def command_of(script: str) -> list[str]:
    """The launch command of a rendered script (its last logical line), as words."""
    logical = script.replace("\\\n", " ").strip().splitlines()[-1]
    return shlex.split(logical)


def sbatch_options(script: str) -> dict[str, str]:
    return dict(
        line[len("#SBATCH --"):].split("=", 1)
        for line in script.splitlines() if line.startswith("#SBATCH --")
    )


def render(tmp_path: Path, data: Path, *extra, name: str = "run") -> tuple[Path, str]:
    out = tmp_path / name
    run_chexflow("slurm", "render", "--out", out, "--data", data, *TRAIN, *extra)
    script = out / "job.sbatch"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    return out, text


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """render only needs a manifest to point at."""
    d = tmp_path / "data"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"classes": [], "image_size": 64}))
    return d


def test_render_one_srun_task_per_gpu(tmp_path, data_dir):
    out, text = render(tmp_path, data_dir, "--nodes", 2, "--gpus-per-node", 4,
                       "--partition", "gpu", "--time", "0-02:00:00", "--env", "NCCL_DEBUG=INFO")
    opts = sbatch_options(text)
    assert opts["nodes"] == "2" and opts["ntasks-per-node"] == "4" and opts["gpus-per-node"] == "4"
    assert opts["partition"] == "gpu" and opts["time"] == "0-02:00:00"
    assert opts["output"] == f"{out.resolve()}/slurm-%j.out"
    assert "export NCCL_DEBUG=INFO" in text and "HOROVOD_CPU_OPERATIONS" not in text
    words = command_of(text)
    assert words[:3] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1"]
    python = words.index("-m")
    assert Path(words[python - 1]).name.startswith("python")
    worker = words[python + 1:]
    assert worker[0] == "chexflow.train.worker"
    args = dict(zip(worker[1::2], worker[2::2], strict=True))
    assert args["--data"] == str(data_dir.resolve())
    assert args["--out"] == str(out.resolve() / "train")
    assert args["--model"] == "densenet121" and args["--image-size"] == "64"
    assert args["--weights"] == "none" and args["--steps-per-epoch"] == "2"
    assert f"# chexflow-metrics: {out.resolve()}/train/metrics.json" in text


def test_render_in_apptainer_with_mpirun(tmp_path, data_dir):
    sif = tmp_path / "chexflow-trainer.sif"
    out, text = render(tmp_path, data_dir, "--gpus-per-node", 8, "--container", sif,
                       "--launcher", "mpirun", "--bind", "/scratch", "--env", "NCCL_IB_HCA=mlx5")
    words = command_of(text)
    assert words[:3] == ["mpirun", "-np", "${SLURM_NTASKS}"]
    assert words[words.index("NCCL_IB_HCA") - 1:][:2] == ["-x", "NCCL_IB_HCA"]
    a = words.index("apptainer")
    assert words[a:a + 3] == ["apptainer", "exec", "--nv"]
    assert words[a + 3] == "--bind"
    assert words[a + 4].split(",") == [str(data_dir.resolve()), str(out.resolve()), "/scratch"]
    assert words[a + 5:a + 8] == [str(sif.resolve()), "python", "-m"]
    assert "OMPI_ALLOW_RUN_AS_ROOT=1" in text  # mpirun refuses root without it


def test_render_cpu_only_needs_tasks_gets_mpi_cpu_operations_and_extra_worker_args(
        tmp_path, data_dir):
    _, text = render(tmp_path, data_dir, "--gpus-per-node", 0, "--tasks-per-node", 3,
                     "--worker-arg=--amp", "--worker-arg=--validation-steps=1")
    opts = sbatch_options(text)
    assert opts["ntasks-per-node"] == "3" and "gpus-per-node" not in opts
    assert command_of(text)[-2:] == ["--amp", "--validation-steps=1"]
    # CPU-only ranks: MPI tensor operations, yielding while idle (GPU ranks keep NCCL)
    assert "export HOROVOD_CPU_OPERATIONS=MPI" in text
    assert "export OMPI_MCA_mpi_yield_when_idle=1" in text


@pytest.mark.parametrize("args, message", [
    (["--gpus-per-node", 2, "--tasks-per-node", 3], "one task per GPU"),
    (["--nodes", 0], "--nodes 0: must be at least 1"),
    (["--time", "two hours"], "--time 'two hours'"),
    (["--env", "NO_VALUE"], "expected NAME=VALUE"),
    (["--container", "x.sif", "--python", "/usr/bin/python3"], "--python applies without"),
])
def test_render_rejects_bad_options(tmp_path, data_dir, args, message):
    proc = run_chexflow("slurm", "render", "--out", tmp_path / "r", "--data", data_dir, *args,
                        check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r" / "job.sbatch").exists()


def test_render_needs_a_manifest_and_keeps_existing_scripts(tmp_path, data_dir):
    proc = run_chexflow("slurm", "render", "--out", tmp_path / "r", "--data", tmp_path,
                        check=False)
    assert proc.returncode == 2 and "no manifest.json" in proc.stderr
    out, first = render(tmp_path, data_dir)
    proc = run_chexflow("slurm", "render", "--out", out, "--data", data_dir, "--nodes", 3,
                        check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert (out / "job.sbatch").read_text() == first
    run_chexflow("slurm", "render", "--out", out, "--data", data_dir, "--nodes", 3, "--overwrite")
    assert sbatch_options((out / "job.sbatch").read_text())["nodes"] == "3"


# ---- a real Slurm on localhost ---------------------------------------------------------------

@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    why = missing_requirements()
    if why:
        pytest.skip(f"single-node Slurm unavailable: {why}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"), gpus=2).start()
    yield cluster
    cluster.stop()


@pytest.mark.slurm
@pytest.mark.trainer
@pytest.mark.slow
def test_submit_trains_two_ranks_on_slurm(local_slurm, nih_tfrecords, tmp_path):
    out, _ = render(tmp_path, nih_tfrecords, "--gpus-per-node", 2, "--cpus-per-task", 1,
                    "--time", 20, "--worker-arg=--validation-steps=1",
                    "--worker-arg=--warmup-steps=1")
    proc = run_chexflow("slurm", "submit", out / "job.sbatch", "--poll", 1, "--timeout", 600,
                        env=local_slurm.env())
    assert "COMPLETED (exit 0:0" in proc.stdout
    metrics = read_json(out / "train" / "metrics.json")
    assert metrics["workers"] == 2 and metrics["epochs"] == 1
    assert 0.0 <= metrics["val_auroc"] <= 1.0 and metrics["images_per_sec"] > 0
    assert "workers=2" in proc.stdout.splitlines()  # the metrics are reported
    (record,) = out.glob("slurm-*.json")
    job = read_json(record)
    assert job["state"] == "COMPLETED" and job["metrics"] == metrics
    log = Path(job["log"]).read_text()
    assert "2 Horovod ranks" in log and "2 workers" in log


@pytest.mark.slurm
def test_submit_reports_a_failed_job(local_slurm, data_dir, tmp_path):
    out, _ = render(tmp_path, data_dir, "--gpus-per-node", 2, "--launcher", "mpirun",
                    "--worker-arg=--no-such-option")
    proc = run_chexflow("slurm", "submit", out / "job.sbatch", "--poll", 1, "--timeout", 120,
                        env=local_slurm.env(), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "ended FAILED" in proc.stderr and "--no-such-option" in proc.stderr  # log tail
    (record,) = out.glob("slurm-*.json")
    assert read_json(record)["state"] == "FAILED"
    assert not (out / "train" / "metrics.json").exists()
