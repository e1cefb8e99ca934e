"""Katib's medianstop early stopping, with Katib's semantics.

When a trial is created, the rule is computed from the Succeeded trials so far: each one's
average objective over its first `start_step` reports; once at least `min_trials_required`
such trials exist, the rule value is the MEAN of those averages (Katib's "median"). While the
trial runs, from its `start_step`-th objective report on, its best value so far is compared
with the rule (maximize: stop when below; minimize: stop when above) and the trial is stopped
as EarlyStopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from chexflow.katib.experiment.model import Experiment

DEFAULTS = {"min_trials_required": 3, "start_step": 4}


def validate_early_stopping(exp: Experiment) -> list[tuple[str, str]]:
    path = "spec.earlyStopping"
    if exp.early_stopping != "medianstop":
        return [(f"{path}.algorithmName",
                 f"unable to get EarlyStopping config data for algorithm "
                 f"{exp.early_stopping} (Katib's early stopping algorithm is medianstop)")]
    out = []
    for i, (key, value) in enumerate(exp.early_stopping_settings.items()):
        if key not in DEFAULTS:
            out.append((f"{path}.algorithmSettings[{i}].name",
                        f"unknown setting {key} for algorithm medianstop"))
            continue
        try:
            ok = int(value) >= 1
        except ValueError:
            ok = False
        if not ok:
            out.append((f"{path}.algorithmSettings[{i}].value",
                        f"{key}: {value!r} must be an integer of at least 1"))
    return out


def settings(exp: Experiment) -> dict[str, int]:
    return {k: int(exp.early_stopping_settings.get(k, v)) for k, v in DEFAULTS.items()}


@dataclass
class StopRule:
    metric: str
    value: float
    comparison: str  # "less" (maximize) or "greater" (minimize)
    start_step: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def median_rule(exp: Experiment, succeeded_logs: list[list[float]]) -> StopRule | None:
    """The rule for a new trial, from the objective logs of the Succeeded trials so far."""
    if exp.early_stopping != "medianstop":
        return None
    s = settings(exp)
    averages = [
        sum(logs[: s["start_step"]]) / len(logs[: s["start_step"]])
        for logs in succeeded_logs
        if logs
    ]
    if len(averages) < s["min_trials_required"]:
        return None
    value = sum(averages) / len(averages)
    comparison = "less" if exp.objective.maximize else "greater"
    return StopRule(exp.objective.metric, value, comparison, s["start_step"])


class RuleChecker:
    """Feeds a running trial's reports to its rule; `report` returns True to stop it."""

    def __init__(self, rule: StopRule | None, maximize: bool):
        self.rule = rule
        self.maximize = maximize
        self.best: float | None = None
        self.count = 0

    def report(self, metric: str, value: float) -> bool:
        rule = self.rule
        if rule is None or metric != rule.metric:
            return False
        if self.best is None or (value > self.best if self.maximize else value < self.best):
            self.best = value
        self.count += 1
        if self.count < rule.start_step:
            return False
        if rule.comparison == "less":
            return self.best < rule.value
        return self.best > rule.value
