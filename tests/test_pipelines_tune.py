"""The tune step of tune-then-train: a real `chexflow tune` sweep (Katib's local runner) launched
as a job, its optimal.json read back and mapped onto the final training's options."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from chexflow.components.steps import (
    StepError,
    Target,
    apply_hparams,
    tune_job,
    tune_step,
    tune_trial_metrics,
)
from chexflow.katib.local.results import load_results
from chexflow.train.options import TrainOptions
from tests.conftest import run_chexflow
from tests.katib_configmap_specs import configmap_spec

SPEC = Path(__file__).resolve().parent.parent / "katib" / "specs" / "chexnet-random.yaml"
TRAIN_FLAGS = {"lr", "batch-size"}


def small_spec(tmp_path: Path) -> Path:
    """chexnet-random with only the parameters `chexflow train` has, 2 trials (the other
    parameters' flags dropped from its trialSpec)."""
    doc = yaml.safe_load(SPEC.read_text())
    spec = doc["spec"]
    spec["parameters"] = [p for p in spec["parameters"] if p["name"] in TRAIN_FLAGS]
    keep = {p["name"] for p in spec["parameters"]}
    tp = spec["trialTemplate"]["trialParameters"]
    dropped = {t["name"] for t in tp if not t["reference"].startswith("$")
               and t["reference"] not in keep}
    spec["trialTemplate"]["trialParameters"] = [t for t in tp if t["name"] not in dropped]
    for replica in spec["trialTemplate"]["trialSpec"]["spec"]["mpiReplicaSpecs"].values():
        for c in replica["template"]["spec"]["containers"]:
            for field in ("command", "args"):
                argv = c.get(field) or []
                out = []
                for a in argv:
                    if any(f"${{trialParameters.{d}}}" in str(a) for d in dropped):
                        out.pop()  # its flag
                        continue
                    out.append(a)
                if argv:
                    c[field] = out
    spec.update(maxTrialCount=2, parallelTrialCount=1, maxFailedTrialCount=1)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_tune_step_runs_the_sweep_and_feeds_training(tmp_path):
    state = tmp_path / "work" / "tune"
    out = io.StringIO()
    with redirect_stdout(out):
        optimal = tune_step(
            str(small_spec(tmp_path)), Target(workdir=str(tmp_path / "work"), run_id="run-1"),
            extra_args=["--trial-command", "echo val_auroc=0.71 images_per_sec=12 val_loss=0.4"],
        )
    assert json.loads((state / "optimal.json").read_text()) == optimal
    assert set(optimal["parameters"]) == TRAIN_FLAGS
    assert optimal["metrics"]["val_auroc"] == pytest.approx(0.71)
    options = apply_hparams(TrainOptions(lr=1.0), json.dumps(optimal["parameters"]))
    argv = options.to_argv()
    assert argv[argv.index("--lr") + 1] == str(float(optimal["parameters"]["lr"]))
    assert argv[argv.index("--batch-size") + 1] == str(int(optimal["parameters"]["batch-size"]))
    assert "[tune-run-1]" in out.getvalue()
    # every trial's metrics for the pipeline, read back from results.json
    logged = tune_trial_metrics(Target(workdir=str(tmp_path / "work"), run_id="run-1"))
    names = [t["trial"] for t in load_results(state)["trials"]]
    assert logged == {
        **{f"trial{n}": f"{name} Succeeded" for n, name in enumerate(names, 1)},
        **{f"trial{n}_{m}": pytest.approx(v) for n in (1, 2) for m, v in
           (("val_auroc", 0.71), ("images_per_sec", 12.0), ("val_loss", 0.4))}}


def test_tune_op_logs_every_trials_metrics_beside_the_best(tmp_path):
    """The component's own body (KFP's Metrics artifact) over a real local sweep."""
    from kfp.dsl import Metrics

    from chexflow.components.definitions import tune_op

    target = Target(workdir=str(tmp_path / "work"), run_id="run-2")
    metrics = Metrics(name="metrics", uri=str(tmp_path / "metrics"))
    with redirect_stdout(io.StringIO()):
        params = tune_op.python_func(
            spec_path=str(small_spec(tmp_path)), data_dir=str(tmp_path / "data"),
            model="densenet121", image_size=64, weights="none", target=target.to_dict(),
            tune_args=["--trial-command", "echo val_auroc=0.71 images_per_sec=12 val_loss=0.4"],
            metrics=metrics)
    trials = load_results(tmp_path / "work" / "tune")["trials"]
    assert len(trials) == 2 and set(json.loads(params)) == TRAIN_FLAGS
    logged = metrics.metadata
    assert logged["best_val_auroc"] == pytest.approx(0.71)
    for n, t in enumerate(trials, 1):
        assert logged[f"trial{n}"] == f"{t['trial']} Succeeded"
        assert logged[f"trial{n}_val_auroc"] == pytest.approx(0.71)
        assert logged[f"trial{n}_images_per_sec"] == pytest.approx(12.0)


def test_tune_job_on_a_cluster_runs_as_the_tune_account_with_the_runs_pvc_as_the_trials_data():
    """The tune step's Job on kubernetes: service account chexflow-tune (katib/rbac.yaml), the
    trialSpec volume `data` becomes the run's PVC, and the preprocess output is named as the
    trial pods see it (the spec mounts `data` at /mnt/chexflow; the steps here see the PVC at
    the host folder behind it)."""
    from chexflow.jobs.render import render

    target = Target(workdir="/srv/pvc/runs/r7", run_id="r7", backend="kubernetes",
                    namespace="team-a", data_pvc="run-pvc", mount_path="/srv/pvc")
    spec, job_target = tune_job(str(SPEC), target, {"data": "/srv/pvc/runs/r7/data",
                                                    "image-size": 64})
    argv = spec.command
    # the pod reads the spec from the run's folder on the PVC (tune_step copies it there)
    assert argv[:4] == ["chexflow", "tune", "/srv/pvc/runs/r7/katib-experiment.yaml", "--cluster"]
    assert "--trial-templates" not in argv  # the shipped spec carries its template
    assert argv[argv.index("--volume") + 1] == "data=run-pvc"
    assert argv[argv.index("--namespace") + 1] == "team-a"  # the run's, not the spec's
    assert argv[argv.index("--set") + 1] == "metadata.name=chexnet-random-r7"  # one per run
    assert "--trial-arg" in argv and "data=/mnt/chexflow/runs/r7/data" in argv
    assert "image-size=64" in argv
    # trials write into the run's folder (the spec's default, runs/katib, is not the run's)
    assert "out=/mnt/chexflow/runs/r7/tune/trials/${trialParameters.trialName}" in argv
    job = render(spec, "team-a", service_account=job_target.service_account)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "chexflow-tune"
    # it waits on the API server: half a core, beside the trials on a small node
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    rbac = [d for d in yaml.safe_load_all((SPEC.parent.parent / "rbac.yaml").read_text()) if d]
    assert {d["metadata"]["name"] for d in rbac} == {"chexflow-tune"}
    assert target.service_account == ""  # the other steps' target is unchanged


def test_tune_job_of_a_spec_naming_a_configmap_reads_its_file_from_the_run_folder(tmp_path):
    """A spec naming ConfigMap chexflow-trial-templates: the pod reads its template from the
    run's folder too (tune_step copies the file there)."""
    target = Target(workdir="/srv/pvc/runs/r7", run_id="r7", backend="kubernetes",
                    namespace="team-a", data_pvc="run-pvc", mount_path="/srv/pvc")
    argv = tune_job(str(configmap_spec("chexnet-random", tmp_path)), target, {})[0].command
    templates = argv[argv.index("--trial-templates") + 1]
    assert templates == "/srv/pvc/runs/r7/katib-trial-templates.yaml"


def test_tune_jobs_of_two_runs_name_their_experiments_apart_within_katibs_limit(tmp_path):
    spec = tmp_path / "long.yaml"  # a copy of the spec
    spec.write_text(SPEC.read_text().replace("name: chexnet-random\n",
                                             "name: chexnet-random-with-a-very-long-name\n", 1))
    names = []
    for run_id in ("tune-then-train-20261123-101500", "tune-then-train-20261123-101501"):
        target = Target(workdir=f"/mnt/chexflow/runs/{run_id}", run_id=run_id,
                        backend="kubernetes", data_pvc="run-pvc")
        argv = tune_job(str(spec), target, {})[0].command
        names.append(argv[argv.index("--set") + 1].removeprefix("metadata.name="))
    assert names == ["chexnet-random-with-a-very-long-3-101500",
                     "chexnet-random-with-a-very-long-3-101501"]
    assert all(len(n) <= 40 for n in names)


def test_tune_job_refuses_data_the_trials_cannot_see():
    target = Target(workdir="/srv/pvc/runs/r7", run_id="r7", backend="kubernetes",
                    data_pvc="run-pvc", mount_path="/srv/pvc")
    with pytest.raises(StepError, match=r"/elsewhere/data: not under /srv/pvc, where the PVC is "
                       r"mounted; the trials could not read it"):
        tune_job(str(SPEC), target, {"data": "/elsewhere/data"})


def test_tuned_optimizer_and_weight_decay_map_onto_train_options():
    options = apply_hparams(TrainOptions(lr=1.0), json.dumps(
        {"lr": 0.01, "optimizer": "sgd", "weight-decay": 0.0001}))
    argv = options.to_argv()
    assert argv[argv.index("--optimizer") + 1] == "sgd"
    assert float(argv[argv.index("--weight-decay") + 1]) == pytest.approx(0.0001)


def test_tuned_parameter_without_a_train_option_is_refused():
    with pytest.raises(StepError, match="'momentum' is not an option of chexflow train"):
        apply_hparams(TrainOptions(), json.dumps({"lr": 0.01, "momentum": 0.9}))
    with pytest.raises(StepError, match="'data' is not an option"):
        apply_hparams(TrainOptions(), json.dumps({"data": "/elsewhere"}))
    with pytest.raises(StepError, match="batch_size 'many' is not int"):
        apply_hparams(TrainOptions(), json.dumps({"batch-size": "many"}))


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.timeout(2400)  # 3 DenseNet trainings: 15 min on 2 cores shared with other work
def test_tune_then_train_runs_locally_end_to_end_on_the_pipelines_data(tmp_path, nih_tfrecords):
    """The README's `chexflow run tune-then-train --katib-spec katib/specs/chexnet-random.yaml`
    with tiny settings: the trials train on the pipeline's data (not an empty volume) with the
    pipeline's model and image size, and the final training takes the optimal trial's values."""
    tune_args = ["--set", "spec.maxTrialCount=2", "--set", "spec.maxFailedTrialCount=2",
                 "--set", "spec.parallelTrialCount=1", "--trial-arg", "epochs=1",
                 "--trial-arg", "steps-per-epoch=2", "--trial-arg", "validation-steps=1",
                 "--trial-arg", "warmup-steps=1"]  # one timed step: images_per_sec reported
    run_chexflow("run", "tune-then-train", "--katib-spec", SPEC, "--data", nih_tfrecords,
                 "--out", tmp_path, "--image-size", 64, "--epochs", 1, "--steps-per-epoch", 2,
                 "--bootstrap", 20, "--param", "tune_args=" + json.dumps(tune_args), timeout=2300)
    (run_dir,) = tmp_path.glob("tune-then-train-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    (state,) = Path(summary["work_dir"]).glob("*/tune/state.json")
    trials = json.loads(state.read_text())["trials"]
    assert [t["status"] for t in trials] == ["Succeeded", "Succeeded"]
    for t in trials:
        argv = t["command"][0].split()
        assert argv[argv.index("--data") + 1] == str(nih_tfrecords)
        assert argv[argv.index("--image-size") + 1] == "64"
        assert argv[argv.index("--weights") + 1] == "none"  # the local run's weights
    optimal = json.loads((state.parent / "optimal.json").read_text())
    tuned = summary["tasks"]["tune-op"]["artifacts"]["metrics"]["metadata"]
    assert tuned["best_val_auroc"] == pytest.approx(optimal["metrics"]["val_auroc"])
    for n, t in enumerate(load_results(state.parent)["trials"], 1):  # every trial, not the best
        assert tuned[f"trial{n}"] == f"{t['trial']} Succeeded"
        for metric in ("val_auroc", "images_per_sec"):
            assert t[metric] is not None and tuned[f"trial{n}_{metric}"] == pytest.approx(
                t[metric])
    trained = summary["tasks"]["train-op"]["artifacts"]["metrics"]["metadata"]
    assert trained["batch_size_per_worker"] == int(optimal["parameters"]["batch-size"])
    assert 0 <= summary["tasks"]["evaluate-op"]["artifacts"]["metrics"]["metadata"][
        "auroc_mean"] <= 1
