"""What running a job returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class JobResult:
    name: str
    backend: str
    succeeded: bool
    wall_seconds: float
    log_tail: str = ""
    log_path: str | None = None
    resource: str | None = None  # kubernetes: "MPIJob/NAME" or "Job/NAME"

    def to_dict(self) -> dict:
        return asdict(self)
