"""`chexflow run`'s options come from the pipeline functions' signatures (the pipeline
definitions are read, not run): a new parameter is an option, defaults are stated as the
signature and the local run's settings give them, and options a pipeline lacks are refused."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from chexflow.pipelines.commands import NOT_RUN_OPTIONS, run_parameters
from chexflow.pipelines.registry import PIPELINES_DIR_ENV, pipeline_parameters, pipelines_dir
from tests.conftest import CHEXFLOW, run_chexflow
from tests.support.folders import read_only_folder


def test_every_pipeline_parameter_is_a_run_option_with_its_type():
    options = run_parameters()
    for name in ("chexnet-train", "scaling-study", "tune-then-train"):
        for p in pipeline_parameters(name):
            assert (p.name in options) == (p.name not in NOT_RUN_OPTIONS), p.name
    assert {p.type for p in options["worker_counts"].values()} == {"list"}
    assert options["katib_spec"]["tune-then-train"].required
    assert options["weights"]["chexnet-train"].default == "imagenet"


def test_help_states_the_real_defaults_here_and_on_kfp():
    """Every default as `chexflow run` uses it, also those the signatures name (the namespace,
    the PVC, the images: no `None`), and the compiled pipeline's where it differs."""
    from chexflow.container_images import trainer_image

    text = " ".join(run_chexflow("run", "--help").stdout.split())
    assert "--weights S chexnet-train and tune-then-train only; default none; KFP imagenet" \
        in text
    assert "--katib-spec S tune-then-train only; required" in text
    assert "--namespace S default kubeflow --data-pvc S default chexflow-data" in text
    assert f"--trainer-image S default {trainer_image()}" in text
    assert ("--epochs N default 6 for chexnet-train, 1 for scaling-study and tune-then-train; "
            "KFP 5 for chexnet-train and tune-then-train, 1 for scaling-study") in text
    assert "None" not in text
    env = {"CHEXFLOW_TRAINER_IMAGE": "registry.example/trainer:7"}  # trainer_image()'s
    text = " ".join(run_chexflow("run", "--help", env=env).stdout.split())
    assert "--trainer-image S default registry.example/trainer:7" in text


def test_a_parameter_added_to_a_signature_is_an_option(tmp_path):
    defs = tmp_path / "pipelines"
    shutil.copytree(pipelines_dir(), defs, ignore=shutil.ignore_patterns("*.yaml"))
    src = (defs / "chexnet_train.py").read_text()
    added = "        seed: int = 0,\n        label_smoothing: float = 0.1,\n"
    (defs / "chexnet_train.py").write_text(src.replace("        seed: int = 0,\n", added))
    env = {PIPELINES_DIR_ENV: str(defs)}
    text = " ".join(run_chexflow("run", "--help", env=env).stdout.split())
    assert "--label-smoothing X chexnet-train only; default 0.1" in text
    proc = run_chexflow("run", "chexnet-train", "--label-smoothing", "x", env=env, check=False)
    assert _one_line(proc) == "chexflow run: error: --label-smoothing x: expected a number"


def test_options_the_pipeline_lacks_or_needs_are_one_clear_line(tmp_path):
    proc = run_chexflow("run", "scaling-study", "--out", tmp_path, "--workers", 2, check=False)
    assert proc.returncode == 2
    assert "chexflow run: error: --workers: not a parameter of scaling-study" in proc.stderr
    proc = run_chexflow("run", "tune-then-train", "--out", tmp_path, check=False)
    assert proc.returncode == 2
    assert "chexflow run: error: tune-then-train needs --katib-spec" in proc.stderr
    proc = run_chexflow("run", "scaling-study", "--out", tmp_path, "--worker-counts", "2,0",
                        check=False)
    assert _one_line(proc) == ("chexflow run: error: job 'train-w0': workers must be >= 1, got 0 "
                               "(train-op's workers from --worker-counts item)")
    assert not list(tmp_path.glob("*-*/")), "nothing is started for bad options"


def test_jobs_on_kubernetes_need_the_pvc_host_folder_holding_the_run_and_its_data(tmp_path):
    """With --backend kubernetes the steps here and the jobs' pods share files only through
    the PVC's folder on this machine: each way of missing it is one line, before any step."""
    shared, outside = tmp_path / "shared", tmp_path / "outside"
    shared.mkdir()
    outside.mkdir()
    k8s = ("run", "chexnet-train", "--backend", "kubernetes", "--data-pvc", "data")
    cases = [
        ((*k8s,), "--backend kubernetes: needs --pvc-host-path DIR, the folder on this machine "
                  "behind --data-pvc"),
        (("run", "--pvc-host-path", shared, "--out", outside),
         "--pvc-host-path: only with --backend kubernetes"),
        ((*k8s, "--pvc-host-path", tmp_path / "none"), f"--pvc-host-path {tmp_path}/none: no "
                                                       "such folder"),
        ((*k8s, "--pvc-host-path", shared, "--out", outside),
         f"--out {outside}: not inside --pvc-host-path {shared}, the only folder the jobs' "
         "pods see"),
        ((*k8s, "--pvc-host-path", shared, "--data", outside),
         f"--data {outside}: not inside --pvc-host-path {shared}"),
        (("run", "--backend", "slurm", "--out", outside),
         "--backend slurm: expected one of local, kubernetes"),
    ]
    for args, message in cases:
        proc = run_chexflow(*args, check=False, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert f"chexflow run: error: {message}" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("chexnet-train-*")), "nothing is started for bad options"


def test_the_run_arguments_keep_the_pvc_only_for_jobs_on_kubernetes(tmp_path):
    from chexflow.pipelines.kfp_local import pipeline_arguments

    local = pipeline_arguments("chexnet-train", tmp_path, tmp_path / "w", {"data_pvc": "d"})
    assert (local["backend"], local["data_pvc"]) == ("local", "")
    k8s = pipeline_arguments("chexnet-train", tmp_path, tmp_path / "w",
                             {"backend": "kubernetes", "data_pvc": "d", "namespace": "team"})
    assert (k8s["backend"], k8s["data_pvc"], k8s["namespace"]) == ("kubernetes", "d", "team")
    assert k8s["work_root"] == str(tmp_path / "w") and k8s["raw_dir"] == str(tmp_path)


def _one_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


def test_param_of_unknown_name_or_wrong_type_is_one_line_and_starts_nothing(tmp_path):
    out = tmp_path / "runs"
    for param, expected in [
        ("epoch=3", "--param epoch: not a parameter of chexnet-train (its parameters: "),
        ("epochs=three", "--param epochs=three: expected a JSON int for this parameter of "
                         "chexnet-train"),
        ("lr=[1]", "--param lr=[1]: expected a JSON float"),
        ("gang_scheduling=1", "--param gang_scheduling=1: expected a JSON bool"),
        ("tolerations={}", "--param tolerations={}: expected a JSON list"),
    ]:
        line = _one_line(run_chexflow("run", "chexnet-train", "--out", out, "--param", param,
                                      check=False))
        assert line.startswith(f"chexflow run: error: {expected}"), line
        assert not out.exists(), "no run folder for a refused run"


@pytest.mark.slow
def test_run_out_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = _one_line(run_chexflow("run", "--out", blocker / "runs", check=False))
    assert line == (f"chexflow run: error: --out {blocker / 'runs'}: cannot create it (Not a "
                    f"directory (ENOTDIR)); choose a folder you can write")
    with read_only_folder() as (readonly, reason):
        proc = subprocess.run([*CHEXFLOW, "run", "--out", readonly],
                              capture_output=True, text=True, timeout=120, cwd=readonly.parent)
        assert _one_line(proc) == (
            f"chexflow run: error: --out {readonly}: cannot write there ({reason}); choose a "
            f"folder you can write"), proc.stderr
        assert list(readonly.iterdir()) == []


def test_run_defaults_naming_no_parameter_is_one_line(tmp_path):
    """A definition's RUN_DEFAULTS (chexflow run's settings beside the signature) may only set
    the pipeline's parameters."""
    defs = tmp_path / "pipelines"
    shutil.copytree(pipelines_dir(), defs, ignore=shutil.ignore_patterns("*.yaml"))
    src = (defs / "chexnet_train.py").read_text()
    (defs / "chexnet_train.py").write_text(
        src.replace("RUN_DEFAULTS = {", 'RUN_DEFAULTS = {"epoch": 1, '))
    proc = run_chexflow("run", "--help", env={PIPELINES_DIR_ENV: str(defs)}, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "chexnet_train.py: RUN_DEFAULTS ['epoch']: not parameters of chexnet-train" \
        in proc.stderr


def test_job_kind_is_a_run_option_of_every_pipeline_and_a_wrong_one_is_one_line(tmp_path):
    options = run_parameters()
    assert set(options["job_kind"]) == {"chexnet-train", "scaling-study", "tune-then-train"}
    assert {p.default for p in options["job_kind"].values()} == {"mpijob"}
    proc = run_chexflow("run", "chexnet-train", "--out", tmp_path, "--job-kind", "pytorchjob",
                        check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "job_kind 'pytorchjob': expected one of mpijob, trainjob" in proc.stderr
    assert not list(tmp_path.glob("*-*/")), "nothing is started for a bad job kind"
