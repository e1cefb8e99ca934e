"""Talking to Slurm: sbatch to submit, squeue while the job is queued or running, then
scontrol (or sacct, once the controller has forgotten the job) for how it ended."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from chexflow.errors import ChexflowError

# Job states after which nothing more happens (squeue --help, sacct's JOB STATE CODES).
FINISHED = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
}


class SlurmError(ChexflowError):
    """Slurm is missing, refused a request, or a job did not finish well."""


@dataclass
class JobStatus:
    job_id: str
    state: str
    exit_code: str = ""
    elapsed: str = ""
    nodes: str = ""
    reason: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def as_dict(self) -> dict:
        return asdict(self)


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"{argv[0]} not found: {what} needs the Slurm client commands on PATH "
            "(Debian: apt-get install slurm-client; run on a login node of the cluster)"
        )
    return subprocess.run(argv, capture_output=True, text=True)


def submit(script: Path, extra: list[str] | None = None) -> str:
    """sbatch the script; return the job id."""
    proc = _run(["sbatch", "--parsable", *(extra or []), str(script)], f"submitting {script}")
    if proc.returncode != 0:
        raise SlurmError(f"sbatch {script} was refused: {proc.stderr.strip() or proc.stdout}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch {script}: expected a job id, got {proc.stdout.strip()!r}")
    return job_id


def queued_state(job_id: str) -> str | None:
    """The job's state while squeue lists it (PENDING, RUNNING, COMPLETING...), else None."""
    proc = _run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"], f"job {job_id}")
    if proc.returncode != 0:  # e.g. "Invalid job id specified" once the record is purged
        return None
    state = proc.stdout.strip()
    return state.split()[0] if state else None


def final_status(job_id: str) -> JobStatus:
    """How the job ended, from scontrol (recent jobs) or sacct (accounting)."""
    proc = _run(["scontrol", "show", "job", "--oneliner", job_id], f"job {job_id}")
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        fields = dict(
            item.split("=", 1) for item in proc.stdout.split() if "=" in item
        )
        return JobStatus(
            job_id=job_id, state=fields.get("JobState", "UNKNOWN"),
            exit_code=fields.get("ExitCode", ""), elapsed=fields.get("RunTime", ""),
            nodes=fields.get("NodeList", ""), reason=fields.get("Reason", ""),
        )
    acct = _run(
        ["sacct", "--jobs", job_id, "--allocations", "--noheader", "--parsable2",
         "--format", "State,ExitCode,Elapsed,NodeList,Reason"],
        f"job {job_id}",
    )
    row = acct.stdout.strip().splitlines()[0].split("|") if acct.stdout.strip() else []
    if acct.returncode != 0 or len(row) < 4:
        raise SlurmError(
            f"job {job_id}: neither scontrol nor sacct knows it "
            f"({(proc.stderr or acct.stderr).strip()})"
        )
    state = row[0].split()[0]  # "CANCELLED by 0" -> CANCELLED
    return JobStatus(job_id, state, row[1], row[2], row[3], row[4] if len(row) > 4 else "")


def wait(
    job_id: str,
    poll: float = 5.0,
    timeout: float | None = None,
    on_state: Callable[[str, float], None] | None = None,
) -> JobStatus:
    """Poll until the job finishes; `on_state(state, seconds)` is called after every poll."""
    started = time.monotonic()
    while True:
        state = queued_state(job_id)
        waited = time.monotonic() - started
        if on_state:
            on_state(state or "FINISHED", waited)
        if state is None or state in FINISHED:
            return final_status(job_id)
        if timeout is not None and waited > timeout:
            raise SlurmError(
                f"job {job_id} is still {state} after {waited:.0f} s (--timeout {timeout:g}); "
                f"it keeps running: follow it with `squeue -j {job_id}`, stop it with "
                f"`scancel {job_id}`"
            )
        time.sleep(poll)
