"""Katib Experiment specs: the upstream examples and chexflow's own parse, validate and yield
suggestions of the right types within bounds; bad specs fail with the field named; the chexflow
trialSpecs are valid MPIJobs under the real CRD."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from chexflow.envs import trainer_python
from chexflow.jobs.local import quick_horovodrun
from chexflow.katib.experiment.model import format_value
from chexflow.katib.experiment.spec import SpecError, load_experiment, parse_experiment
from chexflow.katib.experiment.trialspec import render_trial_spec, split_mpirun
from chexflow.katib.suggestions.base import History
from chexflow.katib.suggestions.libraries import make_suggester
from tests.conftest import REPO, run_chexflow
from tests.support.katib import in_feasible_space, local_command
from tests.support.reference import reference_dir

EXAMPLE_NAMES = ["bayesian-optimization", "cma-es", "grid", "median-stop", "mpijob-horovod",
                 "multivariate-tpe", "random", "sobol", "tpe"]
SPECS = sorted((REPO / "katib" / "specs").glob("*.yaml"))
MPIJOB_SPECS = [p for p in SPECS if not p.stem.endswith("-trainjob")]
TRAINJOB_SPEC = REPO / "katib" / "specs" / "chexnet-random-trainjob.yaml"


def example(name: str) -> Path:
    """One of Katib's example Experiments in the shared reference folder."""
    return reference_dir() / "katib-examples" / f"{name}.yaml"


def check_in_space(exp, params: dict) -> None:
    assert set(params) == {p.name for p in exp.parameters}
    for p in exp.parameters:
        v = params[p.name]
        if p.type == "int":
            assert isinstance(v, int) and p.min <= v <= p.max, (p.name, v)
        elif p.type == "double":
            assert isinstance(v, float) and p.min <= v <= p.max, (p.name, v)
        else:
            assert v in p.values, (p.name, v)
        assert in_feasible_space(p, v), (p.name, v)


def test_reference_examples_are_all_there():
    names = {p.stem for p in (reference_dir() / "katib-examples").glob("*.yaml")}
    assert set(EXAMPLE_NAMES) <= names


@pytest.mark.parametrize("path", EXAMPLE_NAMES + SPECS,
                         ids=lambda p: p if isinstance(p, str) else p.name)
def test_spec_parses_and_suggests_within_bounds(path: Path | str):
    exp = load_experiment(example(path) if isinstance(path, str) else path)
    suggester = make_suggester(exp, base_seed=3)
    history: list[History] = []
    for round_ in range(3):  # first suggestions, then with results told
        batch = suggester.suggest(history, exp.parallel_trial_count)
        assert len(batch) == exp.parallel_trial_count
        for s in batch:
            check_in_space(exp, s.parameters)
            value = float(round_ + sum(hash(str(v)) % 7 for v in s.parameters.values()))
            history.append(History(s.parameters, value, False, s.optuna_attrs))
    assert len({tuple(sorted(h.parameters.items())) for h in history}) > 1


def test_int_step_and_grid_are_honoured():
    exp = load_experiment(example("mpijob-horovod"))
    batch = make_suggester(exp, 0).suggest([], 20)
    steps = [s.parameters["num-steps"] for s in batch]
    assert all(v % 10 == 0 and 50 <= v <= 150 for v in steps), steps

    grid = load_experiment(example("grid"))
    sug, history = make_suggester(grid, 0), []
    for _ in range(9):
        for s in sug.suggest(history, 5):
            history.append(History(s.parameters, 1.0, False, s.optuna_attrs))
    points = {(h.parameters["lr"], h.parameters["momentum"]) for h in history}
    lrs = [round(0.01 + 0.005 * i, 6) for i in range(9)]
    moms = [0.5, 0.6, 0.7, 0.8, 0.9]
    assert len(history) == 45 and points == {(a, b) for a in lrs for b in moms}


def test_same_history_same_suggestions_and_new_after_more_trials():
    exp = load_experiment(example("tpe"))
    a = make_suggester(exp, 11).suggest([], 3)
    b = make_suggester(exp, 11).suggest([], 3)
    assert [s.parameters for s in a] == [s.parameters for s in b]
    history = [History(s.parameters, 0.5, False) for s in a]
    c = make_suggester(exp, 11).suggest(history, 3)
    assert not {str(s.parameters) for s in c} & {str(s.parameters) for s in a}


def _base() -> dict:
    return yaml.safe_load((example("random")).read_text())


BAD = [
    (lambda d: d["metadata"].update(name="Bad_Name"), "metadata.name"),
    (lambda d: d["metadata"].update(name="a" * 41), "metadata.name"),
    (lambda d: d["spec"].update(maxFailedTrialCount=20), "spec.maxFailedTrialCount"),
    (lambda d: d["spec"].update(parallelTrialCount=13), "spec.parallelTrialCount"),
    (lambda d: d["spec"]["objective"].update(type="best"), "spec.objective.type"),
    (lambda d: d["spec"]["parameters"][0]["feasibleSpace"].update(min="0.9"),
     "spec.parameters[0].feasibleSpace"),
    (lambda d: d["spec"]["parameters"][1]["feasibleSpace"].update(max="lots"),
     "spec.parameters[1].feasibleSpace.max"),
    (lambda d: d["spec"]["parameters"][0].update(parameterType="float"),
     "spec.parameters[0].parameterType"),
    (lambda d: d["spec"]["trialTemplate"]["trialParameters"][0].update(reference="nope"),
     "spec.trialTemplate.trialParameters[0].reference"),
    (lambda d: d["spec"]["trialTemplate"]["trialParameters"].append(
        {"name": "unused", "reference": "${trialSpec.Name}"}),
     "parameter name: unused in spec.trialParameters not found in spec.trialTemplate"),
    (lambda d: d["spec"]["algorithm"].update(algorithmSettings=[{"name": "gamma", "value": "2"}]),
     "unknown setting gamma for algorithm random"),
    (lambda d: d["spec"]["algorithm"].update(algorithmName="hyperband"),
     "r_l and resource_name must be set."),
    (lambda d: d["spec"]["algorithm"].update(algorithmName="grid"),
     "step is nil; For discrete search space, all parameters must include step"),
    (lambda d: d["spec"].update(earlyStopping={"algorithmName": "medianstop", "algorithmSettings":
                                               [{"name": "start_step", "value": "0"}]}),
     "spec.earlyStopping.algorithmSettings[0].value"),
    (lambda d: d["spec"]["objective"].update(
        metricStrategies=[{"name": "accuracy", "value": "max"}]),
     "spec.objective.metricStrategies[0].name"),
    (lambda d: d["spec"]["parameters"][0]["feasibleSpace"].update(
        distribution="logUniform", min="0"), "must be greater than 0 for logUniform"),
]


@pytest.mark.parametrize("mutate,expected", BAD, ids=[b[1][:40] for b in BAD])
def test_invalid_specs_name_the_field(mutate, expected):
    d = _base()
    mutate(d)
    with pytest.raises(SpecError) as err:
        parse_experiment(d, "x.yaml")
    assert expected in str(err.value)
    assert str(err.value).startswith("x.yaml: ")


ONE_PARAMETER_ERROR = [
    (lambda d: d["spec"]["parameters"][0]["feasibleSpace"].update(min="0.9"), "must not be"),
    (lambda d: d["spec"]["parameters"][1]["feasibleSpace"].update(max="lots"), "not a number"),
    (lambda d: d["spec"]["parameters"][0].update(parameterType="float"), "not supported"),
    (lambda d: d["spec"]["parameters"][0].pop("feasibleSpace"), "must be specified"),
]


@pytest.mark.parametrize("mutate,expected", ONE_PARAMETER_ERROR,
                         ids=[b[1] for b in ONE_PARAMETER_ERROR])
def test_a_bad_parameter_is_one_error_not_also_a_missing_reference(mutate, expected):
    """The trialParameters reference to a parameter with an error of its own still exists: no
    second error saying it does not."""
    d = _base()
    mutate(d)
    with pytest.raises(SpecError) as err:
        parse_experiment(d, "x.yaml")
    assert expected in str(err.value) and "; " not in str(err.value), str(err.value)


def test_cli_reports_a_bad_spec_in_one_line(tmp_path: Path):
    d = _base()
    d["spec"]["trialTemplate"]["trialParameters"][1]["reference"] = "mom"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(d))
    proc = run_chexflow("tune", bad, "--dry-run", "--state", tmp_path / "s", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "trialParameters[1].reference: parameter reference mom does not exist" in lines[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("path", MPIJOB_SPECS, ids=lambda p: p.name)
def test_chexnet_spec_is_katib_and_mpijob_v2beta1(path: Path):
    from chexflow.jobs.schema import validate_mpijob

    exp = load_experiment(path)
    obj = exp.objective
    assert (obj.type, obj.metric, obj.goal) == ("maximize", "val_auroc", 0.84)
    assert "images_per_sec" in obj.additional
    raw_strategies = {s["name"] for s in exp.raw["spec"]["objective"]["metricStrategies"]}
    assert raw_strategies == set(obj.metric_names)
    assert exp.early_stopping == "medianstop"
    kinds = {p.name: p.type for p in exp.parameters}
    assert kinds["optimizer"] == "categorical" and kinds["batch-size"] == "discrete"
    assert "weight-decay" in kinds
    tt = exp.trial_template
    assert tt["primaryPodLabels"] == {"training.kubeflow.org/job-role": "launcher"}
    assert 'type=="Succeeded"' in tt["successCondition"]
    assert 'type=="Failed"' in tt["failureCondition"]

    params = make_suggester(exp, 0).suggest([], 1)[0].parameters
    spec = render_trial_spec(exp, "chexnet-trial-1", params)
    assert "${" not in yaml.safe_dump(spec)
    mpijob = copy.deepcopy(spec)
    mpijob["metadata"] = {"name": "chexnet-trial-1", "namespace": "kubeflow"}
    validate_mpijob(mpijob, reference_dir() / "crds" / "mpijobs.kubeflow.org.v2beta1.yaml")

    launcher = spec["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["name"] == tt["primaryContainerName"]
    # Katib's pod webhook refuses any trial pod without a container of that name
    for replica in spec["spec"]["mpiReplicaSpecs"].values():
        names = [c["name"] for c in replica["template"]["spec"]["containers"]]
        assert tt["primaryContainerName"] in names, names
    n, program = split_mpirun(launcher["command"] + launcher["args"], "launcher")
    assert n == spec["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert program[:3] == ["python", "-m", "chexflow.train.worker"]
    assert program[program.index("--lr") + 1] == format_value(exp.parameter("lr"), params["lr"])
    assert program[program.index("--out") + 1] == "/mnt/chexflow/runs/katib/chexnet-trial-1"


def test_trainjob_spec_trials_are_valid_trainjobs_whose_launcher_pod_prints_the_metrics():
    """chexnet-random-trainjob: the trial is a TrainJob valid under Trainer's CRD, on
    chexflow's Horovod runtime; Katib's TrainJob conditions; the primary pod is the runtime's
    launcher replicated job (runLauncherAsNode), whose container is primaryContainerName."""
    from chexflow.jobs.schema import validate_against_crd
    from chexflow.jobs.trainjob import RUNTIME_NAME, horovod_runtime
    from chexflow.katib.experiment.spec import DEFAULT_CONDITIONS
    from tests.test_trainjob import trainer_crd

    exp = load_experiment(TRAINJOB_SPEC)
    tt = exp.trial_template
    success, failure, _ = DEFAULT_CONDITIONS["TrainJob"]
    assert (tt["successCondition"], tt["failureCondition"]) == (success, failure)
    assert tt["primaryPodLabels"] == {"jobset.sigs.k8s.io/replicatedjob-name": "launcher"}
    runtime = horovod_runtime()
    assert runtime["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] is True
    jobs = {j["name"]: j["template"]["spec"]["template"]["spec"]
            for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for pod in jobs.values():  # Katib's pod webhook wants the container in every trial pod
        assert [c["name"] for c in pod["containers"]] == [tt["primaryContainerName"]]
    assert "launcher" in jobs

    params = make_suggester(exp, 0).suggest([], 1)[0].parameters
    spec = render_trial_spec(exp, "chexnet-trial-1", params)
    assert "${" not in yaml.safe_dump(spec)
    assert spec["spec"]["runtimeRef"]["name"] == RUNTIME_NAME
    trainjob = {**copy.deepcopy(spec), "metadata": {"name": "chexnet-trial-1",
                                                    "namespace": "kubeflow"}}
    validate_against_crd(trainjob, trainer_crd("trainjobs"), version="v1alpha1")
    n, program = split_mpirun(spec["spec"]["trainer"]["command"], "trainer")
    assert n == spec["spec"]["trainer"]["numNodes"] * spec["spec"]["trainer"]["numProcPerNode"]
    assert program[:3] == ["python", "-m", "chexflow.train.worker"]
    assert program[program.index("--lr") + 1] == format_value(exp.parameter("lr"), params["lr"])
    assert program[program.index("--out") + 1] == "/mnt/chexflow/runs/katib/chexnet-trial-1"



def test_trainjob_spec_runs_locally_as_the_mpijob_spec_does_and_a_foreign_runtime_is_refused(
        tmp_path: Path):
    """The local runner knows chexflow's runtime: a TrainJob trial on it runs its trainer
    command as an MPIJob launcher's (mpirun -> horovodrun, the data volume of its
    runtimePatches mapped), the very argv of chexnet-random.yaml's trial. A TrainJob on a
    runtime chexflow does not ship is refused in one line, starting nothing."""
    mpijob = load_experiment(REPO / "katib" / "specs" / "chexnet-random.yaml")
    trainjob = load_experiment(TRAINJOB_SPEC)
    params = make_suggester(trainjob, 0).suggest([], 1)[0].parameters
    argvs = [local_command(exp, render_trial_spec(exp, "t1", params), {"data": tmp_path},
                           tmp_path / "vols", ["epochs=1", "weights=none"])
             for exp in (mpijob, trainjob)]
    assert argvs[0] == argvs[1]
    argv, env = argvs[1]
    assert argv[:3] == quick_horovodrun() and argv[3:8] == ["-np", "2", "-H", "localhost:2",
                                                            "--gloo"]
    assert argv[argv.index("--out") + 1] == str(tmp_path.resolve() / "runs/katib/t1")
    assert env["CHEXFLOW_JOB_NAME"] == "t1"

    foreign = yaml.safe_load(TRAINJOB_SPEC.read_text())
    foreign["spec"]["trialTemplate"]["trialSpec"]["spec"]["runtimeRef"]["name"] = \
        "torch-distributed"
    path = tmp_path / "foreign.yaml"
    path.write_text(yaml.safe_dump(foreign))
    proc = run_chexflow("tune", path, "--state", tmp_path / "s", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "kind TrainJob (trainer.kubeflow.org/v1alpha1) has no pod template" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_mpijob_launcher_becomes_horovodrun_with_local_volumes(tmp_path: Path):
    exp = load_experiment(SPECS[0])
    params = make_suggester(exp, 0).suggest([], 1)[0].parameters
    spec = render_trial_spec(exp, "t1", params)
    argv, env = local_command(exp, spec, {"data": tmp_path}, tmp_path / "vols",
                              ["epochs=1", "weights=none"])
    assert argv[:3] == quick_horovodrun()  # Horovod's horovodrun, less its build checks
    assert argv[3:8] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert argv[8] == str(trainer_python())  # the environment with TensorFlow and Horovod
    assert argv[9:11] == ["-m", "chexflow.train.worker"]
    assert argv[argv.index("--data") + 1] == str(tmp_path.resolve() / "tfrecords")
    assert argv[argv.index("--out") + 1] == str(tmp_path.resolve() / "runs/katib/t1")
    assert argv[argv.index("--epochs") + 1] == "1" and argv[argv.index("--weights") + 1] == "none"
    assert "-mca" not in argv and env["PYTHONUNBUFFERED"] == "1"


def test_a_hostpath_volume_is_its_own_host_folder_to_the_local_runner(tmp_path: Path):
    """The local runner runs on the host, so a hostPath volume is that host folder (it was
    state/volumes/NAME, and a trial's log written there was not where the Experiment said);
    --volume still wins, and other volumes stay under the state folder."""
    from chexflow.katib.experiment.trialspec import volume_mounts

    pod = {"volumes": [{"name": "logs", "hostPath": {"path": str(tmp_path / "host")}},
                       {"name": "scratch", "emptyDir": {}}],
           "containers": [{"volumeMounts": [{"name": "logs", "mountPath": "/logs"},
                                            {"name": "scratch", "mountPath": "/tmp/s"}]}]}
    (tmp_path / "host").mkdir()
    mounts = volume_mounts([pod], {}, tmp_path / "vols")
    assert mounts == {"/logs": (tmp_path / "host").resolve(),
                      "/tmp/s": (tmp_path / "vols/scratch").resolve()}
    assert volume_mounts([pod], {"logs": tmp_path / "mine"}, tmp_path / "vols",
                         create=False)["/logs"] == (tmp_path / "mine").resolve()


def test_dry_run_prints_suggestions_and_writes_nothing(tmp_path: Path):
    proc = run_chexflow("tune", example("bayesian-optimization"),
                        "--dry-run", "--state", tmp_path / "s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 3 and "--lr=" in lines[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("case, expected", [
    ("folder", "a folder; expected an Experiment YAML file"),
    ("binary", "not UTF-8 text (byte 0); expected an Experiment YAML file"),
    ("latin-1", "not UTF-8 text (byte 26); expected an Experiment YAML file"),
])
def test_a_spec_that_is_not_a_yaml_text_file_is_one_line(tmp_path, case, expected):
    """A folder, a binary file or a non-UTF-8 file given as the spec: one line naming it, no
    traceback (each was a traceback)."""
    path = tmp_path / "spec"
    if case == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe\x00\x01binary" if case == "binary"
                         else b"kind: Experiment\nname: caf\xe9\n")
    proc = run_chexflow("tune", path, "--dry-run", "--state", tmp_path / "s", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"chexflow tune: error: {path}: {expected}"
    assert not (tmp_path / "s").exists()


def test_a_set_value_that_is_not_yaml_is_one_line(tmp_path):
    """`--set 'x=[1'` (an unclosed flow list): one line saying how to quote it (a traceback)."""
    proc = run_chexflow("tune", SPECS[0], "--dry-run", "--set", "x=[1", "--state",
                        tmp_path / "s", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "chexflow tune: error: --set 'x=[1': the value is not valid YAML (while parsing a flow "
        "sequence); quote it as a string, e.g. x='\"[1\"'"]


@pytest.mark.parametrize("key, expected", [
    ("spec.maxTrailCount=4", "spec has no field maxTrailCount (did you mean maxTrialCount?)"),
    ("spec.parameters[0].feasibleSpace.mx=1",
     "spec.parameters[0].feasibleSpace has no field mx (did you mean max?)"),
    ("metadata.nmae=x", "metadata has no field nmae (did you mean name?)"),
])
def test_a_set_path_that_is_no_katib_field_is_refused_with_the_nearest(tmp_path, key, expected):
    """A misspelled `--set` field (Katib's SDK models give the fields) is one line naming it and
    the nearest field (`spec.maxTrailCount=4` was ignored and 16 trials ran)."""
    proc = run_chexflow("tune", example("random"), "--dry-run", "--set", key, "--state",
                        tmp_path / "s", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"chexflow tune: error: --set {key}: {expected}"]


def test_set_paths_katib_declares_are_applied(tmp_path):
    """Fields of the Experiment, labels (a map) and the free-form trialSpec are still set."""
    exp = load_experiment(example("random"), [
        "spec.maxTrialCount=4", "metadata.labels.team=cxr",
        "spec.parameters[0].feasibleSpace.max=0.02",
        "spec.trialTemplate.trialSpec.spec.backoffLimit=1"])
    assert exp.max_trial_count == 4 and exp.raw["metadata"]["labels"] == {"team": "cxr"}
    assert exp.parameters[0].high == 0.02
    assert exp.trial_template["trialSpec"]["spec"]["backoffLimit"] == 1
