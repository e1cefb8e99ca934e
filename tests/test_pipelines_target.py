"""The job target a pipeline makes once (its first step) and every later step takes: checked
when made, and read back from what KFP hands a step."""

from __future__ import annotations

import pytest

from chexflow.components.definitions import target_op
from chexflow.components.steps import StepError, Target
from chexflow.errors import ChexflowError
from chexflow.jobs.spec import ClusterOptions

# target-op's cluster inputs at ClusterOptions' defaults
NO_CLUSTER_SETTINGS = {name: default
                       for name, (_, default) in ClusterOptions.pipeline_parameters().items()}


def test_target_round_trips_through_kfps_number_types():
    made = Target(workdir="/mnt/chexflow/runs/r1", run_id="r1", backend="kubernetes",
                  namespace="team-a", data_pvc="chexflow-data", trainer_image="t:1",
                  timeout_seconds=600)
    handed = {k: float(v) if isinstance(v, int) else v for k, v in made.to_dict().items()}
    got = Target.from_dict(handed, gpus_per_worker=2, cpu="8")
    assert got.timeout_seconds == 600 and isinstance(got.timeout_seconds, int)
    assert (got.gpus_per_worker, got.cpu, got.data_pvc) == (2, "8", "chexflow-data")
    assert got.path("train-w2") == "/mnt/chexflow/runs/r1/train-w2"
    assert got.job_name("train-w2") == "train-w2-r1"
    assert [v.mount_path for v in got.volumes()] == ["/mnt/chexflow"]


@pytest.mark.parametrize("fields, message", [
    ({"backend": "slurm"}, "backend 'slurm': expected one of local, kubernetes"),
    ({"backend": "kubernetes"}, "backend kubernetes: data_pvc is empty"),
    ({"timeout_seconds": 0}, "timeout_seconds 0: must be > 0"),
    ({"backend": "kubernetes", "data_pvc": "d", "workdir": "/srv/runs/r1"},
     "workdir /srv/runs/r1: not under /mnt/chexflow, where the jobs' pods mount PVC d"),
])
def test_a_target_that_cannot_run_jobs_is_refused_in_one_line(fields, message):
    with pytest.raises(StepError, match=message):
        Target(**fields)
    with pytest.raises(StepError, match="unknown fields \\['gpu'\\]"):
        Target.from_dict({"gpu": 1})


def test_the_target_component_makes_the_run_folder_and_checks_it():
    made = target_op.python_func(
        work_root="/w", run_id="abc", backend="local", namespace="default", data_pvc="",
        trainer_image="", launcher_image="", timeout_seconds=60, **NO_CLUSTER_SETTINGS)
    assert made["workdir"] == "/w/abc" and made["run_id"] == "abc"
    shared = target_op.python_func(
        work_root="/srv/shared/runs", run_id="abc", backend="kubernetes", namespace="n",
        data_pvc="data", trainer_image="", launcher_image="", timeout_seconds=60,
        mount_path="/srv/shared", **NO_CLUSTER_SETTINGS)
    assert [v.mount_path for v in Target.from_dict(shared).volumes()] == ["/srv/shared"]
    with pytest.raises(StepError, match="data_pvc is empty"):
        target_op.python_func(work_root="/w", run_id="abc", backend="kubernetes",
                              namespace="n", data_pvc="", trainer_image="", launcher_image="",
                              timeout_seconds=60, **NO_CLUSTER_SETTINGS)


# kfp's names of the parameter types
KFP_TYPES = {dict: "Dict", list: "List", str: "String", bool: "Boolean", int: "Integer"}


def test_the_target_component_takes_clusteroptions_pipeline_parameters_as_stated_there():
    """ClusterOptions states the cluster options once; KFP reads target-op's inputs from its
    source, so its signature must list the same names with the same types."""
    from chexflow.jobs.spec import ClusterOptions

    inputs = target_op.component_spec.inputs
    for name, (typ, _) in ClusterOptions.pipeline_parameters().items():
        assert name in inputs, f"target_op lacks ClusterOptions.{name}: add it to its signature"
        assert inputs[name].type == KFP_TYPES[typ], name
    made = target_op.python_func(
        work_root="/w", run_id="r", backend="local", namespace="n", data_pvc="",
        trainer_image="", launcher_image="", timeout_seconds=1,
        **{**NO_CLUSTER_SETTINGS, "gang_scheduling": True, "queue": "research"})
    assert Target.from_dict(made).cluster_options().queue == "research"


@pytest.mark.slow
def test_every_pipeline_has_clusteroptions_pipeline_parameters_with_their_defaults():
    """`@cluster_parameters` gives each pipeline ClusterOptions' pipeline parameters, in KFP's
    signature and in what `chexflow run` reads from the definition files."""
    from chexflow.pipelines.registry import build, pipeline_names, pipeline_parameters

    wanted = ClusterOptions.pipeline_parameters()
    for name in pipeline_names():
        root = build(name).component_spec.inputs
        read = {p.name: p for p in pipeline_parameters(name)}
        for param, (typ, default) in wanted.items():
            assert root[param].type == KFP_TYPES[typ] and root[param].default == default
            assert (read[param].type, read[param].default) == (typ.__name__, default)


def test_job_kind_trainjob_reaches_the_renderer_through_the_target():
    """A pipeline's job_kind (a ClusterOptions parameter) goes target -> Target -> the
    kubernetes backend, which renders a Horovod step as a TrainJob; the default is an MPIJob."""
    from kubernetes.client import ApiClient

    from chexflow.jobs import JobSpec
    from chexflow.jobs.kubernetes import KubernetesBackend

    spec = JobSpec(name="train-r1", command=["chexflow", "train"], workers=2, horovod=True)
    for kind, wanted in (("trainjob", "TrainJob"), ("mpijob", "MPIJob")):
        made = target_op.python_func(
            work_root="/mnt/chexflow/runs", run_id="r1", backend="kubernetes", namespace="n",
            data_pvc="data", trainer_image="t:1", launcher_image="", timeout_seconds=60,
            **{**NO_CLUSTER_SETTINGS, "job_kind": kind})
        options = Target.from_dict(made).cluster_options()
        assert options.job_kind == kind
        backend = KubernetesBackend(namespace="n", api_client=ApiClient(), options=options)
        assert backend.render(spec)["kind"] == wanted
    with pytest.raises(ChexflowError, match="job_kind 'pytorchjob': expected one of mpijob, "
                                            "trainjob"):
        ClusterOptions(job_kind="pytorchjob")
