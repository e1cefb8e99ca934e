"""The specs' one trial template, ConfigMap chexflow-trial-templates (katib/trial-templates.yaml):
made by the jobs renderer and up to date, read from the repository by the local runner (beside
the spec or --trial-templates FILE) and checked with Katib's webhook rules; a ConfigMap it
cannot find is one line naming it and where it looked; --set on the trialSpec inlines it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from chexflow.jobs.render import mpirun_args
from chexflow.katib.experiment.chexnet_template import (
    CONFIG_MAP,
    KEY,
    NAMESPACE,
    TRAINJOB_KEY,
    templates_text,
)
from chexflow.katib.experiment.spec import load_experiment
from chexflow.katib.experiment.templates import TemplateError
from tests.conftest import REPO, run_chexflow

KATIB = REPO / "katib"
SPECS = sorted((KATIB / "specs").glob("*.yaml"))
TEMPLATES = KATIB / "trial-templates.yaml"
# a ConfigMap template of a batch Job whose trial prints its metric: runs anywhere
JOB_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
        command: [bash, -c, "echo lr=${trialParameters.lr} val_auroc=0.${trialParameters.n}"]
"""


def test_trial_templates_file_is_up_to_date_with_the_jobs_renderer():
    """katib/trial-templates.yaml is what the generator makes from render_mpijob now; after a
    change to the renderer or the training options:
    python -m chexflow.katib.experiment.chexnet_template."""
    assert TEMPLATES.read_text() == templates_text(), (
        "katib/trial-templates.yaml is out of date: "
        "python -m chexflow.katib.experiment.chexnet_template")


def test_every_spec_names_the_one_template_and_is_a_screen_long():
    (config_map,) = [d for d in yaml.safe_load_all(TEMPLATES.read_text()) if d]
    assert config_map["metadata"]["name"] == CONFIG_MAP
    assert config_map["metadata"]["namespace"] == NAMESPACE
    # Katib's UI lists trial templates by this label
    assert config_map["metadata"]["labels"]["katib.kubeflow.org/component"] == "trial-templates"
    assert len(SPECS) == 6
    for spec in SPECS:
        assert len(spec.read_text().splitlines()) <= 80, spec
        exp = load_experiment(spec)
        key, kind = ((TRAINJOB_KEY, "TrainJob") if spec.stem.endswith("-trainjob")
                     else (KEY, "MPIJob"))
        assert exp.trial_template["configMap"] == {
            "configMapName": CONFIG_MAP, "configMapNamespace": NAMESPACE, "templatePath": key}
        assert exp.config_map.file == TEMPLATES and exp.trial_spec["kind"] == kind


def test_the_trial_launcher_runs_mpirun_as_the_jobs_renderer_writes_it():
    """The launcher's command is render.mpirun_args of the worker command, the workers'
    container carries Katib's primaryContainerName, the data volume is `data`."""
    exp = load_experiment(KATIB / "specs" / "chexnet-random.yaml")
    replicas = exp.trial_spec["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    argv = launcher["command"] + launcher["args"]
    assert argv[:3] == ["mpirun", "-np", "2"]
    program = argv[argv.index("python"):]
    assert program[:3] == ["python", "-m", "chexflow.train.worker"]
    assert "${trialParameters.learningRate}" in program
    for role, replica in replicas.items():
        pod = replica["template"]["spec"]
        assert pod["containers"][0]["name"] == exp.trial_template["primaryContainerName"], role
        assert pod["volumes"][0] == {"name": "data", "persistentVolumeClaim": {
            "claimName": "chexflow-data", "readOnly": False}}
    from chexflow.jobs.spec import JobSpec
    rendered = mpirun_args(JobSpec(name="x", command=program, workers=2, horovod=True,
                                   gpus_per_worker=1))
    assert argv == rendered


def _sweep_folder(tmp_path: Path, template: str = JOB_TEMPLATE, where: str = "beside") -> Path:
    """A spec whose trialTemplate.configMap names tpl/job.yaml, with that ConfigMap beside it
    (or in the folder above it)."""
    folder = tmp_path / "sweep"
    (folder / "specs").mkdir(parents=True)
    spec = {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
        "metadata": {"name": "cm-sweep", "namespace": "kubeflow"},
        "spec": {
            "objective": {"type": "maximize", "objectiveMetricName": "val_auroc"},
            "algorithm": {"algorithmName": "random",
                          "algorithmSettings": [{"name": "random_state", "value": "3"}]},
            "parallelTrialCount": 1, "maxTrialCount": 2, "maxFailedTrialCount": 1,
            "parameters": [
                {"name": "lr", "parameterType": "double",
                 "feasibleSpace": {"min": "0.01", "max": "0.1"}},
                {"name": "n", "parameterType": "int", "feasibleSpace": {"min": "5", "max": "9"}}],
            "trialTemplate": {
                "primaryContainerName": "main",
                "successCondition": 'status.conditions.#(type=="Complete")#|#(status=="True")#',
                "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
                "trialParameters": [{"name": "lr", "reference": "lr"},
                                    {"name": "n", "reference": "n"}],
                "configMap": {"configMapName": "tpl", "configMapNamespace": "kubeflow",
                              "templatePath": "job.yaml"}}}}
    (folder / "specs" / "cm.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "tpl", "namespace": "kubeflow"},
                  "data": {"job.yaml": template}}
    target = folder if where == "above" else folder / "specs"
    (target / "trial-templates.yaml").write_text(yaml.safe_dump(config_map))
    return folder / "specs" / "cm.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["beside", "above"])
def test_local_sweep_runs_the_configmap_template_read_from_the_repository(tmp_path, where):
    """A real local sweep: each trial runs the ConfigMap's Job container, its values put in."""
    spec = _sweep_folder(tmp_path, where=where)
    state = tmp_path / "state"
    proc = run_chexflow("tune", spec, "--state", state, "--no-progress", timeout=300)
    res = json.loads((state / "results.json").read_text())
    assert [t["status"] for t in res["trials"]] == ["Succeeded", "Succeeded"], proc.stdout
    for t in res["trials"]:
        assert t["val_auroc"] == pytest.approx(float(f"0.{t['n']}"))
        log = (state / "trials" / t["trial"] / "stdout.log").read_text()
        assert f"lr={t['lr']!r}" in log


def test_trial_templates_option_names_the_configmap_file(tmp_path):
    spec = _sweep_folder(tmp_path)
    moved = tmp_path / "elsewhere.yaml"
    shutil.move(spec.parent / "trial-templates.yaml", moved)
    exp = load_experiment(spec, trial_templates=moved)
    assert exp.config_map.file == moved and exp.trial_spec["kind"] == "Job"
    proc = run_chexflow("tune", spec, "--trial-templates", moved, "--dry-run",
                        "--state", tmp_path / "s")
    assert "echo lr=0.0" in proc.stdout  # the next trials' commands, from the ConfigMap


def test_a_configmap_not_in_the_repository_is_one_line_naming_it_and_where_it_looked(tmp_path):
    spec = tmp_path / "alone" / "chexnet-random.yaml"
    spec.parent.mkdir()
    shutil.copyfile(KATIB / "specs" / "chexnet-random.yaml", spec)
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"chexflow tune: error: {spec}: spec.trialTemplate.configMap: ConfigMap "
        "kubeflow/chexflow-trial-templates (chexnet-mpijob.yaml) is in none of "
        f"{spec.parent / 'trial-templates.yaml'}, {tmp_path / 'trial-templates.yaml'}: give its "
        "file with --trial-templates FILE, or run with --trial-command or --cluster"]
    proc = run_chexflow("tune", spec, "--trial-templates", tmp_path / "none.yaml", check=False)
    assert proc.stderr.splitlines() == [
        f"chexflow tune: error: --trial-templates {tmp_path / 'none.yaml'}: no such file"]
    # a spec that changes the template needs it: --set on the trialSpec
    proc = run_chexflow("tune", spec, "--set", "spec.trialTemplate.trialSpec.spec.slotsPerWorker=2",
                        check=False)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert ("--set spec.trialTemplate.trialSpec.spec.slotsPerWorker: changes the trial "
            "template, but ConfigMap kubeflow/chexflow-trial-templates") in proc.stderr


def test_a_configmap_without_the_template_path_is_refused_as_katib_refuses_it(tmp_path):
    spec = _sweep_folder(tmp_path)
    raw = yaml.safe_load(spec.read_text())
    raw["spec"]["trialTemplate"]["configMap"]["templatePath"] = "other.yaml"
    spec.write_text(yaml.safe_dump(raw))
    with pytest.raises(TemplateError, match=r"trial-templates.yaml: ConfigMap kubeflow/tpl "
                       r"\(other.yaml\): no key 'other.yaml' in its data \(has job.yaml\); Katib "
                       r"would refuse the Experiment: unable to find trial template in ConfigMap"):
        load_experiment(spec)


def test_the_configmap_template_is_checked_with_katibs_webhook_rules(tmp_path):
    """Katib's webhook reads the ConfigMap and refuses a placeholder no trialParameter
    declares; chexflow reads the repository's and refuses it the same way, in one line."""
    spec = _sweep_folder(tmp_path, JOB_TEMPLATE.replace("${trialParameters.n}",
                                                        "${trialParameters.m}"))
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", check=False)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert ("spec.trialTemplate.trialParameters[1].name: parameter name: n in "
            "spec.trialParameters not found in spec.trialTemplate") in proc.stderr


def test_set_on_the_trial_spec_inlines_the_configmap_template():
    exp = load_experiment(KATIB / "specs" / "chexnet-grid.yaml",
                          ["spec.trialTemplate.trialSpec.spec.slotsPerWorker=2"])
    template = exp.raw["spec"]["trialTemplate"]
    assert "configMap" not in template and exp.config_map is None
    assert template["trialSpec"]["spec"]["slotsPerWorker"] == 2
    assert template["trialSpec"]["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
