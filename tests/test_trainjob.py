"""Kubeflow Trainer v2: chexflow's Horovod ClusterTrainingRuntime (trainjob/horovod-runtime.yaml)
and the TrainJobs render_trainjob writes, checked against Trainer's own CRD schemas (from its Go
module, when the module cache has it) and against what render.py puts in an MPIJob."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from chexflow.devcluster import trainer as devtrainer
from chexflow.devcluster.binaries import required_version
from chexflow.jobs import JobSpec, JobSpecError, Volume
from chexflow.jobs import render as mpirender
from chexflow.jobs.schema import validate_against_crd
from chexflow.jobs.spec import ClusterOptions
from chexflow.jobs.trainjob import (
    RUNTIME_FILE,
    horovod_runtime,
    render_trainjob,
    runtime_text,
)
from tests.conftest import run_chexflow


def spec(**kw) -> JobSpec:
    base = dict(name="chexnet-train", command=["chexflow", "train", "--data", "/data/tfr"],
                workers=3, horovod=True, gpus_per_worker=2, cpu="8", memory="32Gi",
                volumes=[Volume("chexflow-data", "/data")], env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                timeout_seconds=7200)
    return JobSpec(**{**base, **kw})


def trainer_crd(name: str) -> Path:
    """A CRD of the Trainer release build/trainer/go.mod names, from its Go module (downloaded
    into the module cache when missing: seconds, no build)."""
    version = required_version(devtrainer.TRAINER_DIR / "go.mod", devtrainer.TRAINER_MODULE)
    module = f"{devtrainer.TRAINER_MODULE}@{version}"
    proc = subprocess.run(["go", "mod", "download", "-json", module],
                          cwd=devtrainer.TRAINER_DIR, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"/usr/local/go/bin:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    path = (Path(json.loads(proc.stdout)["Dir"]) / "manifests" / "base" / "crds" /
            f"trainer.kubeflow.org_{name}.yaml")
    assert path.exists(), path
    return path


def pods(runtime: dict) -> dict[str, dict]:
    return {rj["name"]: rj["template"]["spec"]["template"]
            for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def test_committed_runtime_is_what_the_renderer_writes():
    assert RUNTIME_FILE.read_text() == runtime_text(), (
        "trainjob/horovod-runtime.yaml is stale: python -m chexflow.jobs.trainjob")


def test_runtime_validates_against_trainers_crd_and_uses_mpi_policy_for_the_non_root_user():
    runtime = yaml.safe_load(RUNTIME_FILE.read_text())
    validate_against_crd(runtime, trainer_crd("clustertrainingruntimes"), version="v1alpha1")
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    assert mpi == {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                   "sshAuthMountPath": "/home/chexflow/.ssh", "runLauncherAsNode": True}


def test_runtime_pods_are_the_mpijobs_non_root_istio_free_gpu_tolerant_pods():
    mpijob = mpirender.render_mpijob(spec())["spec"]["mpiReplicaSpecs"]
    templates = pods(horovod_runtime())
    for role, mpi_role in (("node", "Worker"), ("launcher", "Launcher")):
        pod, theirs = templates[role], mpijob[mpi_role]["template"]
        assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "node"  # where Trainer's MPI plugin mounts keys, hostfile
        assert container["securityContext"] == theirs["spec"]["containers"][0]["securityContext"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            pod["spec"]["tolerations"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    node = templates["node"]["spec"]["containers"][0]
    assert node["command"] == mpirender.WORKER_COMMAND
    assert node["readinessProbe"] == mpirender.WORKER_READINESS


def test_trainjob_validates_and_carries_command_resources_data_and_cluster_options():
    options = ClusterOptions(node_selector={"pool": "a100"},
                             tolerations=[{"key": "team", "operator": "Exists",
                                           "effect": "NoSchedule"}],
                             image_pull_secrets=["regcred"])
    job = render_trainjob(spec(), "team-a", image="reg.io/trainer:1", options=options)
    validate_against_crd(job, trainer_crd("trainjobs"), version="v1alpha1")
    assert job["metadata"]["namespace"] == "team-a"
    assert job["spec"]["runtimeRef"] == {"name": "chexflow-horovod",
                                         "apiGroup": "trainer.kubeflow.org",
                                         "kind": "ClusterTrainingRuntime"}
    t = job["spec"]["trainer"]
    assert t["command"] == mpirender.mpirun_args(spec())
    assert t["command"][:3] == ["mpirun", "-np", "6"]
    assert (t["numNodes"], t["numProcPerNode"]) == (3, 2)
    assert t["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 2
    assert t["image"] == "reg.io/trainer:1"
    assert {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"} in t["env"]
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    (patch,) = job["spec"]["runtimePatches"]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["node", "launcher"]
    for j in jobs:
        pod = j["template"]["spec"]["template"]["spec"]
        assert pod["volumes"] == [{"name": "data-0", "persistentVolumeClaim": {
            "claimName": "chexflow-data", "readOnly": False}}]
        assert pod["containers"] == [{"name": "node", "volumeMounts": [
            {"name": "data-0", "mountPath": "/data", "readOnly": False}]}]
        assert pod["nodeSelector"] == {"pool": "a100"}
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert options.tolerations[0] in pod["tolerations"]


def test_trainjob_refuses_what_trainer_cannot_express_with_the_field_named():
    with pytest.raises(JobSpecError, match="priority_class, gang_scheduling not supported"):
        render_trainjob(spec(), options=ClusterOptions(priority_class="high",
                                                       gang_scheduling=True, queue="team-a"))
    with pytest.raises(JobSpecError, match="a TrainJob runs Horovod jobs"):
        render_trainjob(spec(horovod=False, workers=1))


def test_a_queued_trainjob_carries_kueues_queue_label_and_leaves_suspend_to_kueue():
    """As Kueue's "Run A TrainJob" writes it: the label kueue.x-k8s.io/queue-name on the
    TrainJob; spec.suspend is not set (Kueue's webhook sets it when the TrainJob is created),
    nor a runtime patch of Kueue's (its webhook adds that too)."""
    job = render_trainjob(spec(), "team-a", image="reg.io/trainer:1",
                          options=ClusterOptions(queue="team-a"))
    validate_against_crd(job, trainer_crd("trainjobs"), version="v1alpha1")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "suspend" not in job["spec"]
    assert [p["manager"] for p in job["spec"]["runtimePatches"]] == ["chexflow.io/render"]
    plain = render_trainjob(spec(), "team-a", image="reg.io/trainer:1")
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    del job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert job == plain  # the label is all --queue changes


def test_cli_render_trainjob_with_queue_labels_it_and_a_bad_queue_name_is_one_line():
    argv = ["render", "--name", "tj", "--job-kind", "trainjob", "--workers", "2"]
    out = run_chexflow("job", *argv, "--queue", "team-a", "--", "chexflow", "train").stdout
    job = yaml.safe_load(out)
    assert job["kind"] == "TrainJob"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    bad = run_chexflow("job", *argv, "--queue", "Team_A", "--", "chexflow", "train",
                       check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert bad.stderr.startswith("chexflow job: error: queue 'Team_A': a LocalQueue name"), \
        bad.stderr


@pytest.mark.parametrize("kind", ["mpijob", "trainjob"])
def test_chexflow_job_renders_what_its_old_name_mpijob_renders(kind):
    """`chexflow job` is the command's name for every job kind; `chexflow mpijob` stays an alias
    for one release and prints the same YAML (errors name the name the user typed)."""
    argv = ["render", "--name", "j", "--job-kind", kind, "--workers", "2", "--pvc", "data",
            "--", "chexflow", "train"]
    assert run_chexflow("job", *argv).stdout == run_chexflow("mpijob", *argv).stdout
    bad = run_chexflow("job", "render", "--name", "j", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("chexflow job: error: ")


def test_cli_render_job_kind_trainjob_prints_the_trainjob():
    out = run_chexflow("mpijob", "render", "--name", "tj", "--job-kind", "trainjob",
                       "--workers", "2", "--pvc", "data", "--runtime", "other", "--",
                       "chexflow", "train").stdout
    job = yaml.safe_load(out)
    assert job["kind"] == "TrainJob" and job["spec"]["runtimeRef"]["name"] == "other"
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert job["spec"]["trainer"]["command"][-2:] == ["chexflow", "train"]


def test_dev_cluster_katib_config_lists_trainjob_trials_that_katibs_rbac_lets_it_watch():
    """katib-config's trialResources (Kind.version.group) name the TrainJob CRD's kind, served
    version and group, and Katib's own controller ClusterRole (as deployed) covers trainjobs."""
    from chexflow.devcluster import katib

    refs = {name: f"chexflow.local/{name}:t" for name in
            (*katib.IMAGES, katib.LAUNCHER, katib.EARLY_STOPPING)}
    listed = katib.katib_config(refs)["init"]["controller"]["trialResources"]
    assert listed == ["Job.v1.batch", "MPIJob.v2beta1.kubeflow.org",
                      "TrainJob.v1alpha1.trainer.kubeflow.org"]
    crd = yaml.safe_load(trainer_crd("trainjobs").read_text())
    kind, version, group = listed[-1].split(".", 2)
    assert (crd["spec"]["names"]["kind"], crd["spec"]["group"]) == (kind, group)
    assert version in [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    role = next(d for d in katib.documents(refs) if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "katib-controller")
    assert any("trainer.kubeflow.org" in r.get("apiGroups", []) and "trainjobs" in
               r.get("resources", []) and "watch" in r.get("verbs", []) for r in role["rules"])
