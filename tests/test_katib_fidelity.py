"""Katib fidelity: chexflow accepts what Katib's webhook and suggestion services accept and
refuses what they refuse (with Katib's reason and the field path), sobol and cmaes keep their
state across suggestion rounds and resumed sweeps, and File / TensorFlowEvent collectors run
locally with the same result as StdOut."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from chexflow.katib.experiment.spec import SpecError, parse_experiment
from chexflow.katib.local.runner import LocalRunner
from chexflow.katib.local.state import open_state
from chexflow.katib.suggestions.base import History
from chexflow.katib.suggestions.libraries import make_suggester
from tests.conftest import read_json, run_chexflow
from tests.support.reference import reference_dir

PY = sys.executable


def example(name: str) -> dict:
    """One of Katib's example Experiments (shared reference folder) as a mapping."""
    return yaml.safe_load((reference_dir() / "katib-examples" / f"{name}.yaml").read_text())


def write(tmp_path: Path, doc: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def tune(spec: Path, state: Path, *extra, check: bool = True):
    return run_chexflow("tune", spec, "--state", state, "--no-progress", *extra, check=check,
                        timeout=300)


def budget(trials: int, parallel: int = 1) -> list[str]:
    """--set arguments for a small sweep (the examples allow 3 failures and 3 in parallel)."""
    return ["--set", f"spec.maxTrialCount={trials}", "--set", f"spec.parallelTrialCount={parallel}",
            "--set", f"spec.maxFailedTrialCount={trials}"]


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# ---- sobol and cmaes state ------------------------------------------------------------------

def _finish(runner: LocalRunner, recs, metric: str) -> None:
    for rec in recs:
        rec.status = "Succeeded"
        rec.logs = {metric: [rec.parameters["lr"] + rec.parameters["momentum"]]}
    runner.state.save()


def test_sobol_gives_distinct_points_across_rounds_and_after_a_resume(tmp_path: Path):
    exp = parse_experiment(example("sobol"), "sobol.yaml")
    state_args = (tmp_path / "s", exp.name, exp.fingerprint(), exp.raw, "true", 7)
    runner = LocalRunner(exp, open_state(*state_args), "true", progress=False)
    for _ in range(3):  # three suggestion rounds
        _finish(runner, runner.suggest(3), exp.objective.metric)
    assert runner.state.optuna_study_attrs  # the QMC counter is saved with the sweep
    resumed = LocalRunner(exp, open_state(*state_args), "true", progress=False)
    _finish(resumed, resumed.suggest(3), exp.objective.metric)
    points = [(t.parameters["lr"], t.parameters["momentum"]) for t in resumed.state.trials]
    assert len(points) == 12 and len(set(points)) == 12, points


def test_installed_optuna_ignores_cmaes_restarts_so_chexflow_runs_its_own_ipop():
    import optuna

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optuna.samplers.CmaEsSampler(restart_strategy="ipop")
    assert any("falls back to `None`" in str(w.message) for w in caught)

    exp = parse_experiment(example("cma-es"), "cma-es.yaml")  # restart_strategy: ipop
    history: list[History] = []
    while len(history) < 240:  # a flat objective: CMA-ES stops, then restarts
        for s in make_suggester(exp, 5).suggest(history, 3):
            history.append(History(s.parameters, 1.0, False, s.optuna_attrs))
    runs = [(h.optuna_attrs["cma:restart"], h.optuna_attrs["cma:popsize"]) for h in history]
    assert runs[0] == (0, 6) and (1, 12) in runs  # IPOP: the population doubles
    assert runs == sorted(runs)


def test_bipop_cmaes_alternates_small_and_large_populations():
    d = example("cma-es")
    d["spec"]["algorithm"]["algorithmSettings"] = [{"name": "restart_strategy", "value": "bipop"}]
    exp = parse_experiment(d, "cma-es.yaml")
    history: list[History] = []
    while len(history) < 270:  # a flat objective: each run stops after its tolerance window
        for s in make_suggester(exp, 5).suggest(history, 3):
            history.append(History(s.parameters, 1.0, False, s.optuna_attrs))
    runs = []
    for h in history:
        run = (h.optuna_attrs["cma:restart"], h.optuna_attrs["cma:popsize"])
        if run not in runs:
            runs.append(run)
    # BIPOP: after the first run a small-population run (budget below the large one), then a
    # large one with the population doubled
    assert runs[:3] == [(0, 6), (1, 6), (2, 12)]


@pytest.mark.slow
def test_ipop_cmaes_sweep_runs_locally_and_shows_its_generations(tmp_path: Path):
    cmd = (f"{PY} -c 'import sys; print(\"loss=0.5\")' ${{trialParameters.learningRate}} "
           "${trialParameters.momentum}")
    tune(write(tmp_path, example("cma-es")), tmp_path / "s", "--trial-command", cmd,
         "--set", "spec.maxTrialCount=9")
    trials = read_json(tmp_path / "s" / "state.json")["trials"]
    # popsize 6 for 2 parameters: a generation is told once 6 of its trials have results
    gens = [t["optuna_attrs"]["cma:generation"] for t in trials]
    assert gens[:6] == [0] * 6 and gens[-1] == 1 and gens == sorted(gens)
    assert {t["optuna_attrs"]["cma:popsize"] for t in trials} == {6}


# ---- Katib's webhook rules: refused with Katib's reason -------------------------------------

def _dup_reference(d):
    d["spec"]["trialTemplate"]["trialParameters"].append({"name": "lr2", "reference": "lr"})
    d["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0][
        "command"].append("--lr2=${trialParameters.lr2}")


def _unknown_job_field(d):
    d["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0][
        "comand"] = ["python"]


REFUSED = [
    (_dup_reference, "spec.trialTemplate.trialParameters[2].reference: parameter reference lr "
     "can't be duplicated"),
    (lambda d: d["spec"]["trialTemplate"]["trialSpec"].setdefault("metadata", {}).update(
        name="fixed"), "metadata.name and metadata.namespace in spec.trialTemplate must be "
     "omitted"),
    (_unknown_job_field, "unable to convert: /spec/template/spec/containers/0/comand to Job"),
    (lambda d: d["spec"]["trialTemplate"].update(configMap={
        "configMapName": "t", "configMapNamespace": "kubeflow", "templatePath": "job.yaml"}),
     "only one of spec.trialTemplate.trialSpec or spec.trialTemplate.configMap can be "
     "specified"),
    (lambda d: d["spec"].update(algorithm={"algorithmName": "grid"}, maxTrialCount=100,
                                parallelTrialCount=3),
     "spec.maxTrialCount: Max Trial Count: 100 > all possible search combinations: 45"),
    (lambda d: d["spec"]["algorithm"].update(algorithmName="hyperband", algorithmSettings=[
        {"name": "r_l", "value": "9"}, {"name": "resource_name", "value": "lr"}]),
     "spec.parallelTrialCount: parallelTrialCount must be not less than 9."),
    (lambda d: d["spec"]["algorithm"].update(algorithmName="pbt", algorithmSettings=[
        {"name": "n_population", "value": "4"}, {"name": "truncation_threshold", "value": "0.2"}]),
     "Param(n_population) should be >= 5"),
]


@pytest.mark.parametrize("mutate,reason", REFUSED, ids=[r[1][:48] for r in REFUSED])
def test_katib_webhook_and_service_rules_are_refused_with_katibs_reason(mutate, reason):
    d = example("grid") if "Max Trial Count" in reason else example("random")
    mutate(d)
    with pytest.raises(SpecError) as err:
        parse_experiment(d, "x.yaml")
    assert reason in str(err.value)


# ---- what Katib accepts is accepted -------------------------------------------------------

def _kind_spec(api: str, kind: str, replicas_key: str | None) -> dict:
    pod = {"spec": {"containers": [{
        "name": "training-container", "image": "x",
        # words Katib's unquoted `sh -c` join leaves as they are (no quotes, no parentheses)
        "command": ["echo", "loss=${trialParameters.learningRate}",
                    "${trialParameters.momentum}"]}]}}
    if replicas_key is None:
        return {"apiVersion": api, "kind": kind, "spec": {"template": pod}}
    return {"apiVersion": api, "kind": kind,
            "spec": {replicas_key: {"Worker": {"replicas": 1, "template": pod}}}}


KINDS = [
    ("kubeflow.org/v1", "TFJob", "tfReplicaSpecs", 'type=="Succeeded"',
     {"training.kubeflow.org/job-role": "master"}),
    ("kubeflow.org/v1", "PyTorchJob", "pytorchReplicaSpecs", 'type=="Succeeded"',
     {"training.kubeflow.org/job-role": "master"}),
    ("kubeflow.org/v1", "XGBoostJob", "xgbReplicaSpecs", 'type=="Succeeded"',
     {"training.kubeflow.org/job-role": "master"}),
    ("kubeflow.org/v1", "MPIJob", "mpiReplicaSpecs", 'type=="Succeeded"',
     {"training.kubeflow.org/job-role": "master"}),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob", None, 'type=="Complete"',
     {"jobset.sigs.k8s.io/replicatedjob-name": "node",
      "batch.kubernetes.io/job-completion-index": "0"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("api,kind,replicas,success,labels", KINDS, ids=[k[1] for k in KINDS])
def test_trial_kinds_without_conditions_get_katibs_defaults(api, kind, replicas, success, labels,
                                                           tmp_path: Path):
    d = example("random")
    tt = d["spec"]["trialTemplate"]
    tt["trialSpec"] = _kind_spec(api, kind, replicas)
    for key in ("successCondition", "failureCondition", "primaryPodLabels"):
        tt.pop(key, None)
    exp = parse_experiment(d, "x.yaml")
    assert success in exp.trial_template["successCondition"]
    assert 'type=="Failed"' in exp.trial_template["failureCondition"]
    assert exp.trial_template["primaryPodLabels"] == labels
    # and the trial's primary container runs locally
    tune(write(tmp_path, d), tmp_path / "s", *budget(1))
    res = read_json(tmp_path / "s" / "results.json")
    assert [t["status"] for t in res["trials"]] == ["Succeeded"]


def test_min_equal_max_parameters_are_accepted_and_fixed():
    for algorithm in ("random", "tpe", "bayesianoptimization", "multivariate-tpe", "sobol"):
        d = example("random")
        d["spec"]["algorithm"] = {"algorithmName": algorithm}
        d["spec"]["parameters"][1]["feasibleSpace"].update(min="0.7", max="0.7")
        exp = parse_experiment(d, "x.yaml")
        history: list[History] = []
        for _ in range(2):
            for s in make_suggester(exp, 1).suggest(history, 3):
                assert s.parameters["momentum"] == 0.7 and 0.01 <= s.parameters["lr"] <= 0.05
                history.append(History(s.parameters, s.parameters["lr"], False, s.optuna_attrs))


def test_int_bounds_random_tpe_and_zero_settings_are_no_stricter_than_katib():
    d = example("random")
    d["spec"]["parameters"].append({"name": "layers", "parameterType": "int",
                                    "feasibleSpace": {"min": "1.5", "max": "8.5"}})
    d["spec"]["trialTemplate"]["trialParameters"].append({"name": "layers",
                                                          "reference": "layers"})
    d["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0][
        "command"].append("--layers=${trialParameters.layers}")
    for algorithm in ("random", "tpe"):  # Katib's hyperopt reads int bounds as floats
        d["spec"]["algorithm"] = {"algorithmName": algorithm}
        exp = parse_experiment(copy.deepcopy(d), "x.yaml")
        values = {s.parameters["layers"] for s in make_suggester(exp, 2).suggest([], 30)}
        assert values <= set(range(2, 9)) and len(values) > 3
    d["spec"]["algorithm"] = {"algorithmName": "bayesianoptimization"}
    with pytest.raises(SpecError, match=r"parameters\[2\].feasibleSpace.min: 1.5 is not an int"):
        parse_experiment(copy.deepcopy(d), "x.yaml")

    for algorithm, setting in (("bayesianoptimization", "n_initial_points"),
                               ("multivariate-tpe", "n_ei_candidates"),
                               ("multivariate-tpe", "n_startup_trials")):
        d = example("random")
        d["spec"]["algorithm"] = {"algorithmName": algorithm,
                                  "algorithmSettings": [{"name": setting, "value": "0"}]}
        parse_experiment(d, "x.yaml")
    d = example("cma-es")  # goptuna reads three settings and ignores the others
    d["spec"]["algorithm"]["algorithmSettings"].append({"name": "popsize", "value": "9"})
    parse_experiment(d, "x.yaml")


@pytest.mark.slow
def test_a_library_that_fails_fails_the_experiment_as_katib_does(tmp_path: Path):
    d = example("bayesian-optimization")
    d["spec"]["algorithm"]["algorithmSettings"] = [{"name": "n_initial_points", "value": "0"}]
    proc = tune(write(tmp_path, d), tmp_path / "s", "--trial-command", "echo loss=1",
                check=False)
    assert proc.returncode == 1
    cond = read_json(tmp_path / "s" / "results.json")["condition"]
    assert (cond["type"], cond["reason"]) == ("Failed", "ExperimentFailed")
    assert cond["message"].startswith("Suggestion has failed: scikit-optimize")


@pytest.mark.slow
def test_configmap_templates_pass_validation_and_locally_need_their_file_or_a_trial_command(
        tmp_path: Path):
    d = example("random")
    tt = d["spec"]["trialTemplate"]
    del tt["trialSpec"]
    tt["configMap"] = {"configMapName": "trial-templates", "configMapNamespace": "kubeflow",
                       "templatePath": "defaultTrialTemplate.yaml"}
    with pytest.raises(SpecError, match="successCondition and failureCondition must be spec"):
        parse_experiment(copy.deepcopy(d), "x.yaml")  # no trialSpec: no kind, no defaults
    tt["successCondition"] = 'status.conditions.#(type=="Complete")#|#(status=="True")#'
    tt["failureCondition"] = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
    parse_experiment(copy.deepcopy(d), "x.yaml")
    spec = write(tmp_path, d)
    line = one_error_line(tune(spec, tmp_path / "s", check=False))
    assert ("spec.trialTemplate.configMap: ConfigMap kubeflow/trial-templates "
            "(defaultTrialTemplate.yaml) is in none of "
            f"{tmp_path / 'trial-templates.yaml'}, {tmp_path.parent / 'trial-templates.yaml'}"
            ": give its file with --trial-templates FILE, or run with --trial-command or "
            "--cluster") in line
    assert not (tmp_path / "s").exists()
    cmd = f"{PY} -c 'import sys; print(\"loss=\" + sys.argv[1])' ${{trialParameters.learningRate}}"
    tune(spec, tmp_path / "s2", "--trial-command", cmd, *budget(2))
    assert read_json(tmp_path / "s2" / "results.json")["counts"]["Succeeded"] == 2


@pytest.mark.slow
def test_collector_kinds_are_accepted_and_cluster_only_ones_refused_locally(tmp_path: Path):
    for collector in ({"collector": {"kind": "File"}},
                      {"collector": {"kind": "TensorFlowEvent"}},
                      {"collector": {"kind": "Custom", "customCollector": {
                          "name": "c", "image": "x"}}}):
        d = example("random")
        d["spec"]["metricsCollectorSpec"] = collector
        exp = parse_experiment(d, "x.yaml")
        assert exp.collector.kind == collector["collector"]["kind"]
    assert exp.collector.kind == "Custom"
    line = one_error_line(tune(write(tmp_path, d), tmp_path / "s", check=False))
    assert "spec.metricsCollectorSpec.collector.kind: Custom: the local runner collects" in line
    d["spec"]["metricsCollectorSpec"] = {}
    d["spec"]["algorithm"] = {"algorithmName": "hyperband", "algorithmSettings": [
        {"name": "r_l", "value": "3"}, {"name": "resource_name", "value": "lr"}]}
    line = one_error_line(tune(write(tmp_path, d), tmp_path / "s", check=False))
    assert "hyperband runs only on a cluster" in line


@pytest.mark.slow
def test_metric_names_with_spaces_under_a_custom_metrics_format(tmp_path: Path):
    d = example("random")
    d["spec"]["objective"].update(objectiveMetricName="val loss",
                                  additionalMetricNames=["train acc"])
    d["spec"]["metricsCollectorSpec"] = {"source": {"filter": {"metricsFormat": [
        r"([\w ]+):\s*([+-]?\d*(\.\d+)?)"]}}}
    cmd = (f"{PY} -c 'import sys; print(\"val loss: \" + sys.argv[1]); print(\"train acc: 0.5\")' "
           "${trialParameters.learningRate}")
    tune(write(tmp_path, d), tmp_path / "s", "--trial-command", cmd, *budget(2))
    trials = read_json(tmp_path / "s" / "results.json")["trials"]
    assert all(t["val loss"] == t["lr"] and t["train acc"] == 0.5 for t in trials)


# ---- shapes: one line naming the field, no traceback ----------------------------------------

SHAPES = [
    (lambda d: d["spec"]["trialTemplate"]["trialParameters"].append("lr"),
     "spec.trialTemplate.trialParameters[2]: expected a mapping, got str 'lr'"),
    (lambda d: d["spec"]["objective"].update(metricStrategies=["loss"]),
     "spec.objective.metricStrategies[0]: expected a mapping, got str 'loss'"),
    (lambda d: d["spec"]["parameters"][0].update(feasibleSpace=["0.01", "0.05"]),
     "spec.parameters[0].feasibleSpace: expected a mapping, got a list"),
    (lambda d: d["spec"]["objective"].update(additionalMetricNames="loss2"),
     "spec.objective.additionalMetricNames: expected a list, got str 'loss2'"),
    (lambda d: d.update(spec=["a"]), "spec: expected a mapping, got a list"),
]


@pytest.mark.parametrize("mutate,expected", SHAPES, ids=[s[1][:40] for s in SHAPES])
def test_wrong_shapes_are_one_line_naming_the_field(mutate, expected, tmp_path: Path):
    d = example("random")
    mutate(d)
    line = one_error_line(tune(write(tmp_path, d), tmp_path / "s", "--dry-run", check=False))
    assert expected in line


def _paths(node, prefix=()):
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


@pytest.mark.parametrize("name", ["random", "median-stop", "mpijob-horovod"])
def test_any_field_of_the_wrong_shape_is_a_spec_error_never_a_traceback(name):
    doc = example(name)
    crashes, refused = [], 0
    for path in [p for p in _paths(doc) if p]:
        for wrong in ("x", ["a"], {"a": 1}, 3, None, True):
            d = copy.deepcopy(doc)
            node = d
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = wrong
            try:
                parse_experiment(d, "x.yaml")
            except SpecError as e:
                refused += 1
                assert "\n" not in str(e)
            except Exception as e:  # noqa: BLE001 (the test looks for any traceback)
                crashes.append(f"{path} = {wrong!r}: {type(e).__name__}: {e}")
    assert not crashes, crashes[:5]
    assert refused > 100


# ---- File and TensorFlowEvent collectors end to end ----------------------------------------

STDOUT = (f"{PY} -c 'import sys; lr, m = map(float, sys.argv[1:]); "
          "[print(f\"loss={(lr - 0.03) ** 2 * 1000 + (m - 0.7) ** 2 + e / 10:.6f}\") "
          "for e in (3, 1, 2)]' ${trialParameters.learningRate} ${trialParameters.momentum}")
FILE = (f"{PY} -c 'import sys, json; lr, m = map(float, sys.argv[1:3]); f = open(sys.argv[3], "
        "\"w\"); [print(json.dumps({{\"loss\": f\"{{(lr - 0.03) ** 2 * 1000 + (m - 0.7) ** 2 + "
        "e / 10:.6f}}\"}}), file=f) for e in (3, 1, 2)]' "
        "${{trialParameters.learningRate}} ${{trialParameters.momentum}} {path}")
TFEVENT = ("{trainer} -c 'import sys, tensorflow as tf; lr, m = map(float, sys.argv[1:3]); "
           "w = tf.summary.create_file_writer(sys.argv[3]); w.set_as_default(); "
           "[tf.summary.scalar(\"loss\", (lr - 0.03) ** 2 * 1000 + (m - 0.7) ** 2 + e / 10, "
           "step=i) for i, e in enumerate((3, 1, 2))]; w.flush()' "
           "${{trialParameters.learningRate}} ${{trialParameters.momentum}} {path}")


@pytest.mark.slow
def test_file_and_tfevent_collectors_report_the_stdout_objective(tmp_path: Path):
    from chexflow.envs import trainer_python

    base = example("random")
    base["spec"]["algorithm"]["algorithmSettings"] = [{"name": "random_state", "value": "3"}]
    runs = {"stdout": ({}, STDOUT)}
    runs["file"] = ({"collector": {"kind": "File"}, "source": {"fileSystemPath": {
        "path": "/var/log/katib/metrics.json", "kind": "File", "format": "JSON"}}},
        FILE.format(path="/var/log/katib/metrics.json"))
    runs["tfevent"] = ({"collector": {"kind": "TensorFlowEvent"}, "source": {"fileSystemPath": {
        "path": "/var/log/katib/tfevent/", "kind": "Directory"}}},
        TFEVENT.format(trainer=trainer_python(), path="/var/log/katib/tfevent/"))
    results = {}
    for name, (collector, cmd) in runs.items():
        d = copy.deepcopy(base)
        d["spec"]["metricsCollectorSpec"] = collector
        tune(write(tmp_path, d, f"{name}.yaml"), tmp_path / name, "--trial-command", cmd,
             *budget(2, parallel=2))
        results[name] = read_json(tmp_path / name / "results.json")
    for name in ("file", "tfevent"):
        assert [t["status"] for t in results[name]["trials"]] == ["Succeeded"] * 2
        for mine, ref in zip(results[name]["trials"], results["stdout"]["trials"], strict=True):
            assert (mine["lr"], mine["momentum"]) == (ref["lr"], ref["momentum"])
            assert mine["metric_logs"]["loss"] == pytest.approx(ref["metric_logs"]["loss"],
                                                                abs=1e-5)
        assert results[name]["optimal"]["metrics"]["loss"] == pytest.approx(
            results["stdout"]["optimal"]["metrics"]["loss"], abs=1e-5)
    assert (tmp_path / "tfevent" / "trials").is_dir()
    events = list((tmp_path / "tfevent" / "trials").glob("*/metrics/events.out.tfevents.*"))
    assert len(events) == 2


@pytest.mark.slow
def test_medianstop_follows_a_file_collectors_metrics_file(tmp_path: Path):
    # The first trial is good (loss 0.1, 0.11, ...), the second clearly bad (loss 5.0); both
    # write their metrics to Katib's default File path, never to stdout.
    script = tmp_path / "trial.py"
    script.write_text(
        "import sys, time\n"
        f"counter = open({str(tmp_path / 'count')!r}, 'a+')\n"
        "counter.seek(0)\nfirst = counter.read() == ''\ncounter.write('x')\ncounter.close()\n"
        "out = open(sys.argv[1], 'w')\n"
        "for i in range(8):\n"
        "    print(f'epoch={i + 1} loss={0.1 + i / 100 if first else 5.0}', file=out, flush=True)\n"
        "    time.sleep(0.4)\n"
    )
    d = example("median-stop")
    d["spec"]["metricsCollectorSpec"] = {"collector": {"kind": "File"}}
    tune(write(tmp_path, d), tmp_path / "s", "--trial-command",
         f"{PY} {script} /var/log/katib/metrics.log ${{trialParameters.learningRate}}",
         *budget(2))
    good, bad = read_json(tmp_path / "s" / "state.json")["trials"]
    assert good["status"] == "Succeeded" and len(good["logs"]["loss"]) == 8
    assert bad["status"] == "EarlyStopped" and 2 <= len(bad["logs"]["loss"]) < 8
    assert (tmp_path / "s" / "trials" / good["name"] / "metrics" / "metrics.log").is_file()


def test_cluster_mode_checks_only_katibs_rules(tmp_path: Path):
    # hyperband, a Custom collector and a ConfigMap template are Katib's to run: with --cluster
    # they pass validation and chexflow goes on to the cluster (here: no kubeconfig).
    d = example("random")
    d["spec"]["algorithm"] = {"algorithmName": "hyperband", "algorithmSettings": [
        {"name": "r_l", "value": "3"}, {"name": "resource_name", "value": "lr"}]}
    d["spec"]["metricsCollectorSpec"] = {"collector": {"kind": "Custom", "customCollector": {
        "name": "c", "image": "x"}}}
    tt = d["spec"]["trialTemplate"]
    del tt["trialSpec"]
    tt.update(configMap={"configMapName": "t", "configMapNamespace": "kubeflow",
                         "templatePath": "job.yaml"},
              successCondition='status.conditions.#(type=="Complete")#|#(status=="True")#',
              failureCondition='status.conditions.#(type=="Failed")#|#(status=="True")#')
    proc = run_chexflow("tune", write(tmp_path, d), "--cluster", "--state", tmp_path / "s",
                        env={"KUBECONFIG": str(tmp_path / "none")}, check=False)
    assert "no Kubernetes configuration" in one_error_line(proc)


def test_a_file_collector_reads_only_the_current_attempts_file(tmp_path: Path):
    d = example("random")
    d["spec"].update(metricsCollectorSpec={"collector": {"kind": "File"}}, maxTrialCount=1,
                     parallelTrialCount=1, maxFailedTrialCount=1)
    exp = parse_experiment(d, "random.yaml")
    cmd = "echo loss=1 >> /var/log/katib/metrics.log"
    state = open_state(tmp_path / "s", exp.name, exp.fingerprint(), exp.raw, cmd, 3)
    runner = LocalRunner(exp, state, cmd, progress=False, echo=lambda line: None)
    rec = runner.suggest(1)[0]
    stale = runner.trial_dir(rec) / "metrics" / "metrics.log"  # left by an interrupted attempt
    stale.parent.mkdir()
    stale.write_text("loss=99\n")
    assert runner.run()["reason"] == "ExperimentMaxTrialsReached"
    assert (rec.status, rec.logs) == ("Succeeded", {"loss": [1.0]})
    assert stale.read_text() == "loss=1\n"


@pytest.mark.slow
def test_trial_command_maps_only_whole_collector_paths(tmp_path: Path):
    """--trial-command with a File collector in /katib: `/katib/metrics.log` goes to the trial's
    metrics folder, `/katib-data/x.csv` (the same letters, another path) stays as written (a
    substring replace made it a path under the state folder)."""
    d = example("random")
    d["spec"]["metricsCollectorSpec"] = {"collector": {"kind": "File"}, "source": {
        "fileSystemPath": {"path": "/katib/metrics.log", "kind": "File"}}}
    cmd = "DATA=/katib-data/x.csv; echo data=$DATA; echo loss=1 > /katib/metrics.log"
    tune(write(tmp_path, d), tmp_path / "s", "--trial-command", cmd, *budget(1))
    trial = read_json(tmp_path / "s" / "results.json")["trials"][0]
    assert trial["status"] == "Succeeded" and trial["metric_logs"] == {"loss": [1.0]}
    folder = tmp_path / "s" / "trials" / trial["trial"]
    assert "data=/katib-data/x.csv\n" in (folder / "stdout.log").read_text()
    assert (folder / "metrics" / "metrics.log").read_text() == "loss=1\n"


@pytest.mark.slow
def test_a_trial_without_event_files_is_metrics_unavailable_as_on_katib(tmp_path: Path):
    d = example("random")
    d["spec"]["metricsCollectorSpec"] = {"collector": {"kind": "TensorFlowEvent"}}
    tune(write(tmp_path, d), tmp_path / "s", "--trial-command", "echo loss=1", *budget(1),
         check=False)
    trial = read_json(tmp_path / "s" / "results.json")["trials"][0]
    assert trial["status"] == "MetricsUnavailable" and trial["metric_logs"] == {}


# ---- trial kinds whose controller makes the pods ---------------------------------------------

KATIB_V019 = Path(__file__).parent / "data" / "katib-v0.19"


@pytest.mark.slow
@pytest.mark.parametrize("name,kind", [("argo-workflow", "Workflow"),
                                       ("trainjob-pytorch", "TrainJob")])
def test_workflow_and_trainjob_examples_pass_katibs_rules_and_locally_name_their_kind(
        name, kind, tmp_path: Path):
    """Katib's webhook asks only that primaryContainerName is set; the container is in the pods
    the Workflow or the training runtime makes. Locally: one line naming the kind and
    --cluster, before any state is written; with --trial-command the sweep runs."""
    spec = KATIB_V019 / f"{name}.yaml"
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", check=False)
    line = one_error_line(proc)
    assert f"kind {kind} " in line and "--cluster" in line and "primaryContainerName" not in line
    assert not (tmp_path / "s").exists()
    proc = run_chexflow("tune", spec, "--cluster", "--state", tmp_path / "c",
                        env={"KUBECONFIG": str(tmp_path / "none")}, check=False)
    assert "no Kubernetes configuration" in one_error_line(proc)
    tune(spec, tmp_path / "t", "--trial-command", "echo loss=0.5", *budget(1))
    assert read_json(tmp_path / "t" / "results.json")["trials"][0]["status"] == "Succeeded"


# ---- TensorFlowEvent: the program given the folder above the collector's ---------------------

MNIST_SUMMARIES = """\
import argparse, os, tensorflow as tf
p = argparse.ArgumentParser()
p.add_argument("--log-path")
p.add_argument("--learning-rate", type=float)
args, _ = p.parse_known_args()
for sub, value in (("train", 0.9), ("test", args.learning_rate * 10)):  # as Katib's mnist.py
    with tf.summary.create_file_writer(os.path.join(args.log_path, sub)).as_default():
        tf.summary.scalar("accuracy", value, step=0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["trialSpec", "trial-command"])
def test_tfevent_collector_under_the_folder_the_program_is_given(how, tmp_path: Path):
    """Katib's tfjob-mnist-with-summaries: `--log-path=/mnist-with-summaries-logs`, the
    collector reads `/mnist-with-summaries-logs/test`. Locally both land in the trial's folder
    and only `test`'s events count (the program's `train` events say 0.9)."""
    from chexflow.envs import trainer_python

    script = tmp_path / "mnist.py"
    script.write_text(MNIST_SUMMARIES)
    d = yaml.safe_load((KATIB_V019 / "tfjob-mnist-with-summaries.yaml").read_text())
    container = d["spec"]["trialTemplate"]["trialSpec"]["spec"]["tfReplicaSpecs"]["Worker"][
        "template"]["spec"]["containers"][0]
    command = container["command"][2:]  # the example's options, --log-path among them
    extra = []
    if how == "trialSpec":
        container["command"] = ["python", str(script), *command]
    else:
        extra = ["--trial-command", f"{trainer_python()} {script} {' '.join(command)}"]
    tune(write(tmp_path, d), tmp_path / "s", *extra, *budget(1))
    trial = read_json(tmp_path / "s" / "results.json")["trials"][0]
    assert trial["status"] == "Succeeded", trial
    assert trial["metric_logs"]["accuracy"] == pytest.approx([trial["learning_rate"] * 10])
    folder = tmp_path / "s" / "trials" / trial["trial"] / "metrics"
    assert list((folder / "test").glob("events.out.tfevents.*"))
    assert list((folder / "train").glob("events.out.tfevents.*"))
    assert not Path("/mnist-with-summaries-logs").exists()
