"""Compiled IR YAML of the three pipelines: loads back in kfp, and the cluster settings (PVC
mounts, GPUs per worker, MPIJob parameters, images) are where the KFP backend reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kfp import components

from chexflow.errors import ChexflowError
from chexflow.jobs.spec import ClusterOptions
from chexflow.pipelines.registry import (
    compile_pipeline,
    components_dir,
    pipeline_names,
    pipelines_dir,
)
from tests.conftest import run_chexflow

MPIJOB_INPUTS = {"workers", "gpus_per_worker", "slots_per_worker", "cpu_per_worker",
                 "memory_per_worker", "target"}
CLUSTER_INPUTS = set(ClusterOptions.pipeline_parameters())  # node_selector, tolerations, ...
TARGET_INPUTS = {"work_root", "run_id", "backend", "namespace", "data_pvc", "trainer_image",
                 "launcher_image", "timeout_seconds", "mount_path", *CLUSTER_INPUTS}

PIPELINES = pipeline_names()
COMPILED_DIR = pipelines_dir()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("compiled")
    docs = {}
    for name in PIPELINES:
        path = compile_pipeline(name, out, trainer_image="reg.example/chexflow/trainer:t1",
                                launcher_image="reg.example/chexflow/launcher:t1")
        components.load_component_from_file(str(path))  # kfp loads it back
        docs[name] = list(yaml.safe_load_all(path.read_text()))
    return docs


@pytest.mark.parametrize("name", PIPELINES)
def test_every_task_mounts_the_data_pvc_and_runs_in_the_launcher_image(compiled, name):
    spec, platform = compiled[name]
    executors = spec["deploymentSpec"]["executors"]
    mounts = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(mounts) == set(executors)
    for execu, cfg in mounts.items():
        (pvc,) = cfg["pvcMount"]
        assert pvc["mountPath"] == "/mnt/chexflow"
        assert pvc["pvcNameParameter"]["componentInputParameter"].endswith("data_pvc")
        container = executors[execu]["container"]
        assert container["image"] == "reg.example/chexflow/launcher:t1"
        assert "pip install" not in " ".join(container["command"])  # kfp is in the image


@pytest.mark.parametrize("name", PIPELINES)
def test_a_pipeline_built_with_a_mount_path_mounts_the_pvc_there_for_steps_and_jobs(
        tmp_path, name):
    """`chexflow run --pvc-host-path DIR` builds the pipeline so: the steps (component pods)
    and the jobs' pods (the target's mount_path) see the PVC at the same path."""
    from kfp import compiler

    from chexflow.pipelines.registry import build

    path = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(build(name, mount_path="/srv/shared"), str(path))
    spec, platform = yaml.safe_load_all(path.read_text())
    mounts = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()
    assert {pvc["mountPath"] for cfg in mounts for pvc in cfg["pvcMount"]} == {"/srv/shared"}
    targets = [t for n, t in all_tasks(spec).items() if n.startswith("target-op")]
    for task in targets:
        given = task["inputs"]["parameters"]["mount_path"]["runtimeValue"]["constant"]
        assert given == "/srv/shared"


def all_tasks(spec: dict) -> dict:
    tasks = dict(spec["root"]["dag"]["tasks"])
    for comp in spec["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


def train_task(spec: dict) -> dict:
    return all_tasks(spec)["train-op"]


@pytest.mark.parametrize("name", PIPELINES)
def test_train_task_receives_the_mpijob_parameters(compiled, name):
    spec, _ = compiled[name]
    params = train_task(spec)["inputs"]["parameters"]
    assert set(params) >= MPIJOB_INPUTS
    target = all_tasks(spec)["target-op"]["inputs"]["parameters"]
    assert set(target) == TARGET_INPUTS
    for name_, task in all_tasks(spec).items():  # every job step gets the one target
        if name_.endswith("-op") and "target" in task["inputs"]["parameters"]:
            source = task["inputs"]["parameters"]["target"]
            producer = source.get("taskOutputParameter", {}).get("producerTask", "")
            assert producer.startswith("target-op") or \
                source.get("componentInputParameter", "").endswith("target-op-Output"), name_
    root = spec["root"]["inputDefinitions"]["parameters"]
    assert root["gpus_per_worker"]["defaultValue"] == 1
    assert root["trainer_image"]["defaultValue"] == "reg.example/chexflow/trainer:t1"
    assert root["backend"]["defaultValue"] == "kubernetes"
    assert root["data_pvc"]["defaultValue"] == "chexflow-data"


@pytest.mark.parametrize("name", PIPELINES)
def test_cluster_parameters_reach_the_job_target_and_training(compiled, name):
    """node_selector, tolerations, ... are pipeline parameters wired into every target-op (the
    scaling study makes one inside its loop too), slots_per_worker into train-op."""
    spec, _ = compiled[name]
    root = spec["root"]["inputDefinitions"]["parameters"]
    assert root["node_selector"]["parameterType"] == "STRUCT"
    assert root["tolerations"]["parameterType"] == "LIST"
    assert root["gang_scheduling"]["defaultValue"] is False
    assert root["slots_per_worker"]["defaultValue"] == 0
    assert root["cpu_per_worker"]["defaultValue"] == ""  # a share per GPU
    targets = [t for n, t in all_tasks(spec).items() if n.startswith("target-op")]
    assert targets and len(targets) == (2 if name == "scaling-study" else 1)
    for task in targets:
        params = task["inputs"]["parameters"]
        for key in CLUSTER_INPUTS:
            assert params[key]["componentInputParameter"].endswith(key), (key, params[key])
    slots = train_task(spec)["inputs"]["parameters"]["slots_per_worker"]
    assert slots["componentInputParameter"].endswith("slots_per_worker")


def test_the_target_component_hands_cluster_settings_to_the_rendered_mpijob():
    """What target-op returns (the `target` dict every step gets) renders into the MPIJob."""
    from chexflow.components.definitions import target_op
    from chexflow.components.steps import Target
    from chexflow.jobs import JobSpec
    from chexflow.jobs.render import render_mpijob
    from chexflow.jobs.schema import validate_mpijob
    from tests.test_mpijob import CRD

    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    made = target_op.python_func(**{
        **made_args(), "work_root": "/mnt/chexflow/runs", "run_id": "r1",
        "backend": "kubernetes", "namespace": "team-a", "data_pvc": "chexflow-data",
        "trainer_image": "t", "launcher_image": "l", "timeout_seconds": 60.0,
        "node_selector": {"pool": "a100"}, "tolerations": [toleration], "priority_class": "high",
        "image_pull_secrets": ["regcred"], "gang_scheduling": True, "queue": "research"})
    target = Target.from_dict(made, slots_per_worker=2)
    spec = JobSpec(name="t", command=["true"], workers=2, horovod=True,
                   slots_per_worker=target.slots_per_worker)
    obj = render_mpijob(spec, options=target.cluster_options())
    validate_mpijob(obj, CRD)
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["nodeSelector"] == {"pool": "a100"} and worker["tolerations"] == [toleration]
    assert worker["priorityClassName"] == "high"
    assert worker["imagePullSecrets"] == [{"name": "regcred"}]
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert obj["spec"]["slotsPerWorker"] == 2
    with pytest.raises(ChexflowError, match="toleration 0 .*effect must be one of"):
        target_op.python_func(**{**made_args(), "tolerations": [{"key": "x", "effect": "Never"}]})


def made_args() -> dict:
    return dict(work_root="/w", run_id="r", backend="local", namespace="n", data_pvc="",
                trainer_image="", launcher_image="", timeout_seconds=1,
                **{name: default for name, (_, default) in
                   ClusterOptions.pipeline_parameters().items()})


def test_scaling_study_loops_over_worker_counts_one_at_a_time(compiled):
    spec, _ = compiled["scaling-study"]
    loop = [t for t in spec["root"]["dag"]["tasks"].values() if "parameterIterator" in t][0]
    assert loop["iteratorPolicy"]["parallelismLimit"] == 1
    assert loop["parameterIterator"]["items"]["inputParameter"].endswith("worker_counts")
    report = spec["root"]["dag"]["tasks"]["scaling-report-op"]
    assert "summaries" in report["inputs"]["parameters"]  # dsl.Collected of every run


def test_scaling_study_gives_every_worker_the_same_threads_at_every_count(compiled):
    """threads_per_worker (default 1) reaches train-op at every worker count: without it a
    1-worker CPU run took every core and each of N workers 1/N of them."""
    spec, _ = compiled["scaling-study"]
    default = spec["root"]["inputDefinitions"]["parameters"]["threads_per_worker"]
    assert default["defaultValue"] == 1
    threads = train_task(spec)["inputs"]["parameters"]["threads"]
    assert threads["componentInputParameter"].endswith("threads_per_worker")


def test_tune_then_train_feeds_the_optimal_trial_into_training(compiled):
    spec, _ = compiled["tune-then-train"]
    hp = train_task(spec)["inputs"]["parameters"]["hparams_json"]
    assert hp["taskOutputParameter"]["producerTask"] == "tune-op"
    tune = spec["root"]["dag"]["tasks"]["tune-op"]["inputs"]["parameters"]
    assert tune["data_dir"]["taskOutputParameter"]["producerTask"] == "preprocess-op"
    target = spec["root"]["dag"]["tasks"]["target-op"]["inputs"]["parameters"]
    assert target["launcher_image"]["componentInputParameter"] == "launcher_image"


def test_compile_cli_writes_what_is_committed(tmp_path):
    run_chexflow("compile", "--out", tmp_path, "--components-out", tmp_path / "components",
                 env={"CHEXFLOW_TRAINER_IMAGE": "", "CHEXFLOW_LAUNCHER_IMAGE": ""})
    for name in PIPELINES:
        fresh = yaml.safe_load_all((tmp_path / f"{name}.yaml").read_text())
        committed = yaml.safe_load_all((COMPILED_DIR / f"{name}.yaml").read_text())
        assert list(fresh) == list(committed), f"pipelines/{name}.yaml is stale: chexflow compile"
    assert Path(COMPILED_DIR / "chexnet-train.yaml").exists()
    fresh_components = sorted(p.name for p in (tmp_path / "components").glob("*.yaml"))
    assert {"target.yaml", "preprocess.yaml", "train.yaml", "evaluate.yaml",
            "tune.yaml"} <= set(fresh_components)
    for name in fresh_components:
        fresh = yaml.safe_load((tmp_path / "components" / name).read_text())
        committed = yaml.safe_load((components_dir() / name).read_text())
        assert fresh == committed, f"components/{name} is stale: chexflow compile"
        components.load_component_from_file(str(components_dir() / name))
