"""The local Katib runner: suggestions, parallel trials, StdOut metrics, medianstop, end conditions.

It follows Katib's controllers: up to parallelTrialCount trials run at once and never more than
maxTrialCount in all; a trial whose job exits non-zero is Failed, one that exits 0 without its
objective metric is MetricsUnavailable, one stopped by medianstop is EarlyStopped. After every
trial event the state is saved. The experiment ends as Katib's does, checked in this order:
goal reached (Succeeded), Failed + MetricsUnavailable >= maxFailedTrialCount (Failed), completed
trials >= maxTrialCount (Succeeded), search space exhausted with no trial active (Succeeded); a
suggestion library that fails ends it Failed ("Suggestion has failed").

A trialSpec trial runs as Katib's pod webhook wraps it (trialspec.katib_wrap): command and args
joined without quoting under `sh -c`, StdOut's output sent to the collector's metrics.log.

Metrics: StdOut is parsed line by line while the trial runs (medianstop acts on it); File and
TensorFlowEvent are read when the trial's process ends, and with a stop rule the File is
followed while the trial runs, as Katib's collector does (Katib's TensorFlowEvent collector has
no early stopping). Where the collector's folder is locally: collectorpaths.

Deadlines: a trial past its job's activeDeadlineSeconds (trialspec.active_deadline) is stopped
and Failed as Katib records a job's DeadlineExceeded; past `timeout` the sweep stops its trials
(left Running, so a rerun resumes them) and raises SweepTimedOut.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.katib.earlystopping.medianstop import RuleChecker, StopRule, median_rule
from chexflow.katib.experiment.model import DEFAULT_FILE_PATH, Experiment
from chexflow.katib.experiment.spec import SpecError
from chexflow.katib.experiment.templates import not_found
from chexflow.katib.experiment.trialspec import (
    WRAPPED_COLLECTORS,
    TrialSpecError,
    active_deadline,
    chexflow_trainer,
    katib_wrap,
    local_command_parts,
    map_paths_in_argv,
    map_paths_in_shell,
    mount_maps,
    pod_specs,
    primary_container,
    primary_pod_mismatch,
    quoting_note,
    render_trial_spec,
)
from chexflow.katib.local.collectorpaths import TrialFolders
from chexflow.katib.local.metrics import (
    CollectorError,
    TextParser,
    objective_value,
    optimal_trial,
    parse_json_line,
    read_metrics_file,
    read_tfevents,
    unparsed_values,
)
from chexflow.katib.local.results import trial_line
from chexflow.katib.local.state import (
    COMPLETED,
    STATE_ENV,
    TRIAL_ENV,
    SweepState,
    TrialRecord,
    kill_leftover,
    now,
)
from chexflow.katib.suggestions.algorithms import CLUSTER_ONLY
from chexflow.katib.suggestions.base import History, SearchSpaceExhausted, SuggestionFailed
from chexflow.katib.suggestions.libraries import make_suggester
from chexflow.processes import die_with_parent, marked

NAME_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
KILL_GRACE_S = 10.0
KATIB_TRIAL_ENV = "KATIB_TRIAL_NAME"  # consts.EnvTrialName, set by Katib's pod webhook


class SweepInterrupted(ChexflowError):
    """The runner was interrupted; the state folder resumes the sweep."""


class SweepTimedOut(SweepInterrupted):
    """The sweep's --timeout passed; the state folder resumes it."""


# What Katib's trial controller records for a job that failed with the Job controller's
# DeadlineExceeded (trial_controller_util.go UpdateTrialStatusCondition, v0.19.0).
DEADLINE_REASON = "TrialFailed. Job reason: DeadlineExceeded"
DEADLINE_MESSAGE = "Trial has failed. Job message: Job was active longer than specified deadline"


LOCAL_COLLECTORS = ("StdOut", "File", "TensorFlowEvent")


def local_problems(exp: Experiment, trial_command: str | None) -> list[tuple[str, str]]:
    """What Katib runs but this local runner cannot, as (field, message)."""
    out = []
    if exp.algorithm in CLUSTER_ONLY:
        out.append(("spec.algorithm.algorithmName", f"{exp.algorithm} runs only on a cluster "
                    "(Katib's own suggestion service): use --cluster"))
    if exp.collector.kind not in LOCAL_COLLECTORS:
        out.append(("spec.metricsCollectorSpec.collector.kind", f"{exp.collector.kind}: the "
                    f"local runner collects {', '.join(LOCAL_COLLECTORS)}; use --cluster"))
    cm = exp.trial_template.get("configMap")
    if cm is not None and exp.config_map is None and trial_command is None:
        out.append(("spec.trialTemplate.configMap", f"{not_found(cm, exp.template_files)}, or "
                    "run with --trial-command or --cluster"))
    if exp.raw["spec"].get("nasConfig") is not None:
        out.append(("spec.nasConfig", "neural architecture search runs only on a cluster"))
    if trial_command is None and (why := controller_made_pods(exp)) is not None:
        out.append(("spec.trialTemplate.trialSpec", why))
    try:
        active_deadline(exp.trial_spec)
    except TrialSpecError as e:
        out.append(tuple(str(e).split(": ", 1)))
    return out


def controller_made_pods(exp: Experiment) -> str | None:
    """Why a trialSpec has no pod template to run here: its kind's controller makes the pods
    (an Argo Workflow's templates, a TrainJob's training runtime), so Katib finds the primary
    container only in the pods; None when the trialSpec holds pod templates, or is a TrainJob
    on chexflow's own runtime (its trainer command runs as an MPIJob launcher's does)."""
    spec = exp.trial_spec
    pods = pod_specs(spec.get("spec", {})) if spec else []
    if spec and chexflow_trainer(spec) is not None:  # chexflow's runtime: its mpirun, locally
        return None
    if spec and spec.get("kind") == "TrainJob":
        # runtimePatches' containers only patch the runtime's (trainer.command runs): pods of
        # their own only where a container states what to run
        pods = [p for p in pods if any(c.get("command") or c.get("args")
                                       for c in p["containers"])]
    if not spec or pods:
        return None
    return (f"kind {spec.get('kind')} ({spec.get('apiVersion')}) has no pod template: its "
            "controller makes the pods, so the local runner cannot run it; use --cluster, or "
            "--trial-command CMD")


def check_local(exp: Experiment, trial_command: str | None) -> None:
    """Refuse, in one line naming the fields, what the local runner cannot run."""
    problems = local_problems(exp, trial_command)
    if problems:
        head = f"{exp.source}: " if exp.source else ""
        raise SpecError(head + "; ".join(f"{path}: {msg}" for path, msg in problems))


def open_slots(exp: Experiment, trials: list[TrialRecord]) -> int:
    """How many new trials may start now: parallelTrialCount, never past maxTrialCount."""
    active = sum(t.active for t in trials)
    n = exp.parallel_trial_count - active
    if exp.max_trial_count is not None:
        completed = sum(t.status in COMPLETED for t in trials)
        n = min(n, exp.max_trial_count - completed - active)
    return n


def end_condition(exp: Experiment, trials: list[TrialRecord], exhausted: bool
                  ) -> tuple[str, str, str] | None:
    """(type, reason, message) when the experiment is over, in Katib's order of checks."""
    best = optimal_trial(exp, trials)
    if best is not None and exp.objective.goal_reached(objective_value(exp, best)):
        return ("Succeeded", "ExperimentGoalReached",
                "Experiment has succeeded because Objective goal has reached")
    failed = sum(t.status in ("Failed", "MetricsUnavailable") for t in trials)
    limit = exp.max_failed_trial_count
    if limit is not None and failed != 0 and failed >= limit:
        return ("Failed", "ExperimentFailed",
                "Experiment has failed because max failed count has reached")
    completed = sum(t.status in COMPLETED for t in trials)
    if exp.max_trial_count is not None and completed >= exp.max_trial_count:
        return ("Succeeded", "ExperimentMaxTrialsReached",
                "Experiment has succeeded because max trial count has reached")
    if exhausted and not any(t.active for t in trials):
        return ("Succeeded", "ExperimentSuggestionEndReached",
                "Experiment has succeeded because suggestion service has reached the end")
    return None


@dataclass
class _Running:
    rec: TrialRecord
    proc: subprocess.Popen
    checker: RuleChecker
    stop_requested: bool = False
    thread: threading.Thread | None = None
    tail: threading.Thread | None = None
    lines: list[str] = field(default_factory=list)
    stdout_file: Path | None = None  # StdOut wrapped as on Katib: the output goes to this file
    log_lock: threading.Lock = field(default_factory=threading.Lock)
    error_line: str = ""  # the last `PROG: error: ...` line: chexflow's own one-line reason
    deadline_timer: threading.Timer | None = None
    deadline_exceeded: bool = False
    unparsed: dict[str, str] = field(default_factory=dict)  # metric -> text that is no number


class LocalRunner:
    def __init__(self, exp: Experiment, state: SweepState, trial_command: str | None = None,
                 volumes: dict[str, Path] | None = None, trial_args: list[str] | None = None,
                 echo: Callable[[str], None] = print, progress: bool = True,
                 timeout: float | None = None, create: bool = True):
        self.exp = exp
        self.state = state
        self.trial_command = trial_command
        self.volumes = volumes or {}
        self.trial_args = trial_args or []
        self.echo = echo
        self.progress = progress
        self.folders = TrialFolders(exp, state.directory, trial_command, self.volumes,
                                    self.trial_args, create)
        self.timeout = timeout
        self.deadline: float | None = None  # time.monotonic() when the sweep must stop
        self.parser = TextParser(exp.objective.metric_names, exp.collector.formats)
        self.suggester = make_suggester(exp, state.seed, state.optuna_study_attrs)
        self.events: queue.Queue = queue.Queue()
        self.running: dict[str, _Running] = {}
        self.lock = threading.Lock()
        self.exhausted = False
        self.suggestion_failed: str | None = None
        self.bar = None
        self.no_collector = primary_pod_mismatch(exp)  # Katib would not collect: why

    # ---- trials -------------------------------------------------------------------------
    def history(self) -> list[History]:
        return [
            History(t.parameters, objective_value(self.exp, t), t.active, t.optuna_attrs)
            for t in self.state.trials
        ]

    def _new_name(self) -> str:
        taken = {t.name for t in self.state.trials}
        while True:
            suffix = "".join(secrets.choice(NAME_ALPHABET) for _ in range(8))
            name = f"{self.exp.name}-{suffix}"
            if name not in taken:
                return name

    def _rule(self) -> StopRule | None:
        logs = [t.logs.get(self.exp.objective.metric, []) for t in self.state.trials
                if t.status == "Succeeded"]
        return median_rule(self.exp, logs)

    def trial_dir(self, rec: TrialRecord) -> Path:
        return self.folders.trial_dir(rec)

    def collected_path(self, rec: TrialRecord) -> Path:
        return self.folders.collected(rec)

    def command_for(self, rec: TrialRecord) -> tuple[list[str] | str, dict[str, str]]:
        """argv (or a shell string for --trial-command) and extra environment. The collector's
        folder and the volumes' paths in the command become local folders; in a wrapped trial
        after Katib's wrapper has made it one `sh -c` line (its redirection and marker in the
        collector's folder too), so a path is rewritten wherever the shell reads it, quoted
        for its place."""
        maps = self.folders.path_maps(rec)
        if self.trial_command is not None:
            return map_paths_in_shell(self.folders.command_text(rec), maps), {}
        spec = render_trial_spec(self.exp, rec.name, rec.parameters)
        wrapped = (self.exp.collector.kind in WRAPPED_COLLECTORS and maps
                   and not self.no_collector)
        argv, env, ours = local_command_parts(self.exp, spec, self.volumes,
                                              self.state.directory / "volumes", self.trial_args,
                                              create=self.folders.create, map_mounts=not wrapped)
        if not wrapped:
            return map_paths_in_argv(argv, maps), env
        maps += mount_maps(self.exp, spec, self.volumes, self.state.directory / "volumes",
                           self.folders.create)
        container, _ = primary_container(self.exp, spec)
        kube_env = {str(e["name"]): str(e["value"]) for e in container.get("env") or []
                    if "name" in e and "value" in e}
        kube_env[KATIB_TRIAL_ENV] = rec.name
        *shell, script = katib_wrap(argv, ours, self.exp.collector.kind,
                                    self.folders.collector_folder(), kube_env,
                                    early_stopping=rec.rule is not None)
        return [*shell, map_paths_in_shell(script, maps)], env

    def stdout_file(self, rec: TrialRecord) -> Path | None:
        """Where a trialSpec trial's output goes under the StdOut collector: Katib's wrapper
        sends it to /var/log/katib/metrics.log (here the trial's collector folder), and the
        collector reads that file; None when the trial is not wrapped."""
        if (self.exp.collector.kind != "StdOut" or self.trial_command is not None
                or self.no_collector):
            return None
        return self.folders.paths(rec)[1] / os.path.basename(DEFAULT_FILE_PATH)

    def quoting_note(self, rec: TrialRecord) -> str | None:
        """The line saying why Katib's join breaks this trial's command, and how to fix it."""
        if self.trial_command is not None or self.exp.collector.kind not in WRAPPED_COLLECTORS:
            return None
        return trial_quoting_note(self.exp, rec.name, rec.parameters)

    def suggest(self, n: int) -> list[TrialRecord]:
        try:
            suggestions = self.suggester.suggest(self.history(), n)
        except SearchSpaceExhausted:
            self.exhausted = True
            return []
        except SuggestionFailed as e:
            self.suggestion_failed = str(e)
            return []
        self.state.optuna_study_attrs = self.suggester.study_attrs
        out = []
        for s in suggestions:
            rule = self._rule()
            rec = TrialRecord(
                name=self._new_name(), index=len(self.state.trials), parameters=s.parameters,
                rule=rule.to_dict() if rule else None, optuna_attrs=s.optuna_attrs,
            )
            self.state.trials.append(rec)
            out.append(rec)
        if not out:
            self.exhausted = True
        self._save()
        return out

    def _save(self) -> None:
        with self.lock:
            self.state.save()

    def launch(self, rec: TrialRecord) -> None:
        self.folders.empty_metrics(rec)
        cmd, extra_env = self.command_for(rec)
        env = {**os.environ, **extra_env, TRIAL_ENV: rec.name, STATE_ENV: self.state.marker,
               "CHEXFLOW_KATIB_EXPERIMENT": self.exp.name}
        if self.trial_command is None:  # Katib's webhook gives the primary container its name
            env[KATIB_TRIAL_ENV] = rec.name
        log = open(self.trial_dir(rec) / "stdout.log", "a", encoding="utf-8")  # noqa: SIM115
        shown = shown_command(cmd)
        log.write(f"--- {now()} attempt {rec.restarts + 1}: {shown}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                cmd, shell=isinstance(cmd, str), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1, env=env,
                start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL),
            )
        except OSError as e:  # on Katib the container does not start and the Job fails
            with log:
                self._not_started(rec, shown, f"cannot execute {e.filename or cmd[0]}: "
                                  f"{e.strerror or e}", log)
            return
        rec.status, rec.started = "Running", now()
        rec.command = [shown]
        rec.logs = {}
        rule = StopRule(**rec.rule) if rec.rule else None
        run = _Running(rec, proc, RuleChecker(rule, self.exp.objective.maximize),
                       stdout_file=self.stdout_file(rec))
        run.thread = threading.Thread(target=self._watch, args=(run, log), daemon=True)
        if run.stdout_file is not None or (
                rule is not None and self.exp.collector.kind == "File" and not self.no_collector):
            run.tail = threading.Thread(target=self._tail, args=(run, log), daemon=True)
        if (deadline := active_deadline(self.exp.trial_spec)) is not None:
            run.deadline_timer = threading.Timer(deadline[1], self._deadline_passed, (run,))
            run.deadline_timer.daemon = True
            run.deadline_timer.start()
        self.running[rec.name] = run
        self._save()
        if run.tail is not None:  # before the watcher, which joins it
            run.tail.start()
        run.thread.start()
        threading.Thread(target=self._end_with_main, args=(run,), daemon=True).start()

    def _not_started(self, rec: TrialRecord, shown: str, reason: str, log) -> None:
        """A trial whose program could not be executed: Failed with the reason (a rerun on the
        same state goes on from there)."""
        log.write(reason + "\n")
        rec.status, rec.started, rec.finished = "Failed", now(), now()
        rec.command, rec.logs, rec.message = [shown], {}, reason
        self._save()
        self._report(rec)

    def _watch(self, run: _Running, log) -> None:
        """Reader thread: log lines, collect metrics, apply the stop rule; report the exit."""
        with log:
            for line in run.proc.stdout:
                self._line(run, log, line)
                if (self.exp.collector.kind == "StdOut" and run.stdout_file is None
                        and not self.no_collector):
                    self._feed(run, self.parser.parse(line))
                    for name, shown in self.parser.unparsed(line):
                        run.unparsed.setdefault(name, shown)
            code = run.proc.wait()
            if run.tail is not None:
                run.tail.join()
        self.events.put(("exit", run.rec.name, code))

    @staticmethod
    def _line(run: _Running, log, line: str) -> None:
        """A line of the trial's output: into stdout.log, and kept for its failure message."""
        with run.log_lock:
            log.write(line)
            log.flush()
            run.lines = (run.lines + [line.rstrip()])[-5:]
            if ": error: " in line:
                run.error_line = line.strip()

    def _feed(self, run: _Running, found: list[tuple[str, float]]) -> None:
        """New metric reports of a running trial: record them, apply the stop rule."""
        if not found:
            return
        with self.lock:
            for name, value in found:
                run.rec.logs.setdefault(name, []).append(value)
                if not run.stop_requested and run.checker.report(name, value):
                    run.stop_requested = True
                    self._terminate(run)
        self.events.put(("metrics", run.rec.name))

    def _tail(self, run: _Running, log) -> None:
        """Follow the metrics file while the trial runs, as Katib's collector does (the whole
        file is read again when the trial ends): File with a stop rule, and StdOut, whose
        output Katib's wrapper sends to the file (its lines go into stdout.log too)."""
        stdout, c = run.stdout_file is not None, self.exp.collector
        path = run.stdout_file or self.collected_path(run.rec)
        names, pos, partial = self.exp.objective.metric_names, 0, ""
        while True:
            alive = run.proc.poll() is None
            with contextlib.suppress(FileNotFoundError), open(path, errors="replace") as f:
                f.seek(pos)
                lines = (partial + f.read()).split("\n")
                pos, partial = f.tell(), lines.pop()
                if not alive and partial:
                    lines.append(partial)
                for line in lines:
                    if stdout:
                        self._line(run, log, line + "\n")
                    with contextlib.suppress(ValueError):
                        self._feed(run, self.parser.parse(line) if stdout or c.file_format == "TEXT"
                                   else parse_json_line(line, names))
            if not alive:
                return
            time.sleep(0.2)

    def _deadline_passed(self, run: _Running) -> None:
        """The job's activeDeadlineSeconds passed: stop it, as the Job controller does."""
        with self.lock:
            if run.proc.poll() is None and not run.stop_requested:
                run.deadline_exceeded = True
                self._terminate(run)

    @staticmethod
    def _signal(run: _Running, sig: int) -> None:
        """`sig` to the trial's process group and to its processes outside it (a `setsid`
        child, horovodrun's workers), which their environment names."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, sig)
        for pid in marked(TRIAL_ENV, run.rec.name):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _end_with_main(self, run: _Running) -> None:
        """When the trial's main process ends, the rest of the trial ends too, as a pod's
        processes end with its container (a child left holding the output would keep the
        trial from ever being reported). A child caught in its exec shows no environment for
        a moment, so the search repeats while the trial's output is still held open."""
        run.proc.wait()
        while (not (found := marked(TRIAL_ENV, run.rec.name)) and run.thread is not None
               and run.thread.is_alive()):
            run.thread.join(0.2)
        if found or marked(TRIAL_ENV, run.rec.name):
            self._terminate(run)

    def _terminate(self, run: _Running) -> None:
        self._signal(run, signal.SIGTERM)

        def force():
            if run.proc.poll() is None or marked(TRIAL_ENV, run.rec.name):
                self._signal(run, signal.SIGKILL)

        timer = threading.Timer(KILL_GRACE_S, force)
        timer.daemon = True
        timer.start()

    def _finish(self, name: str, code: int) -> None:
        run = self.running.pop(name)
        if run.deadline_timer is not None:
            run.deadline_timer.cancel()
        rec = run.rec
        rec.exit_code, rec.finished = code, now()
        if run.deadline_exceeded:
            rec.status, rec.reason, rec.message = "Failed", DEADLINE_REASON, DEADLINE_MESSAGE
        elif run.stop_requested:
            rule = run.checker.rule
            rec.status = "EarlyStopped"
            rec.message = (f"best {rule.metric}={run.checker.best:.6g} is "
                           f"{rule.comparison} than the rule value {rule.value:.6g}")
        elif code != 0:
            rec.status = "Failed"
            tail = run.error_line or " | ".join(x for x in run.lines if x)[-300:]
            rec.message = f"exit code {code}" + (f": {tail}" if tail else "")
            if (note := self.quoting_note(rec)) is not None:
                rec.message += f" ({note})"
        elif (error := self._collect(rec)) is not None:
            rec.status, rec.message = "Failed", f"metrics collector: {error}"
        elif self.exp.objective.metric not in rec.logs:
            rec.status = "MetricsUnavailable"
            rec.message = self.no_collector or self._unavailable(run)
        else:
            rec.status = "Succeeded"
        self._save()
        self._report(rec)

    def _unavailable(self, run: _Running) -> str:
        """Why the objective metric has no value: never printed, or printed as something that
        is no number the collector reads (`loss=nan`: Katib's metricsFormat reads an empty
        value there, which its controller cannot parse as a number either)."""
        metric, c = self.exp.objective.metric, self.exp.collector
        printed = dict(run.unparsed)
        path = self.stdout_file(run.rec) or (self.collected_path(run.rec)
                                             if c.kind == "File" and c.file_format == "TEXT"
                                             else None)
        if path is not None:
            printed.update(unparsed_values(path, self.exp.objective.metric_names, c.formats))
        if metric in printed:
            return (f"objective metric {metric} was printed as {printed[metric]!r}, not a "
                    "number Katib's metrics collector can parse")
        return f"objective metric {metric} was never reported"

    def _collect(self, rec: TrialRecord) -> str | None:
        """Read a File/TensorFlowEvent collector's metrics into rec.logs; the error, if any."""
        c, names = self.exp.collector, self.exp.objective.metric_names
        if self.no_collector:
            return None
        try:
            if c.kind == "StdOut" and (path := self.stdout_file(rec)) is not None:
                rec.logs = (read_metrics_file(path, names, "TEXT", c.formats)
                            if path.exists() else {})
            elif c.kind == "File":
                rec.logs = read_metrics_file(self.collected_path(rec), names, c.file_format,
                                             c.formats)
            elif c.kind == "TensorFlowEvent":
                rec.logs = read_tfevents(self.collected_path(rec), names)
        except CollectorError as e:
            return str(e)
        return None

    def _report(self, rec: TrialRecord) -> None:
        line = trial_line(self.exp, rec)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.write(line)
        else:
            self.echo(line)

    # ---- the sweep ----------------------------------------------------------------------
    def recover(self) -> None:
        """Trials a dead runner left Created/Running: kill leftovers, run them again."""
        for rec in self.state.trials:
            if rec.active:
                killed = kill_leftover(rec)
                if rec.status == "Running":
                    rec.restarts += 1
                    self.echo(f"trial {rec.name} was interrupted; running it again"
                              + (f" (stopped {killed} leftover processes)" if killed else ""))
                rec.status, rec.logs = "Created", {}
        self._save()

    def run(self) -> dict:
        """Run the sweep to an end condition; returns that condition."""
        from tqdm import tqdm

        st = self.state
        if st.finished_condition:
            return st.finished_condition
        self.recover()
        if not st.conditions:
            st.condition("Created", "True", "ExperimentCreated", "Experiment is created")
        st.condition("Running", "True", "ExperimentRunning", "Experiment is running")
        self._save()
        done = sum(t.status in COMPLETED for t in st.trials)
        if self.progress:
            self.bar = tqdm(total=self.exp.max_trial_count, initial=done, unit="trial",
                            desc=self.exp.name, leave=False)
        if self.timeout is not None:
            self.deadline = time.monotonic() + self.timeout
        previous = signal.signal(signal.SIGTERM, self._sigterm)
        try:
            cond = self._loop()
        except BaseException:
            self._stop_all(final=False)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            if self.bar is not None:
                self.bar.close()
        self._stop_all(final=True)
        st.condition("Running", "False", cond[1], cond[2])
        st.condition(cond[0], "True", cond[1], cond[2])
        self._save()
        return st.finished_condition

    def _sigterm(self, signum, _frame) -> None:
        raise SweepInterrupted(f"terminated; resume with the same command (state: "
                               f"{self.state.directory})")

    def _loop(self) -> tuple[str, str, str]:
        exp, st = self.exp, self.state
        while True:
            cond = end_condition(exp, st.trials, self.exhausted)
            if cond:
                return cond
            if self.suggestion_failed:
                return ("Failed", "ExperimentFailed",
                        f"Suggestion has failed: {self.suggestion_failed}")
            for rec in [t for t in st.trials if t.status == "Created"]:
                if len(self.running) >= exp.parallel_trial_count:
                    break
                self.launch(rec)
            n = open_slots(exp, st.trials)
            if n > 0 and not self.exhausted and not self.suggestion_failed:
                for rec in self.suggest(n):
                    self.launch(rec)
                continue
            if not self.running:
                if self.exhausted or self.suggestion_failed or end_condition(exp, st.trials,
                                                                             self.exhausted):
                    continue  # (a trial that could not start may have ended the experiment)
                raise ChexflowError(f"experiment {exp.name}: no trial to run and no end condition")
            self._wait_event()

    def _next_event(self) -> tuple:
        """The next trial event; SweepTimedOut once the sweep's deadline has passed."""
        if self.deadline is None:
            return self.events.get()
        try:
            if time.monotonic() >= self.deadline:
                raise queue.Empty
            return self.events.get(timeout=self.deadline - time.monotonic())
        except queue.Empty:
            n = len(self.running)
            raise SweepTimedOut(
                f"experiment {self.exp.name}: --timeout {self.timeout:g}s passed; {n} running "
                f"trial{'s' if n != 1 else ''} stopped; resume with the same command (state: "
                f"{self.state.directory})") from None

    def _wait_event(self) -> None:
        event = self._next_event()
        while True:
            if event[0] == "exit":
                run = self.running.get(event[1])
                if run is not None and run.thread is not None:
                    run.thread.join()
                self._finish(event[1], event[2])
            self._save()
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _stop_all(self, final: bool) -> None:
        """Stop running trials: at the end they are Killed; on interruption they stay Running."""
        for run in list(self.running.values()):
            self._signal(run, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        for run in list(self.running.values()):
            try:
                run.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(run, signal.SIGKILL)
                run.proc.wait()
            if marked(TRIAL_ENV, run.rec.name):
                self._signal(run, signal.SIGKILL)
            if run.thread is not None:
                run.thread.join(timeout=5)
            if run.deadline_timer is not None:
                run.deadline_timer.cancel()
            if final:
                rec = run.rec
                rec.status, rec.finished = "Killed", now()
                rec.message = "the experiment ended while the trial was running"
                rec.exit_code = run.proc.returncode
        if final:
            self.running.clear()
            with contextlib.suppress(queue.Empty):
                while True:
                    self.events.get_nowait()
        self._save()


def dry_run(exp: Experiment, state: SweepState, trial_command: str | None,
            volumes: dict[str, Path], trial_args: list[str]) -> list[dict[str, Any]]:
    """The next suggestions and the commands their trials would run (as a run records them),
    without running, saving or making anything."""
    runner = LocalRunner(exp, state, trial_command, volumes, trial_args, progress=False,
                         create=False)
    n = open_slots(exp, state.trials)
    if n <= 0 or state.finished_condition:
        return []
    try:
        suggestions = runner.suggester.suggest(runner.history(), n)
    except SearchSpaceExhausted:
        return []
    except SuggestionFailed as e:
        raise ChexflowError(f"experiment {exp.name}: Suggestion has failed: {e}") from e
    out = []
    for i, s in enumerate(suggestions):
        rule = runner._rule()
        rec = TrialRecord(name=f"{exp.name}-next{i + 1}", index=len(state.trials) + i,
                          parameters=s.parameters, rule=rule.to_dict() if rule else None)
        entry = {"trial": rec.name, "parameters": s.parameters,
                 "command": shown_command(runner.command_for(rec)[0])}
        if (note := runner.quoting_note(rec)) is not None:
            entry["note"] = note
        out.append(entry)
    return out


def shown_command(cmd: list[str] | str) -> str:
    """A trial's command as one line, as a shell reads it: what the run records (state.json,
    stdout.log) and a dry run prints."""
    return cmd if isinstance(cmd, str) else shlex.join(cmd)


def template_quoting_note(exp: Experiment) -> str | None:
    """trial_quoting_note for a sample trial (each parameter at its first value), for
    `--cluster`: said before Katib runs the trials; None for other collectors or a ConfigMap
    template."""
    if exp.collector.kind not in WRAPPED_COLLECTORS or not exp.trial_spec:
        return None
    sample = {p.name: (p.values[0] if p.values else p.min) for p in exp.parameters}
    try:
        return trial_quoting_note(exp, f"{exp.name}-trial", sample)
    except ChexflowError:
        return None


def trial_quoting_note(exp: Experiment, trial: str, parameters: dict[str, Any]) -> str | None:
    """quoting_note for the primary container of this trial's rendered trialSpec."""
    spec = render_trial_spec(exp, trial, parameters)
    container, _ = primary_container(exp, spec)
    return quoting_note(container, f"spec.trialTemplate.trialSpec container "
                                   f"{container.get('name')!r}")
