"""The job target a pipeline makes once (its first step) and every later step takes: checked
when made, and read back from what KFP hands a step."""

from __future__ import annotations

import pytest

from chexflow.components.definitions import target_op
from chexflow.components.steps import StepError, Target

NO_CLUSTER_SETTINGS = dict(node_selector={}, tolerations=[], priority_class="",
                           image_pull_secrets=[], gang_scheduling=False, queue="")


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
