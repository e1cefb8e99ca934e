"""From a trialTemplate and an assignment to the command a local trial runs.

`render_trial_spec` substitutes `${trialParameters.*}` (parameter values and Katib's metadata
references such as `${trialSpec.Name}`). `local_command_parts` takes the primary container's
command + args; an MPIJob launcher's `mpirun -np N ... python ...` becomes
`horovodrun -np N -H localhost:N --gloo TRAINER_PYTHON ...` (the trainer environment plays the
training image), and paths under the pod's volumeMounts are mapped to local folders.

`katib_wrap` then does what Katib's pod webhook does to the primary container for the StdOut,
File and TensorFlowEvent collectors (`pkg/webhook/v1beta1/pod/utils.go` `wrapWorkerContainer`,
v0.19.0): command and args joined with spaces, without quoting, under `sh -c` (or under the
user's own `sh -c`/`bash -c`), with the completion marker `echo completed > DIR/$$$$.pid`
appended, and Kubernetes' `$(VAR)`/`$$` expansion applied as the kubelet does. So a command
that the shell re-reads differently on Katib breaks here with the same `sh` message.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.katib.experiment.model import (
    DEFAULT_FILE_PATH,
    TRIAL_PARAM_RE,
    Experiment,
    format_value,
)

MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun")
MPI_NP = ("-np", "-n", "--np", "-c", "--n")
MPI_ONE_VALUE = {
    "-x", "-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile", "--machinefile",
    "-map-by", "--map-by", "-bind-to", "--bind-to", "-rank-by", "--rank-by", "-npernode",
    "--npernode", "-N", "-wdir", "--wdir", "-wd", "--prefix", "-path", "--path",
    "-output-filename", "--output-filename", "-timeout", "--timeout", "-cpus-per-proc",
    "--cpus-per-proc", "-iface", "--iface", "-ppn",
}
MPI_TWO_VALUES = {"-mca", "--mca", "-gmca", "--gmca", "-genv"}
PYTHONS = ("python", "python3")
# Katib's NeedWrapWorkerMetricsCollectorList (pkg/webhook/v1beta1/pod/const.go)
WRAPPED_COLLECTORS = ("StdOut", "File", "TensorFlowEvent")
TRAINING_COMPLETED = "completed"  # mccommon.TrainingCompleted
TRAINING_EARLY_STOPPED = "early-stopped"  # mccommon.TrainingEarlyStopped
# Characters that make sh read a word differently from the argument it was (dash, POSIX).
SHELL_SPECIAL = frozenset(" \t\n|&;<>()$`\\\"'*?[")
QUOTING_WHY = ("Katib's metrics collector joins command and args with spaces, without quoting, "
               "and runs them with sh -c")
QUOTING_HOW = ("put the command in a script file, or write command: [sh, -c] with the whole "
               "command line as one quoted string in args")


class TrialSpecError(ChexflowError):
    """The trialSpec cannot be run locally; the message says which field."""


def trial_values(exp: Experiment, trial_name: str, parameters: dict[str, Any]) -> dict[str, str]:
    """`${trialParameters.NAME}` -> its string for this trial."""
    spec = exp.trial_spec
    meta = spec.get("metadata") or {}
    out = {}
    for tp in exp.trial_parameters:
        ref = str(tp["reference"])
        if ref in parameters:
            out[tp["name"]] = format_value(exp.parameter(ref), parameters[ref])
        elif ref == "${trialSpec.Name}":
            out[tp["name"]] = trial_name
        elif ref == "${trialSpec.Namespace}":
            out[tp["name"]] = exp.namespace
        elif ref == "${trialSpec.Kind}":
            out[tp["name"]] = str(spec.get("kind"))
        elif ref == "${trialSpec.APIVersion}":
            out[tp["name"]] = str(spec.get("apiVersion"))
        else:
            kind, _, key = ref[len("${trialSpec."):-2].partition("[")
            source = meta.get("labels" if kind == "Labels" else "annotations") or {}
            if key not in source:  # Katib's applyParameters (manifest/generator.go)
                raise TrialSpecError(
                    f"spec.trialTemplate.trialParameters {tp['name']}: illegal reference of "
                    f"trial metadata: {ref}; failed to fetch {kind[:-1]}: {key} (the trialSpec's "
                    f"metadata.{kind.lower()} has no {key!r}; Katib's controller cannot create "
                    "the trial)")
            out[tp["name"]] = str(source[key])
    return out


def render_trial_spec(exp: Experiment, trial_name: str, parameters: dict[str, Any]) -> dict:
    """The trialSpec with `${trialParameters.X}` replaced as Katib's applyParameters does it:
    in the template's JSON text, each value as it is (unescaped), then parsed again; a value
    with a quote or a backslash breaks the trialSpec on Katib, so here too."""
    values = trial_values(exp, trial_name, parameters)
    text = json.dumps(exp.trial_spec, ensure_ascii=False)
    for name, value in values.items():
        text = text.replace(f"${{trialParameters.{name}}}", value)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TrialSpecError(
            f"spec.trialTemplate: the values {json.dumps(values)} break the trialSpec as Katib "
            f"substitutes them (into its JSON text, unescaped: a quote or a backslash): {e.msg}; "
            "Katib's controller cannot create the trial") from None


def primary_pod_mismatch(exp: Experiment) -> str | None:
    """Why Katib would inject no metrics collector into a batch Job trial's pod: its
    primaryPodLabels are not all on the pod (the template's labels and the Job controller's
    job-name labels; Katib's isPrimaryPod). None when they match, or for other kinds, whose
    operators add pod labels of their own."""
    spec = exp.trial_spec
    wanted = exp.trial_template.get("primaryPodLabels") or {}
    if not wanted or spec.get("kind") != "Job" or spec.get("apiVersion") != "batch/v1":
        return None
    template = (spec.get("spec") or {}).get("template") or {}
    labels = {str(k): str(v) for k, v in
              ((template.get("metadata") or {}).get("labels") or {}).items()}
    missing = {k: v for k, v in wanted.items()
               if k not in ("job-name", "batch.kubernetes.io/job-name")
               and labels.get(str(k)) != str(v)}
    if not missing:
        return None
    return (f"Katib injects no metrics collector: spec.trialTemplate.primaryPodLabels "
            f"{json.dumps(missing)} are not on the Job's pod (spec.template.metadata.labels: "
            f"{json.dumps(labels)})")


def active_deadline(spec: dict) -> tuple[str, int] | None:
    """(field, seconds) of the trial job's deadline: a batch Job's spec.activeDeadlineSeconds,
    the runPolicy's of an MPIJob (v2beta1) or a Kubeflow training job (v1). Past it, the Job
    controller (the MPIJob's launcher Job) stops the pods and marks the job Failed with reason
    DeadlineExceeded."""
    inner = spec.get("spec") if isinstance(spec.get("spec"), dict) else {}
    if spec.get("kind") == "Job" and spec.get("apiVersion") == "batch/v1":
        path, value = "spec.activeDeadlineSeconds", inner.get("activeDeadlineSeconds")
    else:
        policy = inner.get("runPolicy") if isinstance(inner.get("runPolicy"), dict) else {}
        path, value = "spec.runPolicy.activeDeadlineSeconds", policy.get("activeDeadlineSeconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrialSpecError(f"spec.trialTemplate.trialSpec.{path}: {value!r}: expected a whole "
                             "number of seconds greater than 0")
    return path, value


def render_command_string(command: str, values: dict[str, str]) -> str:
    """--trial-command: substitute, shell-quoting each value."""
    def repl(m):
        if m.group(1) not in values:
            raise TrialSpecError(
                f"--trial-command uses ${{trialParameters.{m.group(1)}}}, which "
                f"spec.trialTemplate.trialParameters does not declare"
            )
        return shlex.quote(values[m.group(1)])

    return TRIAL_PARAM_RE.sub(repl, command)


def pod_specs(node: Any) -> list[dict]:
    """Every pod spec (a mapping with `containers`) inside a trialSpec."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            found.append(node)
        for v in node.values():
            found += pod_specs(v)
    elif isinstance(node, list):
        for v in node:
            found += pod_specs(v)
    return found


def chexflow_trainer(spec: dict) -> dict | None:
    """A TrainJob on chexflow's own ClusterTrainingRuntime (trainjob/horovod-runtime.yaml): its
    `spec.trainer` (command, args, env), which that runtime runs in the launcher's primary
    container as written (its `mpirun`, as an MPIJob launcher's). None for other kinds and
    runtimes, whose pods only their runtime knows."""
    from chexflow.jobs.trainjob import RUNTIME_NAME, TRAINJOB_GROUP

    inner = spec.get("spec") if isinstance(spec.get("spec"), dict) else {}
    ref = inner.get("runtimeRef") if isinstance(inner.get("runtimeRef"), dict) else {}
    trainer = inner.get("trainer")
    if (spec.get("kind") != "TrainJob" or ref.get("name") != RUNTIME_NAME
            or ref.get("kind", "ClusterTrainingRuntime") != "ClusterTrainingRuntime"
            or ref.get("apiGroup", TRAINJOB_GROUP) != TRAINJOB_GROUP
            or not isinstance(trainer, dict)
            or not (trainer.get("command") or trainer.get("args"))):
        return None
    return trainer


def primary_container(exp: Experiment, spec: dict) -> tuple[dict, list[dict]]:
    """The primary container and every pod spec of the trial (for their volumes). For a
    TrainJob on chexflow's runtime the container is its `spec.trainer` (chexflow_trainer) and
    the pods are its runtimePatches' (the data volumes)."""
    name = exp.trial_template.get("primaryContainerName")
    pods = pod_specs(spec.get("spec", {}))
    if (trainer := chexflow_trainer(spec)) is not None:
        return trainer, pods
    for pod in pods:
        for c in pod["containers"]:
            if c.get("name") == name:
                return c, pods
    raise TrialSpecError(
        f"spec.trialTemplate.primaryContainerName {name!r}: no container of that name in trialSpec"
    )


def volume_names(pods: list[dict]) -> list[str]:
    """The names of the volumes the trial's pods declare, sorted."""
    return sorted({str(v.get("name")) for pod in pods for v in pod.get("volumes") or []
                   if isinstance(v, dict) and v.get("name")})


def written_volumes(pods: list[dict]) -> set[str]:
    """The volumes some container mounts without `readOnly: true` (a trial may write there)."""
    return {str(m.get("name")) for pod in pods for c in pod.get("containers") or []
            for m in c.get("volumeMounts") or [] if not m.get("readOnly")}


def volume_mounts(
    pods: list[dict], volumes: dict[str, Path], default_root: Path, create: bool = True
) -> dict[str, Path]:
    """mountPath -> local folder: --volume NAME=DIR, else a hostPath volume's own path (the
    local runner runs on the host), else DEFAULT_ROOT/NAME (made when `create`)."""
    out: dict[str, Path] = {}
    for pod in pods:
        host_paths = {v.get("name"): v["hostPath"]["path"] for v in pod.get("volumes") or []
                      if isinstance(v, dict) and isinstance(v.get("hostPath"), dict)
                      and v["hostPath"].get("path")}
        for c in pod.get("containers", []):
            for m in c.get("volumeMounts") or []:
                vname, mpath = m.get("name"), m.get("mountPath")
                if not vname or not mpath or mpath in out:
                    continue
                local = volumes.get(vname) or host_paths.get(vname)
                if local is None:
                    local = default_root / vname
                    if create:
                        local.mkdir(parents=True, exist_ok=True)
                out[mpath.rstrip("/") or "/"] = Path(local).resolve()
    return out


def map_paths(argv: list[str], mounts: dict[str, Path]) -> list[str]:
    """Rewrite container paths under a volume mount (`/data/x`, `--out=/runs/t1`) to local ones."""
    def one(s: str) -> str:
        for mpath in sorted(mounts, key=len, reverse=True):
            if s == mpath or s.startswith(mpath + "/"):
                return str(mounts[mpath]) + s[len(mpath):]
        return s

    out = []
    for a in argv:
        if a.startswith("-") and "=" in a:
            flag, _, value = a.partition("=")
            out.append(f"{flag}={one(value)}")
        else:
            out.append(one(a))
    return out


def _whole_path(path: str, below: bool) -> str:
    """A regex for `path` as a whole path in a command line (`/katib`, `--out=/katib`), not part
    of another (`/katib-data/x`, `a/katib`); `below`: also where a path goes on below it
    (`/katib/x`)."""
    head = rf"(?<![\w./~-]){re.escape(path.rstrip('/') or '/')}"
    return head + (r"(?![\w.~-])" if below else r"/?(?![\w.~/-])")


PathMaps = list[tuple[str, "Path | str", bool]]  # (container path, local path, paths below too)


def _paths_regex(maps: PathMaps) -> re.Pattern:
    """One regex for every container path of `maps` as a whole path, the longest first, so
    that each place is rewritten once (group `pN` names the map)."""
    order = sorted(range(len(maps)), key=lambda i: -len(maps[i][0]))
    return re.compile("|".join(f"(?P<p{i}>{_whole_path(maps[i][0], maps[i][2])})"
                               for i in order))


def map_paths_in_word(word: str, maps: PathMaps) -> str:
    """Rewrite container paths in one argument run as it is (no shell reads it): where a path
    stands whole (`/katib`, `--out=/katib`, and with `below` `/katib/x`), not inside another
    (`/katib-data/x`, `a/katib`)."""
    if not maps:
        return word
    return _paths_regex(maps).sub(lambda m: str(maps[int(m.lastgroup[1:])][1]), word)


def map_paths_in_shell(script: str, maps: PathMaps) -> str:
    """Rewrite container paths in a shell script (`sh -c SCRIPT`, `--trial-command`), each local
    path quoted for the shell where the container path stands: unquoted, inside '...' or
    inside "..." (a local folder with a space or a quote stays one path)."""
    if not maps:
        return script
    contexts = _quote_contexts(script)

    def repl(m: re.Match) -> str:
        local = str(maps[int(m.lastgroup[1:])][1])
        quoted = shlex.quote(local)
        context = contexts[m.start()]
        if context == "'":
            return local if quoted == local else f"'{quoted}'"
        if context == '"':
            return re.sub(r'([\\"$`])', r"\\\1", local)
        return quoted

    return _paths_regex(maps).sub(repl, script)


def _quote_contexts(script: str) -> list[str]:
    """For each character of a POSIX shell script, the quotes it stands in: "'", '"' or ""
    (unquoted, also inside `$(...)` or backquotes within double quotes)."""
    stack, out, i = [""], [], 0
    while i < len(script):
        ch, top = script[i], stack[-1]
        out.append("'" if top == "'" else '"' if top == '"' else "")
        if top == "'":
            if ch == "'":
                stack.pop()
        elif ch == "\\" and i + 1 < len(script):
            out.append(out[-1])
            i += 1
        elif ch == "#" and top in ("", "(") and (i == 0 or script[i - 1] in " \t\n;&|()"):
            end = script.find("\n", i)  # a comment, to the end of its line
            end = len(script) if end == -1 else end
            out += [""] * (end - i - 1)
            i = end - 1
        elif top == '"' and ch == '"' or top == "`" and ch == "`" or top == "(" and ch == ")":
            stack.pop()
        elif ch == "`":
            stack.append("`")
        elif script.startswith("$(", i) or top == "(" and ch == "(":
            stack.append("(")
            if ch == "$":
                out.append(out[-1])
                i += 1
        elif top != '"' and ch in "'\"":
            stack.append(ch)
        i += 1
    return out


def map_paths_in_argv(argv: list[str], maps: PathMaps) -> list[str]:
    """map_paths_in_word on each argument, map_paths_in_shell on the script of a leading
    `sh -c` / `bash -c`."""
    shell = len(argv) >= 3 and os.path.basename(argv[0]) in ("sh", "bash") and argv[1] == "-c"
    return [map_paths_in_shell(a, maps) if shell and i == 2 else map_paths_in_word(a, maps)
            for i, a in enumerate(argv)]


def parent_named(folder: str, text: str) -> str:
    """The highest folder above `folder` (not `/`) that the command line `text` names as a
    whole path of its own, else `folder`. Katib's tf-mnist-with-summaries example gives its
    program `--log-path=/mnist-with-summaries-logs`, which writes the `test` and `train`
    folders in it, and has the TensorFlowEvent collector read `/mnist-with-summaries-logs/test`."""
    for parent in reversed(PurePosixPath(folder).parents[:-1]):  # the highest first
        if re.search(_whole_path(str(parent), below=False), text):
            return str(parent)
    return folder


TRIAL_ARG_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def parse_trial_args(items: list[str]) -> list[tuple[str, str]]:
    """--trial-arg NAME=VALUE items as (--NAME, VALUE); a malformed one is refused in one line
    (NAME: letters, digits, '_', '.', '-', as an option name; a VALUE to set)."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        name = name.lstrip("-")
        if not sep or not TRIAL_ARG_NAME_RE.fullmatch(name) or not value:
            raise TrialSpecError(f"--trial-arg {item!r}: expected NAME=VALUE (NAME an option "
                                 "name of letters, digits, '_', '.' and '-'; VALUE not empty), "
                                 "e.g. epochs=1")
        out.append(("--" + name, value))
    return out


def override_args(argv: list[str], overrides: list[str]) -> list[str]:
    """--trial-arg NAME=VALUE: set `--NAME VALUE` in the command (replaced, or appended)."""
    argv = list(argv)
    for flag, value in parse_trial_args(overrides):
        for i, a in enumerate(argv):
            if a == flag and i + 1 < len(argv):
                argv[i + 1] = value
                break
            if a.startswith(flag + "="):
                argv[i] = f"{flag}={value}"
                break
        else:
            argv += [flag, value]
    return argv


def split_mpirun(argv: list[str], where: str) -> tuple[int, list[str]]:
    """`mpirun -np N [options] PROGRAM ARGS` -> (N, PROGRAM ARGS)."""
    np_, i = None, 1
    while i < len(argv):
        a = argv[i]
        if a in MPI_NP and i + 1 < len(argv):
            try:
                np_ = int(argv[i + 1])
            except ValueError as e:
                raise TrialSpecError(f"{where}: mpirun {a} {argv[i + 1]!r} is not a number") from e
            i += 2
        elif a in MPI_TWO_VALUES:
            i += 3
        elif a in MPI_ONE_VALUE:
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            break
    if i >= len(argv):
        raise TrialSpecError(f"{where}: mpirun has no program to run")
    if np_ is None or np_ < 1:
        raise TrialSpecError(f"{where}: mpirun needs -np N (the number of workers)")
    return np_, argv[i:]


def mount_maps(exp: Experiment, spec: dict, volumes: dict[str, Path], default_root: Path,
               create: bool = True) -> PathMaps:
    """The trial's volume mounts as path maps (volume_mounts): each mountPath and what lies
    below it -> its local folder."""
    _, pods = primary_container(exp, spec)
    return [(path, local, True)
            for path, local in volume_mounts(pods, volumes, default_root, create).items()]


def local_command_parts(exp: Experiment, spec: dict, volumes: dict[str, Path],
                        default_root: Path, trial_args: list[str], create: bool = True,
                        map_mounts: bool = True) -> tuple[list[str], dict[str, str], int]:
    """The argv and extra environment a local trial runs for this rendered trialSpec, and how
    many leading words of the argv are chexflow's local stand-ins
    (horovodrun and its options, the trainer's python): `katib_wrap` quotes those only.
    `create`: make the default folders of volumes not given (not for a dry run); `map_mounts`
    False leaves the volumes' paths as in the container (to map them in the wrapped line)."""
    from chexflow.envs import trainer_python, with_chexflow_importable
    from chexflow.jobs.local import horovodrun_command

    container, _ = primary_container(exp, spec)
    where = f"spec.trialTemplate.trialSpec container {container.get('name')!r}"
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if not argv:
        raise TrialSpecError(f"{where}: has no command or args to run locally")
    argv = override_args(argv, trial_args)
    if map_mounts:
        argv = map_paths_in_argv(argv, mount_maps(exp, spec, volumes, default_root, create))
    env = {str(e["name"]): str(e["value"]) for e in container.get("env") or []
           if "name" in e and "value" in e}
    env["PYTHONPATH"] = with_chexflow_importable(os.environ)["PYTHONPATH"]
    ours = 0
    if os.path.basename(argv[0]) in MPI_LAUNCHERS:
        n, program = split_mpirun(argv, where)
        if os.path.basename(program[0]) in PYTHONS:
            program = [str(trainer_python()), *program[1:]]
            ours = 1
        argv = horovodrun_command(program, n)
        ours += len(argv) - len(program)
    elif os.path.basename(argv[0]) in PYTHONS:
        argv = [str(trainer_python()), *argv[1:]]
        ours = 1
    return argv, env, ours


def kube_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a container's command and args (the kubelet's
    third_party/forked/golang/expansion): `$(NAME)` -> NAME's value from the container's env
    (left as written when NAME is not there), `$$` -> `$`; any other `$` stays."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env.get(name, text[i:end + 1]))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def katib_wrap(argv: list[str], ours: int, kind: str, metrics_dir: str, env: dict[str, str],
               early_stopping: bool) -> list[str]:
    """Katib's wrapWorkerContainer for `kind` (StdOut, File, TensorFlowEvent): `sh -c` over
    command + args joined with spaces (the user's own leading `sh -c`/`bash -c` kept), StdOut's
    redirection, the early stopping test when the trial has stop rules, and the completion
    marker in metrics_dir (Katib's /var/log/katib or the File/TensorFlowEvent folder, as in the
    container: the runner maps it to the local one with the rest of the line); then Kubernetes'
    `$(VAR)`/`$$` expansion. The first `ours` words are
    chexflow's local stand-ins and are quoted; the user's words are joined as Katib joins them."""
    words = [shlex.quote(a) for a in argv[:ours]] + argv[ours:]
    command = ["sh", "-c"]
    if len(words) >= 2 and words[0] in ("sh", "bash") and words[1] == "-c":
        command, words = words[:2], words[2:]
    if kind == "StdOut":  # metricsFile: /var/log/katib/metrics.log
        words.append(f"1>{metrics_dir}/{os.path.basename(DEFAULT_FILE_PATH)} 2>&1")
    pid_file = f"{metrics_dir}/$$$$.pid"
    if early_stopping:
        words += ["||", f"if test -f {pid_file} && [ $(head -n 1 {metrics_dir}/$$.pid) = "
                  f"{TRAINING_EARLY_STOPPED} ]; then echo Training Container was Early Stopped; "
                  "else echo Training Container was Failed; exit 1; fi"]
    words += ["&&", f"echo {TRAINING_COMPLETED} > {pid_file}"]
    return [*command, kube_expand(" ".join(words), env)]


def quoting_note(container: dict, where: str) -> str | None:
    """One line when Katib's join would make the shell read the container's command + args
    differently from the words written: which argument, why, and how to write it."""
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if len(argv) >= 2 and argv[0] in ("sh", "bash") and argv[1] == "-c":
        if len(argv) > 3:
            return (f"{where}: the words after the {argv[0]} -c script ({argv[3]!r}...) become "
                    f"part of the script, not its $0 $1...: {QUOTING_WHY}; {QUOTING_HOW}")
        return None
    for i, a in enumerate(argv):
        if not a or any(ch in SHELL_SPECIAL for ch in a) or a[0] in "#~":
            shown = a if len(a) <= 60 else a[:57] + "..."
            return (f"{where}: word {i + 1} of command + args, {shown!r}, is read again by the "
                    f"shell on Katib: {QUOTING_WHY}; {QUOTING_HOW}")
    return None


def trailing_newline(exp: Experiment) -> tuple[str, str] | None:
    """(field, why) when Katib's wrapper breaks a primary container whose last word of command
    + args ends with a newline (a YAML block scalar `|` keeps one). Katib appends its own words
    to the joined line (wrapWorkerContainer): after that newline they are a command line of
    their own. StdOut: `1>/var/log/katib/metrics.log 2>&1` redirects an empty command, the
    trial's output goes to the pod log, the completion marker is written whatever the trial's
    exit code, and the trial ends MetricsUnavailable. File, TensorFlowEvent: sh stops at a line
    starting with `&&` (Syntax error) after the trial ran, and the trial Fails. Otherwise
    None."""
    kind = exp.collector.kind
    if kind not in WRAPPED_COLLECTORS or not exp.trial_spec:
        return None
    try:
        container, _ = primary_container(exp, exp.trial_spec)
    except TrialSpecError:
        return None  # no such container: refused elsewhere where it matters
    command, args = container.get("command") or [], container.get("args") or []
    field, words = ("args", args) if args else ("command", command)
    last = str(words[-1]) if words else ""
    if not last.rstrip(" \t").endswith("\n") or last.rstrip(" \t").endswith("\\\n"):
        return None
    where = (f"spec.trialTemplate.trialSpec container {container.get('name')!r}: "
             f"{field}[{len(words) - 1}]")
    if kind == "StdOut":
        what = ("its redirection `1>/var/log/katib/metrics.log 2>&1` becomes a line of its own, "
                "the trial's output is never collected and the trial ends MetricsUnavailable")
    else:
        what = ("its `&& echo completed > ...` becomes a line of its own, which sh refuses "
                "(Syntax error: \"&&\" unexpected) after the trial ran, and the trial fails")
    return where, (f"ends with a newline (a YAML block scalar `|` keeps one): Katib's metrics "
                   f"collector appends its words to the command after it, so {what}; write "
                   "`|-` to drop the final newline")
