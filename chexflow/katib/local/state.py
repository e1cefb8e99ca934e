"""A sweep's persistent state: STATE/state.json, rewritten atomically after every trial event.

The file holds the effective spec's fingerprint, the sweep's seed, the experiment conditions
and every trial (name, assignment, status, metric logs, process group while running). A killed
runner leaves trials in Created/Running; resuming re-runs exactly those, with the same names
and assignments, after making sure their old processes are gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chexflow.errors import ChexflowError
from chexflow.kube import finished_condition
from chexflow.processes import stop_marked

STATE_FILE = "state.json"
TRIAL_ENV = "CHEXFLOW_KATIB_TRIAL"
LOCK_FILE = ".lock"  # flock'ed by the runner of the sweep
STATE_ENV = "CHEXFLOW_KATIB_STATE"  # every trial process of a sweep: its state folder
ACTIVE = ("Created", "Running")
COMPLETED = ("Succeeded", "Failed", "MetricsUnavailable", "EarlyStopped", "Killed")


class StateError(ChexflowError):
    """The state folder cannot be used for this sweep."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class TrialRecord:
    name: str
    index: int
    parameters: dict[str, Any]
    status: str = "Created"
    created: str = field(default_factory=now)
    started: str | None = None
    finished: str | None = None
    logs: dict[str, list[float]] = field(default_factory=dict)
    exit_code: int | None = None
    message: str = ""
    reason: str = ""  # Katib's condition reason where chexflow knows it (a job's deadline)
    restarts: int = 0
    rule: dict | None = None
    optuna_attrs: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    # Katib's status.observation ({metric: {min, max, latest}}) for a trial read from a cluster,
    # where the metric logs stay in Katib's database; None: computed from `logs`.
    observation: dict[str, dict[str, float]] | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @classmethod
    def from_dict(cls, d: dict) -> TrialRecord:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class SweepState:
    directory: Path
    experiment: str
    fingerprint: str
    seed: int
    trial_command: str | None
    spec: dict
    trials: list[TrialRecord] = field(default_factory=list)
    conditions: list[dict] = field(default_factory=list)
    optuna_study_attrs: dict[str, Any] = field(default_factory=dict)
    _lock: Any = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    @property
    def marker(self) -> str:
        """STATE_ENV's value in this sweep's trial processes."""
        return str(self.directory.resolve())

    def save(self) -> None:
        data = {
            "experiment": self.experiment, "fingerprint": self.fingerprint, "seed": self.seed,
            "trial_command": self.trial_command, "spec": self.spec,
            "conditions": self.conditions, "optuna_study_attrs": self.optuna_study_attrs,
            "trials": [asdict(t) for t in self.trials],
        }
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def condition(self, ctype: str, status: str, reason: str, message: str) -> None:
        for c in self.conditions:
            if c["type"] == ctype:
                c.update(status=status, reason=reason, message=message, lastUpdateTime=now())
                return
        self.conditions.append({"type": ctype, "status": status, "reason": reason,
                                "message": message, "lastUpdateTime": now()})

    @property
    def finished_condition(self) -> dict | None:
        return finished_condition(self.conditions, "Experiment")

    def lock(self) -> None:
        """One runner per state folder."""
        fh = open(self.directory / LOCK_FILE, "w")  # noqa: SIM115 (held while the sweep runs)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fh.close()
            raise StateError(
                f"{self.directory}: another `chexflow tune` is running on this state folder"
            ) from e
        self._lock = fh


def open_state(directory: Path, experiment: str, fingerprint: str, spec: dict,
               trial_command: str | None, seed: int, create: bool = True) -> SweepState:
    """The sweep's state: loaded when the folder has one for this spec, else a new one."""
    path = directory / STATE_FILE
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise StateError(f"{path}: not valid JSON ({e})") from e
        if data.get("fingerprint") != fingerprint or data.get("experiment") != experiment:
            raise StateError(
                f"{path}: holds sweep {data.get('experiment')!r} of a different spec "
                f"(or different --set); resume with the same spec or use a new --state"
            )
        if data.get("trial_command") != trial_command:
            raise StateError(
                f"{path}: was run with --trial-command {data.get('trial_command')!r}; resume "
                f"with the same trial command or use a new --state"
            )
        return SweepState(
            directory=directory, experiment=experiment, fingerprint=fingerprint,
            seed=int(data["seed"]), trial_command=trial_command, spec=data.get("spec", spec),
            trials=[TrialRecord.from_dict(t) for t in data.get("trials", [])],
            conditions=data.get("conditions", []),
            optuna_study_attrs=data.get("optuna_study_attrs", {}),
        )
    if directory.exists() and any(p for p in directory.iterdir() if p.name != LOCK_FILE):
        raise StateError(
            f"{directory}: exists and is not a `chexflow tune` state folder; pick a new --state"
        )
    state = SweepState(directory, experiment, fingerprint, seed, trial_command, spec)
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    return state


def kill_leftover(trial: TrialRecord, grace: float = 5.0) -> int:
    """Kill the processes a dead runner left behind for this trial (their environment names
    it, see runner); returns how many."""
    return stop_marked(TRIAL_ENV, trial.name, grace)
