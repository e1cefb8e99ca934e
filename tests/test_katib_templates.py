"""The CheXNet trial templates (katib/trial-templates.yaml and the specs' inline trialSpecs):
made by the jobs renderer and up to date, in no fixed namespace, in a GPU and a CPU shape; a
spec's ConfigMap template is read from the repository by the local runner (beside the spec or
--trial-templates FILE) and checked with Katib's webhook rules; a ConfigMap it cannot find is one
line naming it and where it looked; --set on the trialSpec inlines it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from chexflow.jobs.render import mpirun_args
from chexflow.katib.experiment.chexnet_template import (
    CONFIG_MAP,
    CPU_KEY,
    KEY,
    MARKER_RE,
    TRAINJOB_CPU_KEY,
    TRAINJOB_KEY,
    spec_text,
    templates,
    templates_text,
)
from chexflow.katib.experiment.spec import load_experiment
from chexflow.katib.experiment.templates import TemplateError
from tests.conftest import REPO, run_chexflow
from tests.katib_configmap_specs import configmap_spec

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


def test_trial_templates_and_the_specs_trial_specs_are_up_to_date_with_the_jobs_renderer():
    """katib/trial-templates.yaml and each spec's trialSpec are what the generator makes from
    render_mpijob/render_trainjob now; after a change to the renderer or the training options:
    python -m chexflow.katib.experiment.chexnet_template."""
    stale = [p.name for p in [TEMPLATES, *SPECS]
             if p.read_text() != (templates_text() if p == TEMPLATES
                                  else spec_text(p.read_text()))]
    assert not stale, (f"out of date: {', '.join(stale)}: "
                       "python -m chexflow.katib.experiment.chexnet_template")


def test_no_file_fixes_a_namespace_and_every_spec_carries_its_template_inline():
    """`kubectl apply -n NS -f` puts each anywhere: no metadata.namespace, and each spec's
    trialSpec is the ConfigMap key its marker line names (Katib v0.19 requires a ConfigMap
    reference's configMapNamespace, so a spec naming one would be bound to that namespace)."""
    (config_map,) = [d for d in yaml.safe_load_all(TEMPLATES.read_text()) if d]
    assert config_map["metadata"] == {"name": CONFIG_MAP, "labels": {
        # Katib's UI lists trial templates by this label
        "katib.kubeflow.org/component": "trial-templates", "app.kubernetes.io/part-of": "chexflow"}}
    assert sorted(config_map["data"]) == sorted([KEY, CPU_KEY, TRAINJOB_KEY, TRAINJOB_CPU_KEY])
    made = templates()
    assert len(SPECS) == 7
    for spec in SPECS:
        raw = yaml.safe_load(spec.read_text())
        assert "namespace" not in raw["metadata"], spec.name
        assert "namespace: kubeflow" not in spec.read_text(), spec.name
        key = MARKER_RE.search(spec.read_text()).group("key")
        assert key == {"chexnet-random-trainjob": TRAINJOB_KEY,
                       "chexnet-random-cpu": CPU_KEY}.get(spec.stem, KEY), spec.name
        exp = load_experiment(spec)
        assert "configMap" not in exp.trial_template and exp.trial_spec == made[key], spec.name
        assert yaml.safe_load(config_map["data"][key]) == made[key]


def test_the_cpu_templates_ask_for_no_gpu_and_train_from_scratch():
    """On a cluster without GPUs the GPU template's workers stay Pending while the Trial says
    Running; the CPU shape asks for none and needs no ImageNet download."""
    for key in (CPU_KEY, TRAINJOB_CPU_KEY):
        text = yaml.safe_dump(templates()[key])
        assert "nvidia.com/gpu" not in text, key
    for key, size, weights in ((KEY, "224", "imagenet"), (CPU_KEY, "128", "none")):
        launcher = templates()[key]["spec"]["mpiReplicaSpecs"]["Launcher"]
        args = launcher["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--image-size") + 1] == size, key
        assert args[args.index("--weights") + 1] == weights, key
    worker = templates()[CPU_KEY]["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["requests"] == {"cpu": "2", "memory": "6Gi"}
    assert "tolerations" not in worker
    trainer = templates()[TRAINJOB_CPU_KEY]["spec"]["trainer"]
    assert trainer["resourcesPerNode"]["limits"] == {"cpu": "2", "memory": "6Gi"}


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


def test_a_spec_naming_the_configmap_reads_it_from_the_repository(tmp_path):
    """A spec of one's own that names chexflow-trial-templates: its template is the
    repository's ConfigMap's, in whatever namespace it names."""
    spec = configmap_spec("chexnet-random", tmp_path, namespace="team-a")
    exp = load_experiment(spec)
    assert exp.config_map.file == tmp_path / "trial-templates.yaml"
    assert exp.config_map.where == f"ConfigMap team-a/{CONFIG_MAP} ({KEY})"
    assert exp.trial_spec == templates()[KEY]


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
    alone = tmp_path / "alone"
    spec = configmap_spec("chexnet-random", alone, with_templates=False)
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"chexflow tune: error: {spec}: spec.trialTemplate.configMap: ConfigMap "
        "kubeflow/chexflow-trial-templates (chexnet-mpijob.yaml) is in none of "
        f"{spec.parent / 'trial-templates.yaml'}, {alone / 'trial-templates.yaml'}: give its "
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


def test_set_on_the_trial_spec_inlines_the_configmap_template(tmp_path):
    exp = load_experiment(configmap_spec("chexnet-grid", tmp_path),
                          ["spec.trialTemplate.trialSpec.spec.slotsPerWorker=2"])
    template = exp.raw["spec"]["trialTemplate"]
    assert "configMap" not in template and exp.config_map is None
    assert template["trialSpec"]["spec"]["slotsPerWorker"] == 2
    assert template["trialSpec"]["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2


def _unquote(folder: Path, placeholder: str) -> Path:
    """A spec naming the ConfigMap, whose copy of katib/trial-templates.yaml lost the quotes
    around `placeholder` (as a YAML tool that rewrites the file may leave it)."""
    spec = configmap_spec("chexnet-random", folder)
    templates_file = folder / "trial-templates.yaml"
    text = templates_file.read_text()
    assert f'- "{placeholder}"' in text
    templates_file.write_text(text.replace(f'- "{placeholder}"', f"- {placeholder}"))
    return spec


@pytest.mark.parametrize("cluster", [[], ["--cluster", "--dry-run"]], ids=["local", "cluster"])
def test_a_placeholder_that_lost_its_quotes_is_refused_naming_the_arg_and_field(tmp_path,
                                                                                cluster):
    """Katib substitutes a trial's values into the ConfigMap's YAML text and reads it again:
    `- ${trialParameters.learningRate}` becomes a number where the MPIJob needs a string, the
    API server refuses the trial's job and the Trial sits in Created. Refused before anything
    runs, locally and before --cluster contacts a cluster (KUBECONFIG points nowhere)."""
    spec = _unquote(tmp_path, "${trialParameters.learningRate}")
    proc = run_chexflow("tune", spec, "--state", tmp_path / "s", *cluster, check=False,
                        env={"KUBECONFIG": str(tmp_path / "none")})
    assert proc.returncode == 2
    args = templates()[KEY]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
        "containers"][0]["args"]
    at = args.index("${trialParameters.learningRate}")
    assert proc.stderr.splitlines() == [
        f"chexflow tune: error: {spec}: spec.trialTemplate.configMap: ConfigMap kubeflow/"
        f"chexflow-trial-templates ({KEY}): spec.mpiReplicaSpecs.Launcher.template.spec."
        f"containers[0].args[{at}]: ${{trialParameters.learningRate}} is not quoted: Katib puts "
        "a trial's value in the template's text and reads it as YAML, so 1e-05 makes an arg a "
        "YAML float, not a string; the API server then refuses the trial's MPIJob and the "
        "Trial stays Created (only katib-controller's log says why): write "
        '"${trialParameters.learningRate}" in double quotes']
    assert not (tmp_path / "s").exists()


def test_an_unquoted_placeholder_whose_values_stay_strings_is_accepted(tmp_path):
    """The optimizer's values (adam, sgd) and the trial's name stay strings unquoted, as does a
    placeholder inside a longer word: Katib's trial gets strings, so the spec passes."""
    spec = _unquote(tmp_path, "${trialParameters.optimizer}")
    text = (tmp_path / "trial-templates.yaml").read_text()
    (tmp_path / "trial-templates.yaml").write_text(text.replace(
        '- "/mnt/chexflow/runs/katib/${trialParameters.trialName}"',
        "- /mnt/chexflow/runs/katib/${trialParameters.trialName}"))
    assert load_experiment(spec).config_map is not None


@pytest.mark.parametrize("text, kind", [
    ("0.01", "float"), ("1e-05", "float"), (".5", "float"), ("16", "int"), ("-3", "int"),
    ("0x1F", "int"), ("true", "bool"), ("yes", "bool"), ("Off", "bool"), ("~", "null"),
    ("", "null"), (".inf", "float"), ("adam", "str"), ("--lr=0.01", "str"),
    ("chexnet-random-abc", "str"), ("1.2.3", "str")])
def test_plain_scalars_resolve_as_go_yaml_v2_resolves_them(text, kind):
    """go.yaml.in/yaml/v2 resolve.go, which Katib's controller reads the template with."""
    from chexflow.katib.experiment.templates import go_yaml_type

    assert go_yaml_type(text) == kind
