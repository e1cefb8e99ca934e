"""`chexflow tune SPEC.yaml [--local|--cluster] [--dry-run] [--trial-command CMD] [--state DIR]`
and `chexflow katib-suggestion|katib-earlystopping` (Katib's gRPC services, run by Katib)."""

from __future__ import annotations

import argparse
import json
import re
import secrets
from pathlib import Path

from chexflow.errors import ChexflowError
from chexflow.katib.local.results import table_text
from chexflow.limits import check_range


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="run a Katib Experiment YAML: locally (trials as local jobs) or on a cluster",
        description="Run a Katib Experiment (kubeflow.org/v1beta1) locally with the suggestion "
        "libraries Katib uses, or create it on a cluster and wait for it.",
    )
    p.add_argument("spec", type=Path, help="Experiment YAML")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="run trials here (default)")
    where.add_argument("--cluster", action="store_true",
                       help="create the Experiment with the Kubernetes client and wait for it")
    p.add_argument("--dry-run", action="store_true",
                   help="print the next suggestions (--cluster: server-side dry run) and stop")
    p.add_argument("--trial-command", metavar="CMD",
                   help="local runs only: shell command run for each trial instead of the "
                   "trialSpec's container; ${trialParameters.NAME} is substituted")
    p.add_argument("--trial-templates", type=Path, metavar="FILE",
                   help="the ConfigMap YAML of a spec's trialTemplate.configMap (default: "
                   "trial-templates.yaml beside the spec or in the folder above it)")
    p.add_argument("--state", type=Path,
                   help="sweep state and results folder (default: runs/tune/EXPERIMENT); "
                   "rerun with the same folder to resume (--cluster: the results folder)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="change the spec, e.g. spec.maxTrialCount=4 (repeatable)")
    p.add_argument("--trial-arg", dest="trial_args", action="append", default=[],
                   metavar="NAME=VALUE",
                   help="set --NAME VALUE in the trial container's command (repeatable; "
                   "--cluster: in the trialSpec's primary container)")
    p.add_argument("--volume", dest="volumes", action="append", default=[],
                   metavar="NAME=DIR|PVC",
                   help="the trialSpec volume NAME: locally a folder (default: "
                   "STATE/volumes/NAME); with --cluster a PersistentVolumeClaim, which replaces "
                   "the volume's source in every trial pod (repeatable)")
    p.add_argument("--namespace", help="--cluster: namespace (default: the spec's, else the "
                   "kubeconfig context's, as kubectl's)")
    p.add_argument("--update-templates", action="store_true",
                   help="--cluster: replace the spec's ConfigMap trial template on the cluster "
                   "with the repository's when they differ (refused otherwise, with the diff)")
    # numbers are read by _check_flags (one line for a bad one, as for every tune flag)
    p.add_argument("--timeout", default=24 * 3600,
                   help="seconds to wait for the end: then --cluster deletes the Experiment; "
                   "locally the running trials are stopped and a rerun resumes them")
    p.add_argument("--poll-interval", default=15.0,
                   help="--cluster: seconds between looks at the Experiment and its Trials")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (--cluster has none: one line per change)")
    p.set_defaults(func=run_tune)

    for command, service, port, what in (
            ("katib-suggestion", "Suggestion", 6789,
             "Katib's Suggestion service for grid, multivariate-tpe and bayesianoptimization, "
             "with the suggesters `chexflow tune --local` uses"),
            ("katib-earlystopping", "EarlyStopping", 6788,
             "Katib's EarlyStopping service for medianstop, with the rule `chexflow tune "
             "--local` uses")):
        s = sub.add_parser(command, help=f"serve {what.split(',')[0]} (run by Katib)",
                           description=f"{what} (api.v1.beta1.{service}, grpc.health.v1); "
                           "Katib starts it for each Experiment that katib-config maps to it.")
        s.add_argument("--address", default=f"0.0.0.0:{port}", help="host:port to listen on")
        s.set_defaults(func=run_katib_service, service=service)


MAX_WAIT_S = 10**9  # --timeout, --poll-interval: far below what a thread's wait takes
NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # RFC 1123 label


def _check_flags(args: argparse.Namespace) -> None:
    """Every flag's form and range, before the spec is read or anything runs: one line naming
    the flag and what it takes. (What needs the spec, --volume's names and the default --state,
    is checked once the spec is read, still before any trial.)"""
    from chexflow.folders import check_writable_folder
    from chexflow.katib.experiment.trialspec import parse_trial_args

    args.timeout = _seconds("--timeout", args.timeout)
    args.poll_interval = _seconds("--poll-interval", args.poll_interval)
    parse_trial_args(args.trial_args)
    if not args.cluster:
        if args.namespace is not None:
            raise ChexflowError("--namespace: applies to --cluster only (a local sweep has none)")
        if args.update_templates:
            raise ChexflowError("--update-templates: applies to --cluster only (a local sweep "
                                "reads the templates from the repository)")
        _volume_items(args.volumes)
    elif args.namespace is not None and (not NAMESPACE_RE.fullmatch(args.namespace)
                                         or len(args.namespace) > 63):
        raise ChexflowError(f"--namespace {args.namespace!r}: not a namespace name (lower case "
                            "letters, digits and '-', at most 63)")
    if args.state is not None:
        check_writable_folder(args.state, f"--state {args.state}")


def _seconds(flag: str, value: str | float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ChexflowError(f"{flag} {value!r}: expected a number of seconds in "
                            f"(0, {MAX_WAIT_S}]") from None
    check_range(flag, seconds, 0, MAX_WAIT_S, above=True, hint=" seconds")
    return seconds


def _volume_items(items: list[str]) -> dict[str, Path]:
    """--volume NAME=DIR items, locally: NAME -> DIR."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ChexflowError(f"--volume {item!r}: expected NAME=DIR (a trialSpec volume and "
                                "the local folder it is)")
        if name in out:
            raise ChexflowError(f"--volume {item}: volume {name!r} given twice")
        out[name] = Path(path)
    return out


def _local_volumes(exp, items: list[str]) -> dict[str, Path]:
    """--volume NAME=DIR, locally: NAME a volume of the trialSpec (as --cluster asks), DIR a
    folder, one the trial can write when it mounts NAME without readOnly."""
    from chexflow.folders import check_writable_folder
    from chexflow.katib.experiment.trialspec import pod_specs, volume_names, written_volumes

    pods = pod_specs(exp.trial_spec.get("spec", {})) if exp.trial_spec else []
    have, written = volume_names(pods), written_volumes(pods)
    head = f"{exp.source}: " if exp.source else ""
    out = {}
    for name, path in _volume_items(items).items():
        item = f"--volume {name}={path}"
        if name not in have:
            raise ChexflowError(f"{head}{item}: spec.trialTemplate.trialSpec has no volume "
                                f"{name!r} (its volumes: {', '.join(have) or 'none'})")
        if not path.is_dir():
            raise ChexflowError(f"{item}: {path} is not a folder")
        if name in written:
            check_writable_folder(path, item)
        out[name] = path.resolve()
    return out


def run_tune(args: argparse.Namespace) -> int:
    _check_flags(args)
    local = not args.cluster and not args.dry_run
    # a local run's reaper starts first: however this run ends, even by SIGKILL while it reads
    # its spec, a dead run's leftover trial processes on the same state folder are stopped
    reaper = _reaper(args.state) if local and args.state is not None else None
    try:
        from chexflow.folders import check_writable_folder
        from chexflow.katib.experiment.spec import load_experiment

        exp = load_experiment(args.spec, args.overrides, args.trial_templates)
        state_dir = args.state or Path("runs") / "tune" / exp.name
        if args.state is None:
            check_writable_folder(state_dir, f"the state folder {state_dir} (--state)")
        if args.cluster:
            return _run_cluster(args, exp, state_dir)
        if local and reaper is None:
            reaper = _reaper(state_dir)
        return _run_local(args, exp, state_dir, reaper)
    finally:
        if reaper is not None:
            from chexflow.processes import end_reaper

            end_reaper(reaper)


def _reaper(state_dir: Path):
    """The reaper of a local sweep's trial processes (chexflow.processes)."""
    from chexflow.katib.local.state import LOCK_FILE, STATE_ENV
    from chexflow.processes import start_reaper

    state_dir = state_dir.resolve()  # SweepState.marker
    return start_reaper(STATE_ENV, str(state_dir), lock=state_dir / LOCK_FILE)


def run_katib_service(args: argparse.Namespace) -> int:
    import logging

    from chexflow.katib.services.server import API, server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    srv, port = server(args.service, args.address)
    print(f"serving {API}.{args.service} on port {port}", flush=True)
    srv.wait_for_termination()
    return 0


def _run_cluster(args: argparse.Namespace, exp, state_dir: Path) -> int:
    from chexflow.katib.cluster.kubernetes import (
        cluster_experiment,
        current_namespace,
        parse_claims,
        run_on_cluster,
    )
    from chexflow.katib.local.runner import template_quoting_note

    if args.trial_command is not None:
        raise ChexflowError("--trial-command: runs trials as local shell commands; on a cluster "
                            "Katib runs the trialSpec (change its command with --trial-arg)")
    claims = parse_claims(args.volumes)
    # as `kubectl apply -f`: --namespace, else the spec's, else the context's
    namespace = args.namespace or exp.raw.get("metadata", {}).get("namespace") or \
        current_namespace()
    sent = cluster_experiment(exp, namespace, args.trial_args, claims)
    if exp.config_map is not None and sent.config_map is None:
        print(f"spec.trialTemplate: the template of {exp.config_map.where} sent inlined as "
              "trialSpec (--trial-arg/--volume change it; the ConfigMap stays as it is)")
    exp = sent
    note = template_quoting_note(exp)
    if note is not None:
        print(f"note: {note}")
    summary = run_on_cluster(exp, state_dir, args.timeout, args.poll_interval, args.dry_run,
                             update_templates=args.update_templates)
    if not summary:
        return 0
    print(table_text(_rows_for_print(summary)))
    cond = summary["condition"]
    print(f"experiment {exp.name}: {cond.get('type')} ({cond.get('reason')}: "
          f"{cond.get('message')})")
    if summary["optimal"]:
        print("optimal trial: " + json.dumps(summary["optimal"]))
    print(f"results: {state_dir}/results.{{json,csv,html}}, optimal.json, objective.png")
    return 0 if cond.get("type") == "Succeeded" else 1


def _run_local(args: argparse.Namespace, exp, state_dir: Path, reaper) -> int:
    from chexflow.katib.local.results import write_results
    from chexflow.katib.local.runner import LocalRunner, check_local, dry_run
    from chexflow.katib.local.state import open_state
    from chexflow.katib.suggestions.algorithms import LIBRARY
    from chexflow.processes import reaper_owns

    check_local(exp, args.trial_command)
    volumes = _local_volumes(exp, args.volumes)
    state = open_state(state_dir, exp.name, exp.fingerprint(), exp.raw, args.trial_command,
                       seed=secrets.randbelow(2**31 - 1), create=not args.dry_run)
    if args.dry_run:
        nxt = dry_run(exp, state, args.trial_command, volumes, args.trial_args)
        print(f"experiment {exp.name}: {exp.algorithm} via {LIBRARY[exp.algorithm]}; "
              f"{len(state.trials)} trials so far; next {len(nxt)}:")
        notes = {s.pop("note") for s in nxt if "note" in s}
        for note in sorted(notes):
            print(f"note: {note}")
        for s in nxt:
            print(json.dumps(s))
        return 0
    state.lock()
    reaper_owns(reaper)  # however this process ends, even by SIGKILL, no trial outlives it
    print(f"experiment {exp.name}: {exp.algorithm} via {LIBRARY[exp.algorithm]}, "
          f"{exp.parallel_trial_count} in parallel, state in {state_dir}", flush=True)
    runner = LocalRunner(exp, state, args.trial_command, volumes, args.trial_args,
                         progress=not args.no_progress, timeout=args.timeout)
    cond = runner.run()
    summary = write_results(exp, state.directory, state.trials, state.conditions)
    print(table_text(_rows_for_print(summary)))
    print(f"experiment {exp.name}: {cond['type']} ({cond['reason']}: {cond['message']})")
    if summary["optimal"]:
        print("optimal trial: " + json.dumps(summary["optimal"]))
    print(f"results: {state_dir}/results.{{json,csv,html}}, optimal.json, objective.png")
    return 0 if cond["type"] == "Succeeded" else 1


def _rows_for_print(summary: dict) -> list[dict]:
    drop = {"message", "observation", "metric_logs", "started", "finished"}
    return [{k: v for k, v in t.items() if k not in drop} for t in summary["trials"]]
