"""The local Katib runner's overhead per trial: `chexflow tune` with a trivial trial command vs
the same trial commands started directly one after another. Goal: <= 0.5 s per trial."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chexflow.bench.core import Result, Side, compare

SPEC = """\
apiVersion: kubeflow.org/v1beta1
kind: Experiment
metadata:
  name: overhead
spec:
  objective: {{type: maximize, objectiveMetricName: score}}
  algorithm: {{algorithmName: random}}
  parallelTrialCount: 1
  maxTrialCount: {trials}
  maxFailedTrialCount: 1
  parameters:
    - name: x
      parameterType: double
      feasibleSpace: {{min: "0", max: "1"}}
  trialTemplate:
    primaryContainerName: main
    trialParameters:
      - {{name: x, reference: x}}
    trialSpec:
      apiVersion: batch/v1
      kind: Job
      spec:
        template:
          spec:
            containers:
              - name: main
                image: busybox
                command: ["sh", "-c", "echo score=${{trialParameters.x}}"]
            restartPolicy: Never
"""
TRIAL = f"{shlex.quote(sys.executable)} -c 'print(\"score=${{trialParameters.x}}\")'"


def run(work: Path, trials: int, repeats: int) -> Result:
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "overhead.yaml"
    spec.write_text(SPEC.format(trials=trials))

    def through_runner() -> float:
        state = Path(tempfile.mkdtemp(prefix="state-", dir=work)) / "state"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "chexflow.cli", "tune", str(spec), "--local",
                        "--no-progress", "--state", str(state), "--trial-command", TRIAL],
                       check=True, capture_output=True)
        return (time.perf_counter() - start) / trials

    def direct() -> float:
        start = time.perf_counter()
        for i in range(trials):
            subprocess.run([sys.executable, "-c", f"print('score={i / trials}')"],
                           check=True, capture_output=True)
        return (time.perf_counter() - start) / trials

    return compare(
        "katib runner overhead", "s/trial",
        Side("chexflow tune --local", through_runner),
        Side("trial commands alone", direct),
        repeats=repeats, goal=0.5, goal_is_max=True, figure_name="overhead s/trial",
        notes={"trials": trials, "algorithm": "random"},
    )
