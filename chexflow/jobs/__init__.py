"""Jobs: what to run (JobSpec) and where (backend "local" or "kubernetes").

    from chexflow.jobs import JobSpec, run_job
    run_job(JobSpec(name="train", command=["chexflow", "train", ...], workers=2, horovod=True))
"""

from __future__ import annotations

from typing import Any

from chexflow.jobs.result import JobResult
from chexflow.jobs.spec import (
    ClusterOptions,
    JobCancelled,
    JobFailed,
    JobSpec,
    JobSpecError,
    JobTimeout,
    Volume,
    dns_name,
)

BACKENDS = ("local", "kubernetes")

__all__ = [
    "BACKENDS",
    "ClusterOptions",
    "JobCancelled",
    "JobFailed",
    "JobResult",
    "JobSpec",
    "JobSpecError",
    "JobTimeout",
    "Volume",
    "dns_name",
    "make_backend",
    "run_job",
]


def make_backend(backend: str = "local", **options: Any):
    """A backend object: LocalBackend(stream, log_dir) or KubernetesBackend(namespace, ...)."""
    if backend == "local":
        from chexflow.jobs.local import LocalBackend

        return LocalBackend(**options)
    if backend == "kubernetes":
        from chexflow.jobs.kubernetes import KubernetesBackend

        return KubernetesBackend(**options)
    raise JobSpecError(f"backend {backend!r}: expected one of {BACKENDS}")


def run_job(spec: JobSpec, backend: str = "local", **options: Any) -> JobResult:
    """Run `spec` to completion; raise JobFailed / JobTimeout (with the log tail) otherwise."""
    return make_backend(backend, **options).run(spec)
