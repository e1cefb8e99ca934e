"""katib/trial-templates.yaml and the trialSpecs of katib/specs: the CheXNet trial templates,
made by the jobs renderer (`render_mpijob` and `render_trainjob`, what `chexflow mpijob render`
and the jobs backend send), so a trial runs as the pipelines' training does.
`python -m chexflow.katib.experiment.chexnet_template` writes them; tests/test_katib_templates.py
checks that they are up to date.

Each spec carries its template inline (`trialTemplate.trialSpec`) below a marker line naming the
ConfigMap key it copies: Katib v0.19 requires `trialTemplate.configMap.configMapNamespace` and
defaults it to nothing (pkg/webhook/v1beta1/experiment/validator/validator.go; no default in
pkg/apis/controller/experiments/v1beta1/experiment_defaults.go), so a spec naming a ConfigMap is
bound to one namespace, while an inline trialSpec works wherever `kubectl apply -n NS -f` puts
it. The ConfigMap (no namespace either: `kubectl apply -n NS -f katib/trial-templates.yaml`)
offers the same templates to Katib's UI and to specs of one's own.

What Katib needs on top of the rendered job: no metadata (Katib names the trial), the workers'
container named as primaryContainerName (Katib's pod webhook adds KATIB_TRIAL_NAME to that
container in every trial pod and refuses a pod without it), the data volume named `data`
(`--volume data=...`), no activeDeadlineSeconds (the Experiment bounds a sweep), and
`${trialParameters.X}` where a trial's values go. The TrainJob template (Kubeflow Trainer v2 on
chexflow's Horovod runtime) is adapted the same way; its containers are all named `node`
(Trainer's, in the launcher pod too). Each comes in two shapes: GPU (the CheXNet recipe: 1 GPU,
4 CPU and 16Gi per worker, ImageNet weights, 224 px) and CPU (no GPU: 2 CPU and 6Gi per worker,
from scratch at 128 px), as a GPU template's workers stay Pending on a cluster without GPUs
while the Trial says Running.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chexflow.container_images import DEFAULT_REGISTRY, DEFAULT_TAG
from chexflow.jobs.render import render_mpijob
from chexflow.jobs.spec import JobSpec, Volume
from chexflow.jobs.trainjob import render_trainjob
from chexflow.katib.experiment.templates import TEMPLATES_FILE
from chexflow.katib.experiment.trialspec import override_args
from chexflow.train.options import TrainOptions

CONFIG_MAP, KEY = "chexflow-trial-templates", "chexnet-mpijob.yaml"
CPU_KEY, TRAINJOB_KEY, TRAINJOB_CPU_KEY = ("chexnet-mpijob-cpu.yaml", "chexnet-trainjob.yaml",
                                           "chexnet-trainjob-cpu.yaml")
# Katib's UI lists the trial templates of ConfigMaps with this label (as Katib's own)
LABELS = {"katib.kubeflow.org/component": "trial-templates", "app.kubernetes.io/part-of":
          "chexflow"}
PRIMARY_CONTAINER = "launcher"
DATA_VOLUME, DATA_CLAIM, MOUNT = "data", "chexflow-data", "/mnt/chexflow"
TRIAL_NAME = "${trialParameters.trialName}"
# worker option -> the trialParameter that sets it (the specs' trialParameters)
PARAMETERS = {"batch-size": "batchSize", "lr": "learningRate", "optimizer": "optimizer",
              "weight-decay": "weightDecay"}
WORKERS = 2
_JOB = "chexnet-trial"  # the rendered job's name, replaced by the trial's
SPECS_DIR = "specs"
# the line of a spec after which its trialSpec is written: it names the ConfigMap key it copies
MARKER_RE = re.compile(
    r"^    # trialSpec: (?P<key>[\w.-]+\.yaml) of katib/trial-templates\.yaml\b.*$", re.M)


@dataclass(frozen=True)
class Shape:
    """What a trial asks of the cluster and how it trains there."""

    gpus_per_worker: int
    cpu: str  # per worker; "": the renderer's share per GPU
    memory: str
    shm: str
    image_size: int
    weights: str


GPU = Shape(1, "", "", "8Gi", 224, "imagenet")
# DenseNet-121 at 128 px and batch 32 (the specs' largest) trains in 6Gi; no GPU, no download
CPU = Shape(0, "2", "6Gi", "1Gi", 128, "none")
HEADER = """\
# The CheXNet trial templates, as a ConfigMap as Katib keeps its own trial-templates (its UI
# lists them by the label below). chexnet-mpijob.yaml: an MPIJob (kubeflow.org/v2beta1) of 2
# workers with 1 GPU each, whose launcher runs `mpirun -np 2 python -m chexflow.train.worker
# ...`; chexnet-mpijob-cpu.yaml: the same on CPU workers (2 CPU, 6Gi, 128 px, no ImageNet
# weights); chexnet-trainjob[-cpu].yaml: the same training as a Kubeflow Trainer v2 TrainJob
# on ClusterTrainingRuntime chexflow-horovod (trainjob/horovod-runtime.yaml, applied
# beforehand). Katib puts each trial's values in the ${trialParameters.X}. The PVC
# `chexflow-data` at /mnt/chexflow holds `chexflow preprocess` output in tfrecords/ and each
# trial's run folder, runs/katib/TRIAL.
# The specs in katib/specs carry these templates inline (trialTemplate.trialSpec), so they work
# in any namespace; a spec of your own can name this ConfigMap instead, in the namespace you put
# it in: kubectl apply -n NS -f katib/trial-templates.yaml, then trialTemplate.configMap
# {configMapName: chexflow-trial-templates, configMapNamespace: NS, templatePath: KEY}.
# Made from the jobs renderer (chexflow/jobs/render.py), so trials and the pipelines' training
# do not drift: generated by `python -m chexflow.katib.experiment.chexnet_template`; a test
# checks it is up to date.
"""


class _Dumper(yaml.SafeDumper):
    """Strings with a `${...}` placeholder in double quotes: Katib substitutes the YAML text,
    and `- "16"` stays a string where `- 16` would not."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    style = '"' if "${" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _replace(node: Any, old: str, new: str) -> Any:
    if isinstance(node, dict):
        return {k: _replace(v, old, new) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace(v, old, new) for v in node]
    return new if node == old else node


def _split_command(container: dict) -> dict:
    """`command: [mpirun]` and the rest as `args`, as Kubeflow's MPIJob examples write it."""
    out = {}
    for key, value in container.items():
        out[key] = value[:1] if key == "command" else value
        if key == "command" and value[1:]:
            out["args"] = value[1:]
    return out


def _trial_job(shape: Shape) -> JobSpec:
    """The training of one trial, with `${trialParameters.X}` for its values."""
    options = TrainOptions(data=Path(MOUNT, "tfrecords"), weights=shape.weights,
                           image_size=shape.image_size,
                           out=Path(MOUNT, "runs", "katib", TRIAL_NAME))
    command = override_args(options.worker_command(),
                            [f"{flag}=${{trialParameters.{name}}}"
                             for flag, name in PARAMETERS.items()])
    return JobSpec(name=_JOB, command=command, workers=WORKERS, horovod=True,
                   gpus_per_worker=shape.gpus_per_worker, cpu=shape.cpu, memory=shape.memory,
                   shm_size=shape.shm, volumes=[Volume(DATA_CLAIM, MOUNT)])


def _image() -> str:
    return f"{DEFAULT_REGISTRY}/trainer:{DEFAULT_TAG}"


def chexnet_trainjob_spec(shape: Shape = GPU) -> dict:
    """The TrainJob trial: `render_trainjob` of the same training, adapted for Katib as the
    MPIJob is (no metadata or deadline, the data volume named `data`)."""
    trainjob = render_trainjob(_trial_job(shape), image=_image())
    trainjob.pop("metadata")
    trainjob["spec"].pop("activeDeadlineSeconds")
    for patch in trainjob["spec"].get("runtimePatches", []):
        for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            pod = rjob["template"]["spec"]["template"]["spec"]
            mounts = [m for c in pod.get("containers", []) for m in c.get("volumeMounts", [])]
            for item in [*pod.get("volumes", []), *mounts]:
                if item["name"] == "data-0":
                    item["name"] = DATA_VOLUME
    return _replace(trainjob, _JOB, TRIAL_NAME)


def chexnet_trial_spec(shape: Shape = GPU) -> dict:
    """The MPIJob trial: `render_mpijob` of the training command, adapted for Katib."""
    mpijob = render_mpijob(_trial_job(shape), image=_image())
    mpijob.pop("metadata")
    mpijob["spec"]["runPolicy"].pop("activeDeadlineSeconds")
    for replica in mpijob["spec"]["mpiReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        container = pod["containers"][0] = _split_command(pod["containers"][0])
        container["name"] = PRIMARY_CONTAINER
        for item in [*pod["volumes"], *container["volumeMounts"]]:
            if item["name"] == "data-0":
                item["name"] = DATA_VOLUME
        pod["volumes"].sort(key=lambda v: v["name"] != DATA_VOLUME)  # the data volume first
    return _replace(mpijob, _JOB, TRIAL_NAME)


def templates() -> dict[str, dict]:
    """The ConfigMap's keys and their templates."""
    return {KEY: chexnet_trial_spec(GPU), CPU_KEY: chexnet_trial_spec(CPU),
            TRAINJOB_KEY: chexnet_trainjob_spec(GPU), TRAINJOB_CPU_KEY: chexnet_trainjob_spec(CPU)}


def _dump(node: Any) -> str:
    return yaml.dump(node, Dumper=_Dumper, sort_keys=False, width=100)


def templates_text() -> str:
    """katib/trial-templates.yaml as it should read."""
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": CONFIG_MAP, "labels": LABELS},
                  "data": {key: _dump(made) for key, made in templates().items()}}
    return HEADER + _dump(config_map)


class MarkerError(ValueError):
    """A spec without the marker line before its generated trialSpec."""


def spec_text(text: str, made: dict[str, dict] | None = None) -> str:
    """A spec's text with its trialSpec written anew below its marker line, from the template
    of the ConfigMap key that line names."""
    marker = MARKER_RE.search(text)
    if marker is None or marker.group("key") not in (made := made or templates()):
        raise MarkerError("no line `    # trialSpec: KEY of katib/trial-templates.yaml ...` "
                          "naming one of " + ", ".join(made))
    lines = text[marker.start():].splitlines(keepends=True)
    comment = next((i for i, line in enumerate(lines) if not line.startswith("    #")),
                   len(lines))
    head = text[:marker.start()] + "".join(lines[:comment])  # the marker and the comment below
    body = _dump(made[marker.group("key")])
    return head + "    trialSpec:\n" + "".join(f"      {line}\n" if line else "\n"
                                              for line in body.splitlines())


def katib_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "katib"


def main(argv: list[str] | None = None) -> int:
    """Write katib/trial-templates.yaml and the trialSpecs of the specs in katib/specs (or of
    the folder given, which holds trial-templates.yaml and specs/)."""
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else katib_dir()
    (folder / TEMPLATES_FILE).write_text(templates_text())
    print(f"wrote {folder / TEMPLATES_FILE}")
    made = templates()
    for spec in sorted((folder / SPECS_DIR).glob("*.yaml")):
        text = spec.read_text()
        if MARKER_RE.search(text):
            spec.write_text(spec_text(text, made))
            print(f"wrote {spec}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
