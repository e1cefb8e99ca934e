"""`chexflow run tune-then-train --backend kubernetes` on the real Katib: the tune step's Job
runs `chexflow tune --cluster` in the launcher image as `chexflow-tune` (katib/rbac.yaml), which
creates a real Experiment whose MPIJob trials train on the run's own preprocessed data; the final
training (an MPIJob on real pods) takes the optimal trial's parameters. It is also the test of a
chexnet-random sweep on the real Katib: MPIJob trials across two real worker pods, val_auroc
read by Katib's StdOut collector from the launcher, the local runner's results written from what
Katib recorded, and loaded by the same reader as a local run of the same spec."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from tests.cluster.conftest import hostpath_claim
from tests.cluster.test_cluster_katib_tune import CHEXFLOW, LAUNCHER, SPEC, WORKER
from tests.support.katib import in_feasible_space

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

IMAGE_UID = 1000  # the images' user, which the pods run as


def tune_args(image: str) -> list[str]:
    """Two tiny trials one after the other, as on the 2-core real node, without early stopping
    (medianstop has no rule before its min_trials_required trials succeed); the trials' image
    is the trainer image built here."""
    return ["--set", "spec.maxTrialCount=2", "--set", "spec.parallelTrialCount=1",
            "--set", "spec.maxFailedTrialCount=1", "--set", "spec.earlyStopping=null",
            "--set", f"{LAUNCHER}.image={image}", "--set", f"{WORKER}.image={image}",
            "--set", f"{WORKER}.resources={{requests: {{cpu: 250m, memory: 1Gi}}, "
                     "limits: {memory: 3Gi}}",
            "--trial-arg", "epochs=1", "--trial-arg", "steps-per-epoch=3",
            "--trial-arg", "validation-steps=2", "--trial-arg", "warmup-steps=1",
            "--trial-arg", "threads=1"]


def apply_rbac(api, namespace: str) -> None:
    """katib/rbac.yaml (the tune Job's account) and mpijob/rbac.yaml (docs/cluster-jobs.md)."""
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

        # a real Experiment in the run's namespace, Succeeded with two MPIJob trials that
        # trained on the run's preprocessed data and wrote into the run's folder
        custom = client.CustomObjectsApi(api)
        (experiment,) = custom.list_namespaced_custom_object(
            "kubeflow.org", "v1beta1", ns, "experiments")["items"]
        check_sweep(custom, experiment, tune, tune / "trials", tune_log)
        optimal = json.loads((tune / "optimal.json").read_text())
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
            assert tuned[f"trial{n}"].endswith(" Succeeded")
            assert tuned[f"trial{n}_val_auroc"] == pytest.approx(metrics["val_auroc"], rel=1e-4)
        same_space_locally(tune, tmp_path / "local")

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


def same_space_locally(cluster_state: Path, local_state: Path) -> None:
    """The same spec and sets through the local runner (same algorithm and seed; trivial
    trials): one reader loads both results, with the same parameter names, in the spec's
    order, the same types, and every value in the spec's space."""
    from chexflow.katib.experiment.spec import load_experiment
    from chexflow.katib.local.results import load_results

    sets = ["spec.maxTrialCount=2", "spec.parallelTrialCount=1", "spec.maxFailedTrialCount=1",
            "spec.earlyStopping=null"]
    local = subprocess.run(
        [*CHEXFLOW, "tune", str(SPEC), "--local", "--state", str(local_state), "--no-progress",
         *(a for s in sets for a in ("--set", s)), "--trial-command",
         "echo val_auroc=0.7 images_per_sec=1 val_loss=0.5"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    spec = load_experiment(SPEC, sets)
    params = [p.name for p in spec.parameters]
    loaded = {"cluster": load_results(cluster_state), "local": load_results(local_state)}
    types = {}
    for where, results in loaded.items():
        assert len(results["trials"]) == 2, where
        for t in results["trials"]:
            assert [k for k in t if k in params] == params, (where, t)
            assert all(in_feasible_space(p, t[p.name]) for p in spec.parameters), (where, t)
        types[where] = [{k: type(t[k]).__name__ for k in params} for t in results["trials"]]
    assert types["cluster"] == types["local"] == [
        {"lr": "float", "batch-size": "int", "optimizer": "str", "weight-decay": "float"}] * 2


def check_sweep(custom, experiment: dict, state: Path, trials_dir: Path, log: str) -> None:
    """The Experiment Succeeded with two MPIJob trials of two workers each; `chexflow tune`'s
    state folder holds what Katib recorded."""
    name, katib_namespace = experiment["metadata"]["name"], experiment["metadata"]["namespace"]
    status = experiment["status"]
    assert any(c["type"] == "Succeeded" and c["status"] == "True"
               for c in status["conditions"]), status
    assert status["trialsSucceeded"] == 2, status
    assert "earlyStopping" not in experiment["spec"]

    # optimal.json is Katib's status.currentOptimalTrial
    katibs = status["currentOptimalTrial"]
    optimal = json.loads((state / "optimal.json").read_text())
    assert optimal["trial"] == katibs["bestTrialName"]
    assert optimal["experiment"] == name
    assert set(optimal["parameters"]) == {a["name"] for a in katibs["parameterAssignments"]}
    for a in katibs["parameterAssignments"]:
        mine = optimal["parameters"][a["name"]]
        assert mine == (a["value"] if isinstance(mine, str) else pytest.approx(float(a["value"])))
    katib_auroc = next(m for m in katibs["observation"]["metrics"] if m["name"] == "val_auroc")
    assert optimal["metrics"]["val_auroc"] == pytest.approx(float(katib_auroc["max"]))

    # both trials, as Katib recorded them, with the launcher's val_auroc
    results = json.loads((state / "results.json").read_text())
    assert results["condition"]["type"] == "Succeeded"
    assert results["counts"]["Succeeded"] == 2
    trials = custom.list_namespaced_custom_object(
        "kubeflow.org", "v1beta1", katib_namespace, "trials",
        label_selector=f"katib.kubeflow.org/experiment={name}")["items"]
    assert sorted(t["trial"] for t in results["trials"]) == sorted(
        t["metadata"]["name"] for t in trials)
    for row in results["trials"]:
        assert row["status"] == "Succeeded", row
        assert 0 <= row["val_auroc"] <= 1, row
        # each trial trained in its own run folder on the claim, two Horovod workers
        metrics = json.loads((trials_dir / row["trial"] / "metrics.json").read_text())
        assert metrics["workers"] == 2 and metrics["image_size"] == 32, metrics
        assert row["val_auroc"] == pytest.approx(metrics["val_auroc"], rel=1e-4)  # collected
    assert [t["spec"]["runSpec"]["kind"] for t in trials] == ["MPIJob", "MPIJob"]
    for path in ("results.csv", "results.html", "objective.png", "experiment.json"):
        assert (state / path).stat().st_size > 0
    assert f"experiment {name}: Succeeded" in log
