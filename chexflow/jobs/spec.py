"""What a job is: a command for one environment, how many Horovod workers, resources, volumes.

A JobSpec says nothing about where it runs; a backend (chexflow.jobs.local / .kubernetes) does.
`command` is the argv of ONE process (one Horovod rank when `horovod` is true): the local backend
wraps it in `horovodrun`, the kubernetes backend in an MPIJob whose launcher runs `mpirun`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from chexflow.errors import ChexflowError

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 52  # leaves room for the "-launcher"/"-worker-N" pod suffixes within 63 characters
ENVIRONMENTS = ("trainer", "control")


class JobSpecError(ChexflowError):
    """A job description that cannot be run."""


class JobFailed(ChexflowError):
    """A job ran and failed; the message ends with the tail of its log."""

    def __init__(self, message: str, log_tail: str = "", exit_code: int | None = None):
        super().__init__(message + (f"\n--- log tail ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail
        self.exit_code = exit_code


class JobTimeout(JobFailed):
    """A job ran past its time limit and was ended."""


@dataclass(frozen=True)
class Volume:
    """A PersistentVolumeClaim mounted at `mount_path` (locally: the path is used as it is)."""

    claim: str
    mount_path: str
    read_only: bool = False


@dataclass
class JobSpec:
    name: str
    command: list[str]
    environment: str = "trainer"
    workers: int = 1
    horovod: bool = False
    gpus_per_worker: int = 0
    cpu: str = "1"
    memory: str = "2Gi"
    shm_size: str = "1Gi"
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[Volume] = field(default_factory=list)
    timeout_seconds: int = 3600
    backoff_limit: int = 0
    ttl_seconds_after_finished: int = 3600
    labels: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = f"job {self.name!r}"
        if not NAME_RE.match(self.name) or len(self.name) > MAX_NAME:
            raise JobSpecError(
                f"{where}: name must be lowercase letters, digits and '-', start with a letter, "
                f"end with a letter or digit, at most {MAX_NAME} characters"
            )
        if not self.command or not all(isinstance(a, str) for a in self.command):
            raise JobSpecError(f"{where}: command must be a non-empty list of strings")
        if self.environment not in ENVIRONMENTS:
            raise JobSpecError(f"{where}: environment must be one of {ENVIRONMENTS}")
        if self.workers < 1:
            raise JobSpecError(f"{where}: workers must be >= 1, got {self.workers}")
        if self.workers > 1 and not self.horovod:
            raise JobSpecError(f"{where}: workers={self.workers} needs horovod=True")
        if self.gpus_per_worker < 0:
            raise JobSpecError(f"{where}: gpus_per_worker must be >= 0")
        if self.timeout_seconds <= 0:
            raise JobSpecError(f"{where}: timeout_seconds must be > 0")
        bad = [k for k in self.env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
        if bad:
            raise JobSpecError(f"{where}: invalid environment variable names {bad}")

    @property
    def slots(self) -> int:
        """Processes per worker: one per GPU (at least one)."""
        return max(1, self.gpus_per_worker)

    @property
    def processes(self) -> int:
        """Total Horovod ranks."""
        return self.workers * self.slots

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        data = dict(data)
        data["volumes"] = [Volume(**v) for v in data.get("volumes", [])]
        return cls(**data)


def dns_name(text: str, max_len: int = MAX_NAME) -> str:
    """A Kubernetes-safe name from free text (lowercase, '-', starts with a letter)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"j-{name}"
    return name[:max_len].rstrip("-")
