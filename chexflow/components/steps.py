"""What each pipeline step does, as plain functions: describe a job, run it through the chosen
backend, read what it wrote. The KFP components (chexflow.components.definitions) are thin wrappers.

Jobs exchange data through a shared folder (`workdir`): a local path, or on a cluster the data
PVC mounted at the same path in the component pods and in the MPIJob/Job pods.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chexflow.errors import ChexflowError
from chexflow.folders import os_cause
from chexflow.jobs import BACKENDS, JobResult, JobSpec, Volume, dns_name, run_job
from chexflow.jobs.spec import ClusterOptions
from chexflow.train.options import TrainOptions

if TYPE_CHECKING:
    from chexflow.katib.experiment.model import Experiment

# Options the pipeline itself owns: a tuned parameter may not move the data or the output.
NOT_TUNABLE = ("data", "out")
# The tune step on a cluster: its job's service account (katib/rbac.yaml) and the trialSpec
# volume that becomes the run's PVC (katib/trial-templates.yaml mounts it as `data`).
TUNE_SERVICE_ACCOUNT, TUNE_VOLUME = "chexflow-tune", "data"
# On a cluster the tune Job's pod reads the spec from the run's shared folder, not the step's.
TUNE_SPEC_COPY = "katib-experiment.yaml"
# ... and the ConfigMap of its trial template (trialTemplate.configMap), when it has one
TUNE_TEMPLATES_COPY = "katib-trial-templates.yaml"
# A trial's output folder under WORKDIR/tune/trials on a cluster (the run's folder, which the
# images' user may write; Katib substitutes the trial's name).
TRIAL_OUT = "/${trialParameters.trialName}"
# How long the deploy step waits for its InferenceService at most (the run's timeout if less).
DEPLOY_TIMEOUT_SECONDS = 900
# The tune Job's pod only talks to the API server: half a core, not a training step's share.
TUNE_CPU, TUNE_MEMORY = "500m", "1Gi"
# Where the shared data PVC is mounted, in the component pods and in the MPIJob/Job pods.
MOUNT_PATH = "/mnt/chexflow"
# The preprocess job's decoding processes (`chexflow preprocess --workers`).
PREPROCESS_WORKERS = 2
# What stands for a path an earlier step makes, where a step's inputs are checked before the run
# (`check_step`): only that there is one matters to the checks.
PENDING = "(made by an earlier step)"
TYPE_NOUNS = {str: "string", int: "integer", float: "number", bool: "boolean"}


class StepError(ChexflowError):
    """A pipeline step got inputs it cannot use."""


@dataclass
class Target:
    """Where a run's jobs write (`workdir`, one per run: WORK_ROOT/RUN_ID) and run: the backend
    and, for kubernetes, namespace/PVC/images and what the cluster asks of the pods (`cluster`:
    node selector, tolerations, priority class, ..., as the renderer takes them). The jobs' pods
    mount the PVC at `mount_path` ("" in a dict: MOUNT_PATH), where the steps see it too (the
    component pods' mount, or for `chexflow run` the host folder behind the PVC), so a path
    means the same file to both. A pipeline makes it once (the `target` component) and hands it
    to every step as a dict."""

    workdir: str = "."
    run_id: str = ""
    backend: str = "local"
    namespace: str = "default"
    data_pvc: str = ""
    trainer_image: str = ""
    launcher_image: str = ""
    timeout_seconds: int = 3600
    mount_path: str = MOUNT_PATH
    service_account: str = ""
    gpus_per_worker: int = 0
    slots_per_worker: int = 0
    cpu: str = "2"
    memory: str = "8Gi"
    cluster: ClusterOptions = field(default_factory=ClusterOptions)

    def __post_init__(self) -> None:
        self.mount_path = self.mount_path or MOUNT_PATH
        if self.backend not in BACKENDS:
            raise StepError(f"backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.backend == "kubernetes" and not self.data_pvc:
            raise StepError("backend kubernetes: data_pvc is empty; the steps' jobs exchange "
                            "data through that PersistentVolumeClaim")
        if self.backend == "kubernetes" and not Path(self.workdir).is_relative_to(
                self.mount_path):
            raise StepError(f"workdir {self.workdir}: not under {self.mount_path}, where the "
                            f"jobs' pods mount PVC {self.data_pvc}; they would not see the "
                            "run's files")
        if self.timeout_seconds <= 0:
            raise StepError(f"timeout_seconds {self.timeout_seconds}: must be > 0")

    def cluster_options(self) -> ClusterOptions:
        """What the cluster asks of the jobs' pods, for the renderer."""
        return self.cluster

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], **overrides: Any) -> Target:
        """The target a step received (KFP hands numbers over as floats), with `overrides`."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise StepError(f"target: unknown fields {unknown}; expected {sorted(types)}")
        out = {k: int(float(v)) if types[k] == "int" else v for k, v in values.items()}
        if isinstance(out.get("cluster"), dict):
            out["cluster"] = ClusterOptions.from_dict(out["cluster"])
        return cls(**{**out, **overrides})

    def path(self, *parts: str) -> str:
        """A path in the run's shared folder."""
        return str(Path(self.workdir, *parts))

    def job_name(self, step: str) -> str:
        """A name unique per run (Kubernetes objects of different runs must not collide)."""
        run_id = self.run_id
        suffix = dns_name(run_id.replace("_", "-"))[-8:].strip("-") if run_id else ""
        return dns_name(f"{step}-{suffix}" if suffix else step)

    def volumes(self) -> list[Volume]:
        return [Volume(self.data_pvc, self.mount_path)] if self.data_pvc else []

    def run(self, spec: JobSpec, log_dir: str | None = None) -> JobResult:
        if self.backend == "local":
            return run_job(spec, "local", log_dir=Path(log_dir) if log_dir else None)
        image = self.trainer_image if spec.environment == "trainer" else self.launcher_image
        result = run_job(
            spec,
            "kubernetes",
            namespace=self.namespace,
            image=image or None,
            service_account=self.service_account or None,
            options=self.cluster_options(),
        )
        # the pod is deleted now: its output goes in the step's log, as a local job's does
        print(f"{result.resource} succeeded in {result.wall_seconds:.0f}s; its log ends:\n"
              f"{result.log_tail.rstrip()}", flush=True)
        return result


def typed_cluster_options(values: dict[str, Any]) -> ClusterOptions:
    """ClusterOptions from a pipeline's values, each of the type the class states (a node
    selector of strings, tolerations as mappings, ...) before the class checks their content."""
    hints = typing.get_type_hints(ClusterOptions)
    for name, value in values.items():
        if name in hints and not conforms(value, hints[name]):
            raise StepError(f"{name} {json.dumps(value)}: expected {type_words(hints[name])}")
    return ClusterOptions.from_dict(values)


def conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value is of a type hint made of str, int, float, bool, Any, list[...] and
    dict[..., ...] (an int is no bool)."""
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if hint is Any:
        return True
    if origin is dict:
        return isinstance(value, dict) and all(
            conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if origin in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if origin is float else origin)


def type_words(hint: Any) -> str:
    """A type hint in words: `a mapping of strings to strings`."""
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin is dict:
        return f"a mapping of {_plural(args[0])} to {_plural(args[1])}"
    if origin is list:
        return f"a list of {_plural(args[0])}"
    noun = TYPE_NOUNS.get(origin, "value")
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _plural(hint: Any) -> str:
    origin = typing.get_origin(hint) or hint
    return {dict: "mappings", list: "lists"}.get(origin, f"{TYPE_NOUNS.get(origin, 'value')}s")


def target_from_inputs(inputs: dict[str, Any]) -> Target:
    """target_op's inputs as the run's Target, checked: where the jobs write (WORK_ROOT/RUN_ID)
    and run."""
    run_id = inputs.get("run_id", "")  # KFP's, known once the run starts
    return Target(
        workdir=f"{inputs['work_root']}/{run_id}".rstrip("/"), run_id=run_id,
        backend=inputs["backend"], namespace=inputs["namespace"], data_pvc=inputs["data_pvc"],
        trainer_image=inputs["trainer_image"], launcher_image=inputs["launcher_image"],
        timeout_seconds=inputs["timeout_seconds"], mount_path=inputs.get("mount_path", ""),
        cluster=typed_cluster_options({name: inputs[name]
                                       for name in ClusterOptions.pipeline_parameters()}),
    )


def check_preprocess(raw_dir: str | None, image_size: int) -> None:
    """The preprocess step's inputs: an image size `chexflow preprocess` takes and, when RAW_DIR
    is known, a folder in NIH format or one already preprocessed at that size."""
    from chexflow.data.preprocess import PreprocessConfig, check_options

    raw = Path(raw_dir or PENDING)
    check_options(PreprocessConfig("nih", raw / "Data_Entry_2017.csv", raw / "images",
                                   Path(PENDING), image_size=image_size,
                                   workers=PREPROCESS_WORKERS))
    if raw_dir is None:
        return
    if (raw / "manifest.json").exists():
        from chexflow.data.manifest import load_manifest

        load_manifest(raw, image_size)  # as training reads it
    elif not (raw / "Data_Entry_2017.csv").exists():
        raise StepError(
            f"raw_dir {raw}: no Data_Entry_2017.csv (NIH format) and no manifest.json "
            f"(chexflow preprocess output)"
        )


def preprocess_step(raw_dir: str, image_size: int, target: Target) -> str:
    """NIH folder -> TFRecords in WORKDIR/data (a folder with manifest.json is used as it is)."""
    check_preprocess(raw_dir, image_size)
    raw = Path(raw_dir)
    if (raw / "manifest.json").exists():
        print(f"preprocess: {raw} is already preprocessed; using it")
        return str(raw)
    csv = raw / "Data_Entry_2017.csv"
    out = Path(target.path("data"))
    if (out / "manifest.json").exists():  # a retried step: the job finished before
        print(f"preprocess: {out}/manifest.json exists; reusing it")
        return str(out)
    spec = JobSpec(
        name=target.job_name("preprocess"),
        command=["chexflow", "preprocess", "--csv", str(csv), "--images", str(raw / "images"),
                 "--out", str(out), "--image-size", str(image_size),
                 "--workers", str(PREPROCESS_WORKERS)],
        cpu=target.cpu, memory=target.memory, volumes=target.volumes(),
        timeout_seconds=target.timeout_seconds,
    )
    target.run(spec)
    return str(out)


# train_op's inputs that are not TrainOptions fields: the job's shape, the target, the tuned
# values, the Metrics output, and `flip` (a pipeline parameter reads better than no_flip).
TRAIN_OP_JOB_INPUTS = ("data_dir", "workers", "gpus_per_worker", "slots_per_worker",
                       "cpu_per_worker", "memory_per_worker", "target", "hparams_json", "metrics")


def train_options(inputs: dict[str, Any]) -> TrainOptions:
    """train_op's inputs as one TrainOptions: those named as its fields, 0 standing for an
    unset optional one (a default of None: KFP parameters have no None), `flip` for not
    `no_flip`; the job's inputs (TRAIN_OP_JOB_INPUTS) are left out."""
    defaults = TrainOptions()
    values = {}
    for name, value in inputs.items():
        if name == "flip":
            values["no_flip"] = not value
        elif name in TrainOptions.names():
            values[name] = None if getattr(defaults, name) is None and not value else value
        elif name not in TRAIN_OP_JOB_INPUTS:
            raise StepError(f"train_op input {name!r}: not a TrainOptions field nor one of "
                            f"{', '.join(TRAIN_OP_JOB_INPUTS)}")
    return TrainOptions(**values)


def apply_hparams(options: TrainOptions, hparams_json: str) -> TrainOptions:
    """Override train options with tuned values ({"lr": 0.001, "batch-size": 16, ...})."""
    if not hparams_json:
        return options
    try:
        return options.with_values(json.loads(hparams_json), "tuned parameters", NOT_TUNABLE)
    except ChexflowError as e:
        raise StepError(str(e)) from None


def training_data(data_dir: str, workdir: str) -> str:
    """preprocess's output folder, given either it or the raw folder preprocess read (then its
    output is WORKDIR/data). Inside a ParallelFor the scaling study passes the raw folder:
    kfp.local 2.17 hands a loop body the loop item in place of an upstream task's output."""
    if (Path(data_dir) / "manifest.json").exists():
        return data_dir
    produced = Path(workdir) / "data"
    if (produced / "manifest.json").exists():
        return str(produced)
    raise StepError(f"data_dir {data_dir}: no manifest.json there nor in {produced}")


def train_inputs(inputs: dict[str, Any]) -> tuple[TrainOptions, Target]:
    """train_op's inputs as its options (the tuned values of `hparams_json` applied) and the
    target its job runs on (the run's, with the job's GPUs, ranks and requests per worker)."""
    target = Target.from_dict(
        inputs["target"], gpus_per_worker=inputs["gpus_per_worker"],
        slots_per_worker=inputs["slots_per_worker"], cpu=inputs["cpu_per_worker"],
        memory=inputs["memory_per_worker"])
    return apply_hparams(train_options(inputs), inputs.get("hparams_json") or ""), target


def train_job(data_dir: str, workers: int, options: TrainOptions, target: Target) -> JobSpec:
    """The train step's job: `workers` Horovod processes writing WORKDIR/train-wN, its options
    checked as the worker checks them before it starts."""
    from chexflow.train.rundir import check_options

    options = dataclasses.replace(options, data=Path(data_dir),
                                  out=Path(target.path(f"train-w{workers}")))
    check_options(argparse.Namespace(**vars(options)))
    return JobSpec(
        name=target.job_name(f"train-w{workers}"),
        command=options.worker_command(),
        workers=workers, horovod=True, gpus_per_worker=target.gpus_per_worker,
        slots_per_worker=target.slots_per_worker, cpu=target.cpu, memory=target.memory,
        volumes=target.volumes(),
        env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout_seconds=target.timeout_seconds,
    )


def train_step(data_dir: str, workers: int, options: TrainOptions,
               target: Target) -> dict[str, Any]:
    """Train with `workers` Horovod processes into WORKDIR/train-wN; return metrics.json (plus
    the job's wall time and that folder)."""
    out_dir = target.path(f"train-w{workers}")
    spec = train_job(training_data(data_dir, target.workdir), workers, options, target)
    result = target.run(spec)
    metrics_path = Path(out_dir) / "metrics.json"
    if not metrics_path.exists():
        raise StepError(f"job {spec.name} succeeded but wrote no {metrics_path}")
    metrics = json.loads(metrics_path.read_text())
    metrics["job_wall_seconds"] = round(result.wall_seconds, 2)
    metrics["processes"] = spec.processes
    metrics["out_dir"] = out_dir
    return metrics


def evaluate_job(data_dir: str, model_path: str, bootstrap: int, target: Target) -> JobSpec:
    """The evaluate step's job: `chexflow evaluate` of the test split into WORKDIR/evaluate,
    its options checked as that command checks them."""
    from chexflow.evaluate.options import check_options

    check_options(bootstrap)
    return JobSpec(
        name=target.job_name("evaluate"),
        command=["chexflow", "evaluate", "--data", data_dir, "--model", model_path,
                 "--split", "test", "--out", target.path("evaluate"), "--bootstrap",
                 str(bootstrap), "--overwrite"],
        gpus_per_worker=min(target.gpus_per_worker, 1), cpu=target.cpu, memory=target.memory,
        volumes=target.volumes(), env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout_seconds=target.timeout_seconds,
    )


def evaluate_step(data_dir: str, model_path: str, bootstrap: int,
                  target: Target) -> dict[str, Any]:
    """Evaluate on the test split into WORKDIR/evaluate; return auroc.json (plus that folder)."""
    out_dir = target.path("evaluate")
    target.run(evaluate_job(data_dir, model_path, bootstrap, target))
    return {**json.loads((Path(out_dir) / "auroc.json").read_text()), "out_dir": out_dir}


def micro_roc(predictions_npz: str, max_points: int = 200) -> dict[str, list[float]]:
    """Micro-averaged ROC over all classes (masked labels left out), thinned for the UI."""
    import numpy as np
    from sklearn.metrics import roc_curve

    with np.load(predictions_npz) as pred:
        labels, probs, mask = pred["labels"], pred["probs"], pred["mask"]
    keep = mask.reshape(-1) > 0
    y, s = labels.reshape(-1)[keep], probs.reshape(-1)[keep]
    if len(np.unique(y)) < 2:
        raise StepError(f"{predictions_npz}: one label value only; no ROC curve")
    fpr, tpr, thr = roc_curve(y, s)
    thr = np.clip(thr, 0.0, 1.0)  # sklearn's first threshold is inf
    idx = np.unique(np.linspace(0, len(fpr) - 1, min(max_points, len(fpr))).astype(int))
    return {"fpr": fpr[idx].tolist(), "tpr": tpr[idx].tolist(), "thresholds": thr[idx].tolist()}


class _TuneSpecOptions(argparse.ArgumentParser):
    """The options of `chexflow tune` that change what it reads of the spec."""

    def __init__(self) -> None:
        super().__init__(add_help=False, allow_abbrev=False)
        self.add_argument("--set", dest="overrides", action="append", default=[])
        self.add_argument("--trial-templates", type=Path)

    def error(self, message: str) -> typing.NoReturn:
        raise StepError(f"tune_args: {message}")


def tune_experiment(spec_path: str, tune_args: list[str]) -> Experiment:
    """The Experiment the tune job runs, read as `chexflow tune SPEC TUNE_ARGS` reads it (with
    its `--set` changes and `--trial-templates`): a spec it would refuse is refused here."""
    from chexflow.katib.experiment.spec import load_experiment

    options, _ = _TuneSpecOptions().parse_known_args(tune_args)
    try:
        return load_experiment(spec_path, options.overrides, options.trial_templates)
    except ChexflowError as e:
        raise StepError(str(e)) from None
    except OSError as e:  # what the reader leaves unnamed (a name too long, an I/O error)
        raise StepError(f"{spec_path}: cannot read it ({os_cause(e)})") from None


def tune_inputs(inputs: dict[str, Any]) -> tuple[str, Target, dict[str, Any], list[str]]:
    """tune_op's inputs as tune_job's arguments: every trial trains on the pipeline's data
    (preprocess's output), model, image size and weights (`--trial-arg`); `tune_args` are more
    `chexflow tune` options."""
    trial_args = {arg: inputs[name] for arg, name in (
        ("data", "data_dir"), ("model", "model"), ("image-size", "image_size"),
        ("weights", "weights")) if name in inputs}
    return (inputs["spec_path"], Target.from_dict(inputs["target"]), trial_args,
            [str(a) for a in inputs["tune_args"]])


def tune_job(spec_path: str, target: Target, trial_args: dict[str, Any] | None = None,
             extra_args: list[str] | None = None) -> tuple[JobSpec, Target]:
    """The `chexflow tune` job of the tune step and the target it runs on (state in
    WORKDIR/tune). `trial_args` ({"data": DIR, "image-size": 64, ...}) set those options in
    every trial's command (`--trial-arg`): the pipeline's own data and model; `extra_args` are
    more `chexflow tune` options, after them (a user's `--trial-arg` wins). On kubernetes the
    job runs as TUNE_SERVICE_ACCOUNT (katib/rbac.yaml) and reads the spec from WORKDIR's copy
    (TUNE_SPEC_COPY, written by `tune_step`: the pod has no other path to it; the same for the
    file of its ConfigMap template, TUNE_TEMPLATES_COPY), the Experiment is
    created in the run's namespace (not the spec's) and named per run (two runs of one spec do
    not collide), the trialSpec volume TUNE_VOLUME becomes the run's PVC (`--volume`), `data`
    is given as the trial pods see it there, and each trial writes under WORKDIR/tune/trials."""
    mode = "--local" if target.backend == "local" else "--cluster"
    trial_args = dict(trial_args or {})
    cluster: list[str] = []
    job_spec_path = spec_path
    exp = tune_experiment(spec_path, extra_args or [])
    if target.backend == "kubernetes":
        from chexflow.katib.cluster.kubernetes import on_trial_volume
        from chexflow.katib.experiment.spec import NAME_MAX

        try:
            if "data" in trial_args:
                trial_args["data"] = on_trial_volume(exp, TUNE_VOLUME, target.mount_path,
                                                     str(trial_args["data"]))
            trial_args["out"] = on_trial_volume(exp, TUNE_VOLUME, target.mount_path,
                                                target.path("tune", "trials")) + TRIAL_OUT
        except ChexflowError as e:
            raise StepError(str(e)) from None
        name = target.job_name(exp.name[:NAME_MAX - 9])  # room for "-" and the run's 8
        cluster = ["--namespace", target.namespace, "--set", f"metadata.name={name}",
                   "--volume", f"{TUNE_VOLUME}={target.data_pvc}"]
        if exp.config_map is not None:
            cluster += ["--trial-templates", target.path(TUNE_TEMPLATES_COPY)]
        target = dataclasses.replace(target, service_account=TUNE_SERVICE_ACCOUNT)
        job_spec_path = target.path(TUNE_SPEC_COPY)
    sets = [a for k, v in trial_args.items() for a in ("--trial-arg", f"{k}={v}")]
    spec = JobSpec(
        name=target.job_name("tune"), environment="control",
        command=["chexflow", "tune", job_spec_path, mode, "--state", target.path("tune"),
                 "--no-progress", *cluster, *sets, *(extra_args or [])],
        cpu=TUNE_CPU, memory=TUNE_MEMORY, volumes=target.volumes(),
        timeout_seconds=target.timeout_seconds,
    )
    return spec, target


def _templates_file(spec_path: str) -> Path:
    """The file of the spec's ConfigMap template (trialTemplate.configMap)."""
    from chexflow.katib.experiment.spec import load_experiment

    config_map = load_experiment(spec_path).config_map
    if config_map is None:
        raise StepError(f"{spec_path}: its trialTemplate.configMap is no longer found")
    return config_map.file


def tune_step(spec_path: str, target: Target, trial_args: dict[str, Any] | None = None,
              extra_args: list[str] | None = None) -> dict[str, Any]:
    """Run a Katib Experiment spec with `chexflow tune` (local runner, or the cluster's Katib;
    `tune_job`) and return its optimal.json: {"trial", "parameters", "metrics"}."""
    spec, job_target = tune_job(spec_path, target, trial_args, extra_args)
    if target.backend == "kubernetes":
        Path(target.workdir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec_path, target.path(TUNE_SPEC_COPY))
        if "--trial-templates" in spec.command:
            templates = spec.command[spec.command.index("--trial-templates") + 1]
            shutil.copyfile(_templates_file(spec_path), templates)
    job_target.run(spec)
    optimal = Path(target.path("tune")) / "optimal.json"
    if not optimal.exists():
        raise StepError(f"job {spec.name} finished without writing {optimal}")
    result = json.loads(optimal.read_text())
    if not isinstance(result.get("parameters"), dict):
        raise StepError(f"{optimal}: no 'parameters' object (the optimal trial's assignments)")
    return result


def tune_trial_metrics(target: Target) -> dict[str, float | str]:
    """Every trial of the tune step (WORKDIR/tune/results.json, local or cluster) for the
    pipeline's metrics: trialN_METRIC (after its metricStrategy) for each metric it reported,
    and trialN its name and status (N: creation order from 1, as in objective.png)."""
    from chexflow.katib.local.results import load_results

    results = load_results(Path(target.path("tune")))
    metrics = list(results["objective"]["strategies"])
    out: dict[str, float | str] = {}
    for n, trial in enumerate(results["trials"], 1):
        out[f"trial{n}"] = f"{trial['trial']} {trial['status']}"
        for name in metrics:
            value = trial.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"trial{n}_{name}"] = float(value)
    return out


# --- the optional deploy step: the trained model as a KServe InferenceService ---

def serving_uri(model_path: str, target: Target) -> str:
    """The storage URI KServe mounts for a trained model: its run folder (best_model.keras with
    run.json) on the run's PVC, `pvc://CLAIM/PATH under the mount`."""
    run = Path(model_path)
    run = run.parent if run.suffix == ".keras" else run
    if not run.is_relative_to(target.mount_path):
        raise StepError(f"deploy: model {model_path} is not under {target.mount_path}, where "
                        f"PVC {target.data_pvc} is mounted; KServe could not mount it")
    return f"pvc://{target.data_pvc}/{run.relative_to(target.mount_path)}"


def check_deploy(name: str, target: Target) -> None:
    """The deploy step's inputs: a cluster to serve on and a name KServe takes there."""
    from chexflow.serve.render import ServeError, check_host_name, check_name

    if target.backend != "kubernetes":
        raise StepError("deploy true: needs backend kubernetes (a cluster with KServe); the "
                        f"backend is {target.backend}")
    try:
        check_name(name, "serve_name")
        check_host_name(name, target.namespace, "serve_name")
    except ServeError as e:
        raise StepError(str(e)) from None


def deploy_step(model_path: str, name: str, target: Target) -> str:
    """The model as InferenceService `name` in the run's namespace (chexflow's runtime on the
    run's trainer image), once KServe says it is Ready; its in-cluster URL."""
    from chexflow.kube import load_api_client
    from chexflow.serve.deploy import deploy
    from chexflow.serve.render import inference_service

    check_deploy(name, target)
    isvc = inference_service(name, serving_uri(model_path, target), namespace=target.namespace,
                             service_account=target.service_account or None)
    done = deploy(load_api_client(), isvc, target.namespace,
                  timeout=min(target.timeout_seconds, DEPLOY_TIMEOUT_SECONDS),
                  image=target.trainer_image or None)
    print(f"deploy: InferenceService {done.namespace}/{done.name} Ready at {done.url}",
          flush=True)
    return done.url or ""


# --- each component's inputs checked before a run starts (`chexflow run`, before any step) ---
# A check takes the inputs known then (the pipeline's parameters and its own constants; an
# input an earlier step makes is left out) and applies the step's own rules to them: the same
# functions the step calls before its job. It returns the outputs it knows (the target).

def check_target_op(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"Output": target_from_inputs(inputs).to_dict()}


def check_preprocess_op(inputs: dict[str, Any]) -> dict[str, Any]:
    check_preprocess(inputs.get("raw_dir"), inputs["image_size"])
    return {}


def check_train_op(inputs: dict[str, Any]) -> dict[str, Any]:
    options, target = train_inputs({"target": {}, **inputs})
    train_job(inputs.get("data_dir", PENDING), inputs.get("workers", 1), options, target)
    return {}


def check_evaluate_op(inputs: dict[str, Any]) -> dict[str, Any]:
    evaluate_job(inputs.get("data_dir", PENDING), inputs.get("model_path", PENDING),
                 inputs["bootstrap"], Target.from_dict(inputs.get("target", {})))
    return {}


def check_deploy_op(inputs: dict[str, Any]) -> dict[str, Any]:
    check_deploy(inputs["name"], Target.from_dict(inputs.get("target", {})))
    return {}


def check_tune_op(inputs: dict[str, Any]) -> dict[str, Any]:
    tune_job(*tune_inputs({"target": {}, **inputs}))
    return {}


# The components (chexflow.components.definitions, by function name) whose inputs a run checks
# first; the others take only earlier steps' outputs and a title.
STEP_CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "target_op": check_target_op, "preprocess_op": check_preprocess_op,
    "train_op": check_train_op, "evaluate_op": check_evaluate_op, "tune_op": check_tune_op,
    "deploy_op": check_deploy_op,
}


def check_step(component: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Check a step's inputs known before the run (see STEP_CHECKS); its outputs known then."""
    check = STEP_CHECKS.get(component)
    return check(inputs) if check else {}
