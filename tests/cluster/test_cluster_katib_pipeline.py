"""`chexflow run tune-then-train --backend kubernetes` on the real Katib: the tune step's Job
runs `chexflow tune --cluster` in the launcher image as `chexflow-tune` (katib/rbac.yaml), which
creates a real Experiment whose MPIJob trials train on the run's own preprocessed data; the final
training (an MPIJob on real pods) takes the optimal trial's parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from tests.cluster.conftest import hostpath_claim
from tests.cluster.test_cluster_katib_tune import LAUNCHER, SPEC, WORKER

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
IMAGE_UID = 1000  # the images' user, which the pods run as


def tune_args(image: str) -> list[str]:
    """Two tiny trials one after the other, as on the 2-core real node (Katib's medianstop is
    not deployed); the trials' image is the trainer image built here."""
    return ["--set", "spec.maxTrialCount=2", "--set", "spec.parallelTrialCount=1",
            "--set", "spec.maxFailedTrialCount=1", "--set", "spec.earlyStopping=null",
            "--set", f"{LAUNCHER}.image={image}", "--set", f"{WORKER}.image={image}",
            "--set", f"{WORKER}.resources={{requests: {{cpu: 250m, memory: 1Gi}}, "
                     "limits: {memory: 3Gi}}",
            "--trial-arg", "epochs=1", "--trial-arg", "steps-per-epoch=3",
            "--trial-arg", "validation-steps=2", "--trial-arg", "warmup-steps=1",
            "--trial-arg", "threads=1"]


def apply_rbac(api, namespace: str) -> None:
    """katib/rbac.yaml (the tune Job's account) and mpijob/rbac.yaml, as the README says."""
    from kubernetes import utils

    for path in ("katib/rbac.yaml", "mpijob/rbac.yaml"):
        docs = [d for d in yaml.safe_load_all((REPO_ROOT / path).read_text()) if d]
        utils.create_from_yaml(api, yaml_objects=docs, namespace=namespace)


@pytest.mark.timeout(2400)
def test_tune_then_train_on_the_cluster_runs_a_real_experiment_then_trains_with_its_optimum(
        katib_cluster, katib_namespace, katib_trainer_image, katib_launcher_image, tmp_path):
    from kubernetes import client

    api = katib_cluster.api_client()
    ns = katib_namespace
    shared = tmp_path / "pvc"
    shared.mkdir()
    shared.chmod(0o777)
    core = client.CoreV1Api(api)
    pv = hostpath_claim(core, ns, "run-data", shared)
    apply_rbac(api, ns)
    try:
        proc = subprocess.run(
            [*CHEXFLOW, "run", "tune-then-train", "--katib-spec", str(SPEC),
             "--backend", "kubernetes", "--namespace", ns, "--data-pvc", "run-data",
             "--pvc-host-path", str(shared), "--trainer-image", katib_trainer_image,
             "--launcher-image", katib_launcher_image, "--epochs", "1", "--workers", "2",
             "--image-size", "32", "--batch-size", "4", "--steps-per-epoch", "2",
             "--cpu-per-worker", "750m", "--memory-per-worker", "3Gi", "--weights", "none",
             "--bootstrap", "20", "--timeout-seconds", "1500",
             "--param", "tune_args=" + json.dumps(tune_args(katib_trainer_image))],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=2200,
            env={**os.environ, "KUBECONFIG": str(katib_cluster.kubeconfig)})
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert "mean test AUROC" in proc.stdout, proc.stdout

        (run_dir,) = (shared / "runs").glob("tune-then-train-*")
        summary = json.loads((run_dir / "summary.json").read_text())
        (workdir,) = Path(summary["work_dir"]).iterdir()  # WORK_ROOT/RUN_ID
        tune = workdir / "tune"

        # the tune Job's pod, not this process, ran `chexflow tune --cluster` and wrote the state
        tune_log = (run_dir / "logs" / "tune-op.log").read_text()
        assert f"created Job {ns}/tune-" in tune_log, tune_log[-3000:]
        assert f"experiment {ns}/chexnet-random-" in tune_log, tune_log[-3000:]
        assert (tune / "optimal.json").stat().st_uid == IMAGE_UID

        # a real Experiment in the run's namespace, Succeeded with two MPIJob trials;
        # optimal.json is its status.currentOptimalTrial
        (experiment,) = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "kubeflow.org", "v1beta1", ns, "experiments")["items"]
        status = experiment["status"]
        assert status["trialsSucceeded"] == 2, status
        optimal = json.loads((tune / "optimal.json").read_text())
        katibs = status["currentOptimalTrial"]
        assert optimal["trial"] == katibs["bestTrialName"]
        assert {a["name"]: a["value"] for a in katibs["parameterAssignments"]}["batch-size"] == \
            str(optimal["parameters"]["batch-size"])

        # the trials trained on the run's preprocessed data and wrote into the run's folder
        launcher = experiment["spec"]["trialTemplate"]["trialSpec"]["spec"]["mpiReplicaSpecs"][
            "Launcher"]["template"]["spec"]["containers"][0]
        argv = launcher["args"]
        data_in_pods = Path("/mnt/chexflow") / (workdir / "data").relative_to(shared)
        assert argv[argv.index("--data") + 1] == str(data_in_pods), argv
        assert argv[argv.index("--image-size") + 1] == "32"
        tuned = summary["tasks"]["tune-op"]["artifacts"]["metrics"]["metadata"]
        for n in (1, 2):
            trial = tuned[f"trial{n}"].split()[0]
            metrics = json.loads((tune / "trials" / trial / "metrics.json").read_text())
            assert metrics["workers"] == 2 and metrics["image_size"] == 32, metrics
            assert tuned[f"trial{n}"].endswith(" Succeeded")
            assert tuned[f"trial{n}_val_auroc"] == pytest.approx(metrics["val_auroc"], rel=1e-4)

        # the final training: an MPIJob on real pods with the optimal trial's batch size
        trained = summary["tasks"]["train-op"]["artifacts"]["metrics"]["metadata"]
        assert trained["batch_size_per_worker"] == int(optimal["parameters"]["batch-size"])
        assert tuned["best_val_auroc"] == pytest.approx(optimal["metrics"]["val_auroc"])
        train_log = (run_dir / "logs" / "train-op.log").read_text()
        assert "MPIJob/train-w2-" in train_log and "val_auroc=" in train_log, train_log[-3000:]
        assert (workdir / "train-w2" / "metrics.json").stat().st_uid == IMAGE_UID
        assert 0 <= summary["tasks"]["evaluate-op"]["artifacts"]["metrics"]["metadata"][
            "auroc_mean"] <= 1
    finally:
        core.delete_persistent_volume(pv)
