"""`chexflow tune --cluster`: create the Experiment with the Kubernetes client, follow it to its
end, and write the local runner's results from its Trials.

- What is sent: the spec after `--set` (and Katib's defaults), in `--namespace` (else the
  spec's, else the kubeconfig context's: current_namespace); `--trial-arg` set in the primary
  container's command by the local runner's own builder (`trialspec.override_args`); `--volume
  NAME=PVC` makes the trialSpec volume NAME that PersistentVolumeClaim in every pod. The result
  is checked again with Katib's rules (a `--trial-arg` that replaces a `${trialParameters.X}`
  leaves X unused, which Katib refuses). A namespace without Katib's label is one line with the
  command that adds it, before anything is written. A ConfigMap template
  (trialTemplate.configMap) read from the repository (templates.py) is created on the cluster
  first, or keys it lacks added, in `--namespace` when the spec keeps it beside the Experiment;
  a key that differs there is replaced only with `--update-templates` (else the diff, and one
  line); with `--trial-arg`/`--volume` its template is sent inlined as trialSpec instead (the
  ConfigMap, which other Experiments may use, stays as it is).
- While it runs: one line per change of the Experiment's trial counters (with the best trial so
  far, status.currentOptimalTrial), and one line per Trial that ends, with its condition's
  message when it Failed (and the last lines of its primary container's log), had no metrics
  or was stopped; and one line per new trouble in a running trial's pods (a failed attempt
  with its count and last log line, an image that cannot be pulled, a pod that cannot be
  scheduled), found with the jobs backend's own pod checks.
- At the end: results.{json,csv,html}, objective.png and optimal.json by the same writers as a
  local sweep (results.py), from each Trial's parameterAssignments and status.observation;
  optimal.json is status.currentOptimalTrial. experiment.json keeps the Experiment as read.
- Stopped (SIGTERM, Ctrl-C) or timed out: the Experiment is deleted (its Trials and their jobs
  go with it, propagation Background) before the command ends; a second SIGTERM is ignored
  while it is deleted.

Only the Kubernetes client is needed (CustomObjectsApi, kubeflow.org/v1beta1); the Katib SDK
pins protobuf < 5 and has no local mode.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

from chexflow.errors import ChexflowError
from chexflow.jobs.diagnosis import ended_attempts, pod_blockers
from chexflow.jobs.render import JOB_NAME_LABEL
from chexflow.jobs.signals import Terminated, ignore_sigterm, sigterm_raises
from chexflow.katib.experiment.model import Experiment
from chexflow.katib.experiment.spec import SpecError, parse_experiment
from chexflow.katib.experiment.templates import describe, inline, not_found
from chexflow.katib.experiment.trialspec import override_args, primary_container, volume_names
from chexflow.katib.local.results import optimal_entry, trial_line, write_results
from chexflow.katib.local.state import COMPLETED, STATE_FILE, TrialRecord
from chexflow.kube import api_message, finished_condition, in_pod, is_transient, load_api_client

GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"
TRIALS, SUGGESTIONS = "trials", "suggestions"
SUGGESTION_FAILED = "Suggestion has failed"  # the Experiment's message; the reason is on the
# Suggestion, which has the Experiment's name
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"  # Katib's label on an Experiment's Trials
# (and, copied by Katib's pod webhook, on their pods, with the Trial's name under TRIAL_LABEL)
TRIAL_LABEL = "katib.kubeflow.org/trial"
# Katib's StdOut/File collector sidecar: it logs the primary container's metrics file (klog)
COLLECTOR_CONTAINER = "metrics-logger-and-collector"
KLOG_HEADER = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [^ \]]+:\d+\] ")
UNAVAILABLE = "unavailable"  # Katib's value of a metric it could not collect
# A Trial's status from its True conditions, in the order Katib's experiment controller checks
# them (updateTrialsSummary); none of them: Created (pending).
TRIAL_STATUSES = ("Killed", "Failed", "Succeeded", "EarlyStopped", "Running", "MetricsUnavailable")
# Progress: the Experiment's status counters, always shown, then those shown when not zero.
COUNTERS = (("running", "trialsRunning"), ("succeeded", "trialsSucceeded"),
            ("failed", "trialsFailed"), ("early-stopped", "trialsEarlyStopped"),
            ("metrics-unavailable", "trialMetricsUnavailable"))
OPTIONAL_COUNTERS = (("pending", "trialsPending"), ("killed", "trialsKilled"))
TRIAL_LOG_LINES = 8  # log lines shown under a Failed trial
# Katib's webhook, for an earlyStopping algorithm katib-config does not list
NO_EARLY_STOPPING_SERVICE = "unable to get EarlyStopping config data"
# ... and for a suggestion algorithm it does not list
NO_SUGGESTION_SERVICE = "unable to get Suggestion config data"
# ... and for a ConfigMap template it cannot read (manifest/generator.go errConfigMapNotFound)
NO_CONFIG_MAP = "configMap not found"
SPEC_ANNOTATION = "chexflow.io/spec-sha256"  # Experiment.fingerprint() of what tune sent
DB_MANAGER = ("kubeflow", "katib-db-manager", 6789)  # Katib's default dbManagerAddress
OBSERVATION_LOGS = "observation-logs.json"
# the label Katib's experiment webhook asks of an Experiment's namespace, whatever its collector
# (pkg/webhook/v1beta1/experiment/validation_webhook.go; common/const.go)
INJECTION_LABEL = ("katib.kubeflow.org/metrics-collector-injection", "enabled")
NO_INJECTION_LABEL = "the namespace lacks label"  # ... its refusal
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
TEMPLATE_WAIT_S = 15.0  # how long a just-written ConfigMap may take to reach Katib's cache
PVC_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def failure_line(text: str) -> str:
    """Of a failed attempt's last log lines (klog headers of Katib's collector removed): the
    last `PROG: error: ...` line, the one-line error of chexflow and argparse, since mpirun's
    warnings and summary come after its rank's error; else the last line."""
    lines = [KLOG_HEADER.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if ": error: " in ln]
    return (errors or lines or [""])[-1]


class ClusterError(ChexflowError):
    """The Experiment could not be created or followed on the cluster."""


class ExperimentStopped(ChexflowError):
    """`chexflow tune --cluster` was stopped or timed out; the Experiment was deleted."""


def current_namespace() -> str:
    """The namespace kubectl would use for an object that names none: the kubeconfig's current
    context's, else in a pod (without a kubeconfig) the pod's own, else `default`."""
    from kubernetes import config

    kubeconfig = os.environ.get("KUBECONFIG")
    if in_pod() and not kubeconfig:
        with contextlib.suppress(OSError):
            return SA_NAMESPACE.read_text().strip() or "default"
        return "default"
    try:
        _, context = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError, TypeError, ValueError):
        return "default"  # no configuration: loading the client says so in one line
    return (context.get("context") or {}).get("namespace") or "default"


def unlabelled(namespace: str) -> str:
    """One line: the namespace lacks the label Katib asks for, and the command that adds it."""
    key, value = INJECTION_LABEL
    return (f"namespace {namespace} lacks the label {key}: {value}, without which Katib refuses "
            f"an Experiment there: kubectl label namespace {namespace} {key}={value}")


def template_diff(where: str, current: dict, data: dict, file: Path) -> list[str]:
    """The unified diff of each key whose template on the cluster differs from the file's."""
    lines: list[str] = []
    for key in sorted(k for k in data if k in current and current[k] != data[k]):
        lines += difflib.unified_diff(str(current[key]).splitlines(), data[key].splitlines(),
                                      f"{where}: {key} (on the cluster)", f"{file}: {key}",
                                      lineterm="")
    return lines


def custom_objects_api(api_client=None):
    from kubernetes import client

    return client.CustomObjectsApi(api_client or load_api_client())


# ---- the Experiment to create ------------------------------------------------------------------
def parse_claims(items: list[str]) -> dict[str, str]:
    """--volume NAME=PVC on a cluster: trialSpec volume -> PersistentVolumeClaim name."""
    out = {}
    for item in items:
        name, sep, claim = item.partition("=")
        if not sep or not name or not claim:
            raise ClusterError(f"--volume {item!r}: expected NAME=PVC with --cluster (a trialSpec "
                               "volume and the PersistentVolumeClaim it becomes)")
        if not PVC_NAME_RE.match(claim) or len(claim) > 253:
            raise ClusterError(f"--volume {item}: {claim!r} is not a PersistentVolumeClaim name "
                               "(lower case letters, digits, '-' and '.'); with --cluster a "
                               "volume is a claim, not a folder")
        out[name] = claim
    return out


def cluster_experiment(exp: Experiment, namespace: str | None, trial_args: list[str],
                       claims: dict[str, str]) -> Experiment:
    """The Experiment to create: `exp` (--set applied) in `namespace`, with --trial-arg set in
    the primary container's command and --volume claims in the trialSpec. The spec is parsed
    once per command: only a trialSpec that --trial-arg/--volume changed is checked again."""
    body = copy.deepcopy(exp.raw)
    template = body["spec"]["trialTemplate"]
    ref = template.get("configMap")
    if namespace:
        body.setdefault("metadata", {})["namespace"] = namespace
        beside = (exp.raw.get("metadata") or {}).get("namespace")  # as the spec names it
        if ref and beside and ref.get("configMapNamespace") == beside:  # kept beside it
            ref["configMapNamespace"] = namespace
    if not trial_args and not claims:  # no field Katib's rules check has changed
        return dataclasses.replace(exp, namespace=namespace or exp.namespace, raw=body,
                                   trial_template=template)
    head = f"{exp.source}: " if exp.source else ""
    if ref is not None:  # a changed template goes with the Experiment, the ConfigMap unchanged
        if exp.config_map is None:
            missing = not_found(ref, exp.template_files)
            raise ClusterError(f"{head}spec.trialTemplate.configMap: --trial-arg and --volume "
                               f"change the trial template, but {missing}")
        inline(body, exp.config_map)
    container, pods = primary_container(exp, template["trialSpec"])
    if trial_args:
        _set_trial_args(container, trial_args, head)
    for name, claim in claims.items():
        found = [v for pod in pods for v in pod.get("volumes") or [] if v.get("name") == name]
        if not found:
            have = volume_names(pods)
            raise ClusterError(f"{head}--volume {name}={claim}: spec.trialTemplate.trialSpec has "
                               f"no volume {name!r} (its volumes: {', '.join(have) or 'none'})")
        for volume in found:
            volume.clear()
            volume.update(name=name, persistentVolumeClaim={"claimName": claim})
    try:
        return parse_experiment(body, exp.source)
    except SpecError as e:
        changed = " ".join([*(f"--trial-arg {a}" for a in trial_args),
                            *(f"--volume {k}={v}" for k, v in claims.items())])
        raise ClusterError(f"with {changed}: {e}") from None


def _set_trial_args(container: dict, trial_args: list[str], head: str) -> None:
    """--trial-arg NAME=VALUE in the container's command + args (as a local trial's argv)."""
    command = [str(a) for a in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command and not args:
        raise ClusterError(f"{head}spec.trialTemplate.trialSpec container "
                           f"{container.get('name')!r}: no command or args for --trial-arg")
    argv = override_args(command + args, trial_args)
    if command:
        container["command"] = argv[:len(command)]
    if args or len(argv) > len(command):
        container["args"] = argv[len(command):]


def on_trial_volume(exp: Experiment, volume: str, mount_path: str, path: str) -> str:
    """`path`, on a PVC a pipeline step mounts at `mount_path`, as the trial pods see it when
    that PVC is the trialSpec volume `volume` (`--volume VOLUME=PVC`): under the primary
    container's mountPath of that volume."""
    head = f"{exp.source}: " if exp.source else ""
    ref = exp.trial_template.get("configMap")
    if ref and exp.config_map is None:
        raise ClusterError(f"{head}spec.trialTemplate.configMap: the trials' volumes are in its "
                           f"template, but {not_found(ref, exp.template_files)}")
    container, _ = primary_container(exp, exp.trial_spec)
    mounts = [m.get("mountPath") for m in container.get("volumeMounts") or []
              if m.get("name") == volume]
    if not mounts:
        raise ClusterError(f"{head}spec.trialTemplate.trialSpec container "
                           f"{container.get('name')!r} mounts no volume {volume!r}; the trials "
                           f"could not read {path}")
    try:
        rel = PurePosixPath(path).relative_to(mount_path)
    except ValueError:
        raise ClusterError(f"{path}: not under {mount_path}, where the PVC is mounted; the "
                           "trials could not read it") from None
    return str(PurePosixPath(mounts[0]) / rel)


# ---- reading Trials ----------------------------------------------------------------------------
def _observation(status: dict) -> dict[str, dict[str, float]]:
    """status.observation.metrics -> {metric: {min, max, latest}} (unavailable values left out)."""
    out: dict[str, dict[str, float]] = {}
    for m in (status.get("observation") or {}).get("metrics") or []:
        values = {}
        for key in ("min", "max", "latest"):
            with contextlib.suppress(TypeError, ValueError):
                if m.get(key) not in (None, UNAVAILABLE):
                    values[key] = float(m[key])
        if "latest" in values:
            out[m["name"]] = values
    return out


def trial_status(conditions: list[dict] | None) -> tuple[str, str]:
    """(status, its condition's message) as Katib's controller classifies a Trial."""
    true = {c.get("type"): c for c in conditions or [] if c.get("status") == "True"}
    for status in TRIAL_STATUSES:
        if status in true:
            return status, str(true[status].get("message") or "")
    return "Created", ""


def trial_record(obj: dict, index: int) -> TrialRecord:
    """A Katib Trial as the record the result writers read."""
    status = obj.get("status") or {}
    state, message = trial_status(status.get("conditions"))
    return TrialRecord(
        name=obj["metadata"]["name"], index=index,
        parameters={a["name"]: a["value"]
                    for a in (obj.get("spec") or {}).get("parameterAssignments") or []},
        status=state, created=obj["metadata"].get("creationTimestamp") or "",
        started=status.get("startTime"), finished=status.get("completionTime"),
        message=message, observation=_observation(status),
    )


def trial_records(items: list[dict]) -> list[TrialRecord]:
    """The Experiment's Trials in creation order."""
    items = sorted(items, key=lambda t: (t["metadata"].get("creationTimestamp") or "",
                                         t["metadata"]["name"]))
    return [trial_record(t, i) for i, t in enumerate(items)]


def optimal_from_status(exp: Experiment, obj: dict) -> dict[str, Any] | None:
    """status.currentOptimalTrial as optimal.json (metrics after their metricStrategy)."""
    cur = (obj.get("status") or {}).get("currentOptimalTrial") or {}
    if not cur.get("bestTrialName"):
        return None
    rec = trial_record({"metadata": {"name": cur["bestTrialName"]},
                        "spec": {"parameterAssignments": cur.get("parameterAssignments")},
                        "status": {"observation": cur.get("observation")}}, 0)
    return optimal_entry(exp, rec)


def progress_line(exp: Experiment, obj: dict) -> str:
    """`trials: running=.. succeeded=.. ...; best so far: TRIAL METRIC=VALUE`."""
    st = obj.get("status") or {}
    parts = [f"{label}={int(st.get(key) or 0)}" for label, key in COUNTERS]
    parts += [f"{label}={st[key]}" for label, key in OPTIONAL_COUNTERS if st.get(key)]
    line = "trials: " + " ".join(parts)
    best = optimal_from_status(exp, obj)
    value = (best or {}).get("metrics", {}).get(exp.objective.metric)
    if value is not None:
        line += f"; best so far: {best['trial']} {exp.objective.metric}={value:.6g}"
    return line


# ---- following the Experiment ------------------------------------------------------------------
class ClusterSweep:
    """One Experiment on the cluster: created, followed, results written, deleted if stopped."""

    def __init__(self, exp: Experiment, state_dir: Path, timeout: float, poll: float,
                 echo: Callable[[str], None] = print, api_client=None,
                 update_templates: bool = False):
        self.exp, self.ns, self.name = exp, exp.namespace, exp.name
        self.update_templates = update_templates  # replace a ConfigMap template that differs
        self.state_dir, self.timeout, self.poll, self.echo = state_dir, timeout, poll, echo
        self.api = custom_objects_api(api_client)
        self.shown: dict[str, str] = {}  # trial -> the ended status already reported
        self.pod_notes: set[str] = set()  # pod events already reported (one line each)
        self.attempts: dict[str, int] = {}  # trial -> failed attempts reported
        self.deadline = time.monotonic() + timeout

    @property
    def where(self) -> str:
        return f"experiment {self.ns}/{self.name}"

    def create(self, dry_run: bool) -> dict | None:
        """Create the Experiment; returns the one already there when it holds this spec
        (created by an earlier `chexflow tune` of it), which is then followed instead."""
        if (existing := self.existing()) is not None:
            return existing
        self.check_namespace()
        body, written = self.apply_template(dry_run)
        body = copy.deepcopy(body)
        annotations = body.setdefault("metadata", {}).setdefault("annotations", {})
        annotations[SPEC_ANNOTATION] = self.exp.fingerprint()
        until = time.monotonic() + TEMPLATE_WAIT_S
        while True:
            try:
                self.api.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body,
                                                         dry_run="All" if dry_run else None)
                return None
            except Exception as e:
                # Katib's webhook reads ConfigMaps from its informer's cache: a moment behind
                if not (written and NO_CONFIG_MAP in api_message(e)
                        and time.monotonic() < until):
                    self._refused(e)
                time.sleep(1)

    def check_namespace(self) -> None:
        """One line when the namespace lacks the label Katib's webhook asks for (before anything
        is written); an account that may not read Namespaces gets the webhook's refusal, told
        the same way (_refused)."""
        from kubernetes import client

        try:
            labels = client.CoreV1Api(self.api.api_client).read_namespace(
                self.ns).metadata.labels or {}
        except Exception as e:
            if getattr(e, "status", None) == 404:
                raise ClusterError(f"namespace {self.ns} not found") from e
            return
        if labels.get(INJECTION_LABEL[0]) != INJECTION_LABEL[1]:
            raise ClusterError(unlabelled(self.ns))

    def apply_template(self, dry_run: bool) -> tuple[dict, bool]:
        """The Experiment to send, and whether its ConfigMap template was just written: the
        ConfigMap gets the data of the repository's file (created, or keys it lacks added); a
        template on the cluster that differs from the file's is replaced only with
        --update-templates (other Experiments may read it), else refused with the diff. A dry
        run writes nothing and, when the cluster's differs, sends the template inlined."""
        from kubernetes import client

        body, ref, found = self.exp.raw, self.exp.trial_template.get("configMap"), \
            self.exp.config_map
        if not ref:
            return body, False
        if found is None:
            files = ", ".join(map(str, self.exp.template_files))
            self.echo(f"{describe(ref)}: not in {files}; Katib reads the cluster's")
            return body, False
        name, ns = ref["configMapName"], ref["configMapNamespace"]
        where, data = f"ConfigMap {ns}/{name}", dict(found.config_map.get("data") or {})
        core = client.CoreV1Api(self.api.api_client)
        try:
            current = core.read_namespaced_config_map(name, ns).data or {}
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise ClusterError(f"{where}: reading it: {api_message(e)}") from e
            current = None
        if current is not None and all(current.get(k) == v for k, v in data.items()):
            self.echo(f"{where}: as in {found.file}")
            return body, False
        diff = template_diff(where, current or {}, data, found.file)
        if diff and not self.update_templates:
            for line in diff:  # a diff is many lines: printed before the one-line error
                self.echo(line)
            keys = sorted(k for k in data if k in current and current[k] != data[k])
            raise ClusterError(f"{where}: {', '.join(keys)} on the cluster differs from "
                               f"{found.file} (the diff above) and other Experiments may read "
                               f"it: rerun with --update-templates to replace it with the "
                               f"file's, or apply the file yourself")
        verb = "created" if current is None else "updated"
        if dry_run:
            self.echo(f"{where}: would be {verb} from {found.file}; the dry run sends its "
                      f"template inlined")
            body = copy.deepcopy(body)
            inline(body, found)
            return body, False
        labels = (found.config_map.get("metadata") or {}).get("labels") or {}
        try:
            if current is None:
                core.create_namespaced_config_map(ns, {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": ns, "labels": labels},
                    "data": data})
            else:
                core.patch_namespaced_config_map(name, ns, {"metadata": {"labels": labels},
                                                            "data": data})
        except Exception as e:
            raise ClusterError(f"{where}: not {verb}: {api_message(e)}") from e
        self.echo(f"{where}: {verb} from {found.file} (the trial template Katib reads)")
        return body, True

    def existing(self) -> dict | None:
        """The Experiment of this name if it holds this spec; one line if another spec."""
        try:
            obj = self.api.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL,
                                                        self.name)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise ClusterError(f"{self.where}: reading it: {api_message(e)}") from e
        sent = ((obj.get("metadata") or {}).get("annotations") or {}).get(SPEC_ANNOTATION)
        if sent != self.exp.fingerprint():
            raise ClusterError(f"{self.where} already exists with a different spec (or one not "
                               f"created by `chexflow tune`); delete it or change metadata.name")
        return obj

    def _refused(self, e: Exception) -> NoReturn:
        """One line for an Experiment the API server or Katib's webhook refused."""
        if getattr(e, "status", None) == 409:
            raise ClusterError(f"{self.where} already exists: delete it or change "
                               f"metadata.name") from e
        message = api_message(e)
        if NO_INJECTION_LABEL in message:
            raise ClusterError(unlabelled(self.ns)) from e
        if NO_EARLY_STOPPING_SERVICE in message:
            message += ("; run it without early stopping with --set spec.earlyStopping=null, "
                        "or list that algorithm in katib-config's earlyStopping")
        if NO_SUGGESTION_SERVICE in message:
            message += ("; this Katib has no suggestion service for that algorithm: pick one "
                        "its katib-config lists under suggestions, or add the algorithm's "
                        "service there")
        raise ClusterError(f"creating {self.where}: {message}") from e

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """An API read; 429/5xx and connection errors are retried until the deadline."""
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if not is_transient(e) or time.monotonic() > self.deadline:
                    raise ClusterError(f"{self.where}: reading it: {api_message(e)}") from e
                time.sleep(self.poll)

    def read(self) -> tuple[dict, list[TrialRecord]]:
        obj = self._call(self.api.get_namespaced_custom_object, GROUP, VERSION, self.ns, PLURAL,
                         self.name)
        items = self._call(self.api.list_namespaced_custom_object, GROUP, VERSION, self.ns,
                           TRIALS, label_selector=f"{EXPERIMENT_LABEL}={self.name}")["items"]
        return obj, trial_records(items)

    def report(self, obj: dict, trials: list[TrialRecord], last: str | None) -> str:
        """Lines for trials that ended since the last look (a Failed one with the last lines
        of its primary container's log) and for changed counters."""
        for rec in trials:
            if rec.status in COMPLETED and self.shown.get(rec.name) != rec.status:
                self.shown[rec.name] = rec.status
                self.echo(trial_line(self.exp, rec))
                if rec.status == "Failed":
                    self.report_log(rec.name)
        line = progress_line(self.exp, obj)
        if line != last:
            self.echo(line)
        return line

    def report_log(self, trial: str) -> None:
        """The failed trial's last log lines, or where its log went."""
        tail = self.log_tail(trial)
        for line in tail:
            self.echo(f"  | {line}")
        if tail:
            return
        if self.exp.trial_template.get("retain"):
            self.echo("  (its log went with its pod: a Job deletes a restarting pod once past "
                      "its backoffLimit)")
        else:
            self.echo("  (its log went with its pods: Katib deletes a finished trial's job; "
                      "--set spec.trialTemplate.retain=true keeps it for kubectl logs)")

    def log_tail(self, trial: str, lines: int = TRIAL_LOG_LINES) -> list[str]:
        """The last lines of the trial's primary container (the attempt that failed when the
        kubelet restarted it), as `kubectl logs [--previous]` shows them; none when its pod is
        gone (Katib deletes a finished trial's job unless trialTemplate.retain)."""
        from kubernetes import client

        tt = self.exp.trial_template
        container = tt.get("primaryContainerName")
        primary = tt.get("primaryPodLabels") or {}
        core = client.CoreV1Api(self.api.api_client)
        for selector in (f"{JOB_NAME_LABEL}={trial}", f"job-name={trial}"):
            try:
                pods = core.list_namespaced_pod(self.ns, label_selector=selector).items
            except Exception:
                return []
            pods = [p for p in pods if primary.items() <= (p.metadata.labels or {}).items()]
            for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp, reverse=True):
                restarted = any(c.name == container and c.restart_count
                                for c in (pod.status and pod.status.container_statuses) or [])
                for previous in ((False, True) if restarted else (False,)):
                    try:
                        text = core.read_namespaced_pod_log(
                            pod.metadata.name, self.ns, container=container,
                            tail_lines=lines, previous=previous)
                    except Exception:
                        continue
                    if text.strip():
                        return [ln for ln in text.splitlines() if ln.strip()][-lines:]
        return []

    def watch_pods(self, trials: list[TrialRecord]) -> None:
        """One line per new trouble in a running trial's pods, as the jobs backend reports an
        MPIJob's: an attempt of the primary container that failed (the trial's attempt count,
        exit code, CrashLoopBackOff, its last log line), a pod that cannot start (image pull,
        config) or cannot be scheduled, with the kubelet's or the scheduler's reason."""
        from kubernetes import client

        active = {t.name for t in trials if t.status in ("Created", "Running")}
        if not active:
            return
        core = client.CoreV1Api(self.api.api_client)
        try:
            pods = core.list_namespaced_pod(
                self.ns, label_selector=f"{EXPERIMENT_LABEL}={self.name}").items
        except Exception:
            return  # the next poll looks again
        tt = self.exp.trial_template
        container = str(tt.get("primaryContainerName"))
        primary = (tt.get("primaryPodLabels") or {}).items()
        for pod in sorted(pods, key=lambda p: str(p.metadata.creation_timestamp or "")):
            trial = (pod.metadata.labels or {}).get(TRIAL_LABEL)
            if trial not in active:
                continue
            for b in pod_blockers(pod):
                verb = "be scheduled" if b.unschedulable else "start"
                self._note_pod(f"{b.what}/{b.why}", f"trial {trial}: cannot {verb}: {b.what}: "
                                                    f"{b.why}")
            if not primary <= (pod.metadata.labels or {}).items():
                continue
            for attempt, how, previous in ended_attempts(pod, container):
                key = f"{pod.metadata.name}/{attempt}"
                if key in self.pod_notes:
                    continue
                self.attempts[trial] = self.attempts.get(trial, 0) + 1
                waiting = [s.state.waiting.reason for s in pod.status.container_statuses or []
                           if s.name == container and s.state and s.state.waiting]
                last = self.pod_log_line(core, pod.metadata.name, container, previous)
                self._note_pod(key, f"trial {trial}: attempt {self.attempts[trial]} failed in "
                                    f"pod {pod.metadata.name} (exit code {how.exit_code}: "
                                    f"{how.reason or 'Error'}"
                                    + (f", now {waiting[0]}" if waiting else "") + ")"
                                    + (f": {last}" if last else ""))

    def _note_pod(self, key: str, line: str) -> None:
        if key not in self.pod_notes:
            self.pod_notes.add(key)
            self.echo(line)

    def pod_log_line(self, core, pod: str, container: str, previous: bool) -> str:
        """The line that says why the failed attempt ended (failure_line): the container's own
        log, else (StdOut collector: Katib sends the output to its metrics file) the collector
        sidecar's."""
        for name, prev in ((container, previous), (COLLECTOR_CONTAINER, False)):
            try:
                text = core.read_namespaced_pod_log(pod, self.ns, container=name,
                                                    tail_lines=20, previous=prev)
            except Exception:
                continue
            if line := failure_line(text):
                return line
        return ""

    def follow(self) -> tuple[dict, list[TrialRecord], dict]:
        """Wait for Succeeded or Failed; returns the Experiment, its Trials and that condition."""
        last = None
        while True:
            obj, trials = self.read()
            self.watch_pods(trials)
            last = self.report(obj, trials, last)
            cond = finished_condition((obj.get("status") or {}).get("conditions"), "Experiment")
            if cond:
                return obj, trials, cond
            if time.monotonic() > self.deadline:
                raise TimeoutError
            time.sleep(self.poll)

    def delete(self) -> None:
        from kubernetes import client

        try:
            self.api.delete_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, self.name,
                body=client.V1DeleteOptions(propagation_policy="Background"))
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise ClusterError(f"deleting {self.where}: {api_message(e)}") from e

    def run(self) -> tuple[dict, list[TrialRecord], dict]:
        """Follow the created Experiment; delete it when stopped or timed out."""
        with sigterm_raises():
            try:
                return self.follow()
            except (Terminated, KeyboardInterrupt, TimeoutError) as e:
                ignore_sigterm()  # deleting: not cut short
                why = {Terminated: "stopped by SIGTERM", KeyboardInterrupt: "interrupted",
                       TimeoutError: f"not finished after {self.timeout:.0f} s"}[type(e)]
                self.delete()
                line = f"{why}: deleted {self.where} and its trials"
                if isinstance(e, KeyboardInterrupt):
                    self.echo(line)
                    raise
                raise ExperimentStopped(line) from None

    def suggestion_failure(self) -> str:
        """The Failed condition's message of the Experiment's Suggestion (same name), if any."""
        try:
            sug = self.api.get_namespaced_custom_object(GROUP, VERSION, self.ns, SUGGESTIONS,
                                                        self.name)
        except Exception as e:
            return f"(suggestion {self.name} not readable: {api_message(e)})"
        for c in (sug.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Failed" and c.get("status") == "True":
                return str(c.get("message") or c.get("reason") or "")
        return ""

    def write(self, obj: dict, trials: list[TrialRecord]) -> dict[str, Any]:
        """experiment.json and the results; Katib's "Suggestion has failed" gets the
        Suggestion's own reason."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "experiment.json").write_text(json.dumps(obj, indent=1, default=str))
        conditions = copy.deepcopy((obj.get("status") or {}).get("conditions") or [])
        for c in conditions:
            if (c.get("type") == "Failed" and c.get("status") == "True"
                    and c.get("message") == SUGGESTION_FAILED):
                c["message"] = f"{SUGGESTION_FAILED}: {self.suggestion_failure()}"
        summary = write_results(self.exp, self.state_dir, trials, conditions,
                                optimal_from_status(self.exp, obj),
                                where=f"on the cluster, namespace {self.ns}")
        self.write_observation_logs(trials)
        return summary

    def write_observation_logs(self, trials: list[TrialRecord]) -> None:
        """STATE/observation-logs.json: every report of each trial's metrics, as Katib's
        db-manager keeps them (at its Service's ClusterIP, or its DNS name in a pod that may not
        read Services there); one line if they cannot be read."""
        from kubernetes import client

        from chexflow.katib.services.server import api

        ns, name, port = DB_MANAGER
        metrics = self.exp.objective.metric_names
        try:
            host = client.CoreV1Api(self.api.api_client).read_namespaced_service(
                name, ns).spec.cluster_ip
        except Exception:  # noqa: BLE001 - not allowed or not there: Katib's own address
            host = f"{name}.{ns}"
        try:
            import grpc

            pb = api()
            logs: dict[str, dict[str, list[dict[str, Any]]]] = {}
            with grpc.insecure_channel(f"{host}:{port}") as channel:
                rpc = channel.unary_unary(
                    "/api.v1.beta1.DBManager/GetObservationLog",
                    request_serializer=pb.GetObservationLogRequest.SerializeToString,
                    response_deserializer=pb.GetObservationLogReply.FromString)
                for t in trials:
                    for metric in metrics:
                        reply = rpc(pb.GetObservationLogRequest(trial_name=t.name,
                                                                metric_name=metric), timeout=30)
                        logs.setdefault(t.name, {})[metric] = [
                            {"time": m.time_stamp, "value": m.metric.value}
                            for m in reply.observation_log.metric_logs]
        except Exception as e:  # results stand without them
            detail = e.details() if hasattr(e, "details") else e
            self.echo(f"observation logs: not read from {ns}/{name} at {host}:{port} ({detail})")
            return
        path = self.state_dir / OBSERVATION_LOGS
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(logs, indent=1))
        tmp.replace(path)


def check_state_dir(state_dir: Path) -> None:
    """The results folder must not hold a local sweep (its results would be replaced)."""
    if (state_dir / STATE_FILE).exists():
        raise ClusterError(f"{state_dir}: holds a local sweep ({STATE_FILE}); its results would "
                           "be replaced: pick another --state for --cluster")


def run_on_cluster(exp: Experiment, state_dir: Path, timeout: float, poll: float,
                   dry_run: bool, echo: Callable[[str], None] = print,
                   api_client=None, update_templates: bool = False) -> dict[str, Any]:
    """Create the Experiment (server-side dry run with --dry-run), follow it to its end and
    write its results; returns the results summary ({} for a dry run). `update_templates`:
    replace a ConfigMap template on the cluster that differs from the repository's."""
    if not dry_run:
        check_state_dir(state_dir)
    sweep = ClusterSweep(exp, state_dir, timeout, poll, echo, api_client, update_templates)
    existing = sweep.create(dry_run)
    if existing is not None:
        created = (existing.get("metadata") or {}).get("creationTimestamp")
        echo(f"{sweep.where} exists with this spec (created {created} by `chexflow tune`): "
             + ("nothing sent (dry run)" if dry_run else "its results follow"))
        if dry_run:
            return {}
    elif dry_run:
        echo(f"{sweep.where}: accepted by the API server (dry run)")
        return {}
    else:
        echo(f"{sweep.where} created ({exp.algorithm}, {exp.parallel_trial_count} in parallel, "
             f"up to {exp.max_trial_count} trials); waiting for Succeeded or Failed")
    obj, trials, _ = sweep.run()
    return sweep.write(obj, trials)
