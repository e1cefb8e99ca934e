"""MPIJob rendering against the real mpi-operator CRD schema, the schema helper, and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chexflow.jobs import JobSpec, JobSpecError, Volume
from chexflow.jobs.render import render_batch_job, render_mpijob
from chexflow.jobs.schema import SchemaError, validate_mpijob
from chexflow.reference import reference_dir
from tests.conftest import run_chexflow

CRD = Path(__file__).parent / "data" / "mpijobs.kubeflow.org.v2beta1.yaml"


def spec(**kw) -> JobSpec:
    base = dict(
        name="chexnet-train", command=["chexflow", "train", "--data", "/data/tfr"], workers=4,
        horovod=True, gpus_per_worker=2, cpu="8", memory="32Gi", shm_size="8Gi",
        volumes=[Volume("chexflow-data", "/data")], env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout_seconds=7200,
    )
    return JobSpec(**{**base, **kw})


def test_rendered_mpijob_validates_and_has_the_cluster_fields():
    obj = render_mpijob(spec(), namespace="team-a", image="reg.example/trainer:1")
    validate_mpijob(obj, CRD)
    s = obj["spec"]
    assert s["slotsPerWorker"] == 2
    assert s["runPolicy"] == {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 3600,
                              "activeDeadlineSeconds": 7200, "backoffLimit": 0}
    launcher = s["mpiReplicaSpecs"]["Launcher"]
    worker = s["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and worker["replicas"] == 4
    lc = launcher["template"]["spec"]["containers"][0]
    wc = worker["template"]["spec"]["containers"][0]
    assert lc["command"][:3] == ["mpirun", "-np", "8"]  # 4 workers x 2 slots
    assert lc["command"][-4:] == ["chexflow", "train", "--data", "/data/tfr"]
    assert "TF_CPP_MIN_LOG_LEVEL" in lc["command"]  # forwarded to the ranks with -x
    assert "nvidia.com/gpu" not in lc["resources"]["limits"]
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == 2
    for tmpl in (launcher, worker):
        pod = tmpl["template"]["spec"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == ["chexflow-data"]
        shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
        assert shm == {"medium": "Memory", "sizeLimit": "8Gi"}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts == {"/data", "/dev/shm"}


def test_schema_rejects_wrong_types_and_unknown_fields():
    obj = render_mpijob(spec())
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["gpus"] = 2
    worker["resources"]["limits"]["cpu"] = "lots"
    obj["spec"]["slotsPerWorker"] = "2"
    with pytest.raises(SchemaError) as err:
        validate_mpijob(obj, CRD)
    msg = str(err.value)
    assert "containers.0.gpus: unknown field" in msg
    assert "limits.cpu" in msg and "spec.slotsPerWorker" in msg


def test_schema_requires_an_explicit_clean_pod_policy_and_one_launcher():
    obj = render_mpijob(spec())
    del obj["spec"]["runPolicy"]["cleanPodPolicy"]
    with pytest.raises(SchemaError, match="cleanPodPolicy must be set"):
        validate_mpijob(obj, CRD)
    obj = render_mpijob(spec())
    obj["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    with pytest.raises(SchemaError, match="Launcher.replicas must be 1"):
        validate_mpijob(obj, CRD)


def test_katib_reference_trial_spec_is_checked_too():
    """The Katib example's trialSpec is a kubeflow.org/v1 MPIJob: the v2beta1 check says so."""
    ref = reference_dir() / "katib-examples" / "mpijob-horovod.yaml"
    trial = yaml.safe_load(ref.read_text())["spec"]["trialTemplate"]["trialSpec"]
    trial["metadata"] = {"name": "t"}
    with pytest.raises(SchemaError, match=r"apiVersion is 'kubeflow.org/v1'.*cleanPodPolicy"):
        validate_mpijob(trial, CRD)


def test_batch_job_for_single_process():
    job = render_batch_job(spec(workers=1, horovod=False, gpus_per_worker=1))
    pod = job["spec"]["template"]["spec"]
    assert job["apiVersion"] == "batch/v1" and pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["command"] == ["chexflow", "train", "--data", "/data/tfr"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_bad_specs_are_refused_with_the_field_named():
    with pytest.raises(JobSpecError, match="name must be lowercase"):
        spec(name="Train_1")
    with pytest.raises(JobSpecError, match="workers=2 needs horovod"):
        spec(workers=2, horovod=False)


def test_cli_render_prints_a_valid_mpijob(tmp_path):
    proc = run_chexflow(
        "mpijob", "render", "--name", "cli-job", "--workers", 2, "--gpus-per-worker", 1,
        "--pvc", "chexflow-data", "--validate", CRD, "--", "chexflow", "train", "--epochs", 1,
    )
    obj = yaml.safe_load(proc.stdout)
    assert obj["kind"] == "MPIJob" and obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert "valid against" in proc.stderr
    bad = run_chexflow("mpijob", "render", "--name", "Bad_Name", "--", "true", check=False)
    assert bad.returncode == 2 and "name must be lowercase" in bad.stderr
