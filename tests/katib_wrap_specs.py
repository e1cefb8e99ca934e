"""The Experiment of issue 29 (a batch-Job trial whose `python -c` program is one argument with
spaces, quotes and parentheses) and its quoted variant, for the local and the cluster tests."""

from __future__ import annotations

from typing import Any

PROGRAM = "import sys; x=float(sys.argv[1]); print('loss=%.5f' % (x*x))"
# Katib's collector must find the main process still running (a trial that ends at once
# leaves it nothing to watch), hence the pause in the quoted variant.
QUOTED = f'sleep 3; python -c "{PROGRAM}" ${{trialParameters.px}}'
SH_SYNTAX_ERROR = 'sh: 1: Syntax error: "(" unexpected'


def issue_experiment(name: str, quoted: bool, image: str = "python:3.11-slim",
                     backoff_limit: int = 0, max_trials: int = 2) -> dict[str, Any]:
    """The issue's Experiment: `command: [python, -c, PROGRAM, ${trialParameters.px}]`, or
    (quoted) `command: [sh, -c]` with the whole command line as one string in args."""
    if quoted:
        container = {"command": ["sh", "-c"], "args": [QUOTED]}
    else:
        container = {"command": ["python", "-c", PROGRAM, "${trialParameters.px}"]}
    return {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "objective": {"type": "minimize", "objectiveMetricName": "loss"},
            "algorithm": {"algorithmName": "random"},
            "parallelTrialCount": 1, "maxTrialCount": max_trials, "maxFailedTrialCount": 1,
            "parameters": [{"name": "x", "parameterType": "double",
                            "feasibleSpace": {"min": "-1", "max": "1"}}],
            "trialTemplate": {
                "primaryContainerName": "main",
                "trialParameters": [{"name": "px", "reference": "x"}],
                "trialSpec": {"apiVersion": "batch/v1", "kind": "Job", "spec": {
                    "backoffLimit": backoff_limit, "template": {"spec": {
                        "restartPolicy": "Never", "containers": [{
                            "name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                            **container}]}}}}}}}
