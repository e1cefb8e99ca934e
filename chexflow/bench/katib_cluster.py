"""Per-trial overhead of the real Katib against the local runner, with the same trivial trials.

One Experiment YAML runs on both sides: `chexflow tune --cluster` on a local cluster with Katib
(`chexflow cluster up --katib`; its trials are batch Jobs on the real node, with Katib's StdOut
collector) and `chexflow tune --local`. Each trial appends `start T` and `end T` (the host's
clock: pods share it) to a log in the sweep's folder (in the pods a hostPath volume mounted at
the same path: Katib's collector runs the command as one `sh -c` string, so the script takes
no arguments, and a path inside it means the same file on both sides), sleeps TRIAL_SLEEP
seconds (Katib's collector must find the trial's process running) and prints its metric. Trials
run one at a time. From the log, per sweep: the time from `chexflow tune`'s start to the first
trial running, and the mean time from one trial's end to the next one's start.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from chexflow.bench.core import Result, Side, interleave
from chexflow.bench.real_pods import RealPodsError, cluster

NAME = "katib per-trial overhead"
KATIB_SIDE, LOCAL_SIDE = "real Katib (chexflow tune --cluster)", "local runner (--local)"
TRIAL_SLEEP = 3
# One group: Katib's StdOut collector appends its redirection to the whole `sh -c` string, which
# would reach only the last command of a list.
SCRIPT = ('( echo "start $(date +%s.%N)" >> {log}; sleep {sleep}; '
          'echo "score=${{trialParameters.x}}"; echo "end $(date +%s.%N)" >> {log} )')
# goals: what Katib adds to each figure over the local runner, in seconds
START_GOAL, GAP_GOAL = 30.0, 10.0


def experiment(name: str, trials: int, image: str, folder: Path) -> dict:
    """`trials` one-at-a-time trials of the trivial Job, its log volume a hostPath of
    `folder`."""
    return {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment", "metadata": {"name": name},
        "spec": {
            "objective": {"type": "maximize", "objectiveMetricName": "score"},
            "algorithm": {"algorithmName": "random"},
            "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
            "parallelTrialCount": 1, "maxTrialCount": trials, "maxFailedTrialCount": 1,
            "parameters": [{"name": "x", "parameterType": "double",
                            "feasibleSpace": {"min": "0", "max": "1"}}],
            "trialTemplate": {
                "primaryContainerName": "main",
                "trialParameters": [{"name": "x", "reference": "x"}],
                "trialSpec": {"apiVersion": "batch/v1", "kind": "Job", "spec": {
                    "backoffLimit": 0, "template": {"spec": {
                        "restartPolicy": "Never",
                        "volumes": [{"name": "times", "hostPath": {
                            "path": str(folder), "type": "Directory"}}],
                        "containers": [{
                            "name": "main", "image": image, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", SCRIPT.format(
                                sleep=TRIAL_SLEEP, log=folder / "trials.log")],
                            "volumeMounts": [{"name": "times",
                                              "mountPath": str(folder)}]}]}}}}}}}


def timings(log: Path, started: float, trials: int) -> tuple[float, float]:
    """(`chexflow tune`'s start to the first trial's start, mean end-to-next-start) in s."""
    marks = [line.split() for line in log.read_text().splitlines()]
    starts = [float(t) for kind, t in marks if kind == "start"]
    ends = [float(t) for kind, t in marks if kind == "end"]
    if len(starts) != trials or len(ends) != trials:
        raise RealPodsError(f"{log}: {len(starts)} trial starts and {len(ends)} ends, expected "
                            f"{trials} of each (did a trial fail?)")
    gaps = [b - a for a, b in zip(ends[:-1], starts[1:], strict=True)]
    return starts[0] - started, statistics.mean(gaps)


@contextmanager
def katib_namespace(api) -> Iterator[str]:
    """A namespace whose pods go to the real node, with Katib's collector injection label."""
    from kubernetes import client

    from chexflow.devcluster.katib import INJECTION_LABEL
    from chexflow.devcluster.realnode import namespace_annotations

    core = client.CoreV1Api(api)
    name = f"bench-katib-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name, "labels": INJECTION_LABEL,
                                        "annotations": namespace_annotations()}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


def sweep(work: Path, mode: list[str], trials: int, image: str,
          env: dict[str, str] | None = None) -> tuple[float, float]:
    """One `chexflow tune` sweep of the trivial trials; its timings."""
    run = Path(tempfile.mkdtemp(prefix="sweep-", dir=work))
    run.chmod(0o777)  # the trial pods' user writes the log
    name = f"overhead-{uuid.uuid4().hex[:6]}"
    spec = run / "experiment.yaml"
    spec.write_text(yaml.safe_dump(experiment(name, trials, image, run)))
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "chexflow.cli", "tune", str(spec), *mode,
                           "--state", str(run / "state"), "--no-progress"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RealPodsError(f"chexflow tune {' '.join(mode)}: exit {proc.returncode}: "
                            f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return timings(run / "trials.log", started, trials)


def run(work: Path, trials: int, repeats: int, kubeconfig: Path | None = None) -> list[Result]:
    """Both sides interleaved `repeats` times: two Results (start to the first trial; trial
    end to the next start), Katib minus local, each at most its goal."""
    from chexflow.devcluster.images import base_archive
    from chexflow.devcluster.realnode import RealNode

    work.mkdir(parents=True, exist_ok=True)
    first: dict[str, list[float]] = {KATIB_SIDE: [], LOCAL_SIDE: []}

    def side(name: str, mode: list[str], image: str, env: dict[str, str]) -> Side:
        def one() -> float:
            start, gap = sweep(work, mode, trials, image, env)
            first[name].append(start)
            return gap
        return Side(name, one)

    with cluster(work, kubeconfig, katib=True) as (api, state_dir, setup):
        base = base_archive()
        RealNode(state_dir).import_image(base.archive)
        with katib_namespace(api) as ns:
            env = {"KUBECONFIG": str(state_dir / "kubeconfig")}
            katib = side(KATIB_SIDE, ["--cluster", "--namespace", ns, "--poll-interval", "1"],
                         base.ref, env)
            local = side(LOCAL_SIDE, ["--local"], base.ref, {})
            interleave(NAME, [katib, local], repeats)
    notes = {"trials_per_sweep": trials, "trial_sleep_s": TRIAL_SLEEP, "algorithm": "random",
             "collector": "StdOut", "trial_kind": "batch Job", **setup}
    return [
        Result(f"{NAME}: start to first trial", "s", KATIB_SIDE, LOCAL_SIDE, first[KATIB_SIDE],
               first[LOCAL_SIDE], START_GOAL, notes, goal_is_max=True,
               figure_name="Katib - local (s)"),
        Result(f"{NAME}: trial end to next trial start", "s", KATIB_SIDE, LOCAL_SIDE,
               katib.samples, local.samples, GAP_GOAL, notes, goal_is_max=True,
               figure_name="Katib - local (s)"),
    ]
