"""Issue 29 on the real Katib (v0.19.0, on the local cluster's real node): the Experiment whose
`python -c` program is one argument with spaces and parentheses fails there as it fails
locally (Katib's wrapper joins command and args without quoting under `sh -c`), and `chexflow
tune --cluster` reports each failed attempt of the running trial within one poll, with the
shell's error from the pod's log; the `sh -c` quoted variant succeeds on Katib too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from chexflow.envs import REPO_ROOT
from tests.katib_wrap_specs import SH_SYNTAX_ERROR, issue_experiment

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.slow]

CHEXFLOW = [sys.executable, "-m", "chexflow.cli"]
POLL = 3.0
ATTEMPT = re.compile(r"^trial (\S+): attempt (\d+) failed in pod (\S+) \(exit code 2: Error"
                     r"(?:, now \w+)?\): (.*)$")


def _spec(tmp_path: Path, name: str, image: str, quoted: bool, backoff_limit: int) -> Path:
    spec = issue_experiment(name, quoted, image=image, backoff_limit=backoff_limit, max_trials=1)
    container = spec["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"][
        "containers"][0]
    container["imagePullPolicy"] = "Never"  # the launcher image imported into the node
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _tune(cluster, spec: Path, namespace: str, state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*CHEXFLOW, "tune", str(spec), "--cluster", "--namespace", namespace, "--state",
         str(state), "--poll-interval", str(POLL), "--timeout", "600"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})


def test_the_issue_experiment_fails_on_katib_and_each_attempt_is_reported_within_a_poll(
        katib_cluster, katib_namespace, katib_launcher_image, tmp_path):
    from kubernetes import client

    name = f"quoting-{katib_namespace[-5:]}"
    spec = _spec(tmp_path, name, katib_launcher_image, quoted=False, backoff_limit=2)
    proc = _tune(katib_cluster, spec, katib_namespace, tmp_path / "state")
    lines: list[tuple[float, str]] = []  # (when it was printed, line)

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    core = client.CoreV1Api(katib_cluster.api_client())
    failed_at: dict[str, float] = {}  # pod -> when this test first saw it Failed
    deadline = time.monotonic() + 720
    while proc.poll() is None and time.monotonic() < deadline:
        for pod in core.list_namespaced_pod(
                katib_namespace, label_selector=f"katib.kubeflow.org/experiment={name}").items:
            if pod.status and pod.status.phase == "Failed":
                failed_at.setdefault(pod.metadata.name, time.time())
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    reader.join(timeout=10)
    out = "\n".join(line for _, line in lines)
    assert proc.returncode == 1, out + proc.stderr
    attempts = [(when, m) for when, line in lines if (m := ATTEMPT.match(line))]
    assert attempts, out
    # one line per failed attempt, numbered in order, each with the shell's own error
    assert [int(m.group(2)) for _, m in attempts] == list(range(1, len(attempts) + 1)), out
    assert len({m.group(3) for _, m in attempts}) == len(attempts), out
    assert all(m.group(4) == SH_SYNTAX_ERROR for _, m in attempts), out
    # the first attempt is reported within one poll of its pod's failure (+ API latency)
    when, first = attempts[0]
    assert first.group(3) in failed_at, (failed_at, out)
    assert when - failed_at[first.group(3)] <= POLL + 3, (when, failed_at, out)
    # then the trial ends Failed, as Katib counts it
    results = json.loads((tmp_path / "state" / "results.json").read_text())
    (row,) = results["trials"]
    assert row["status"] == "Failed" and results["condition"]["type"] == "Failed", out
    at = next(i for i, (_, line) in enumerate(lines) if line.startswith(f"trial {row['trial']} "
                                                                         "Failed"))
    assert at > next(i for i, (_, line) in enumerate(lines) if ATTEMPT.match(line)), out


def test_the_quoted_variant_succeeds_on_katib(katib_cluster, katib_namespace,
                                              katib_launcher_image, tmp_path):
    name = f"quoted-{katib_namespace[-5:]}"
    spec = _spec(tmp_path, name, katib_launcher_image, quoted=True, backoff_limit=0)
    proc = _tune(katib_cluster, spec, katib_namespace, tmp_path / "state")
    out, err = proc.communicate(timeout=720)
    assert proc.returncode == 0, out + err
    results = json.loads((tmp_path / "state" / "results.json").read_text())
    (row,) = results["trials"]
    assert row["status"] == "Succeeded", out
    assert row["loss"] == pytest.approx(float(row["x"]) ** 2, abs=1e-5), row
    assert not ATTEMPT.search(out) and "cannot start" not in out, out
