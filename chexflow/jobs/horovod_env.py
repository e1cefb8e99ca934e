"""Horovod's environment for ranks on hosts without a GPU, the default of local CPU runs and of
CPU MPIJobs (GPU jobs keep Horovod's own: NCCL for GPU tensors).

MPI tensor operations (`HOROVOD_CPU_OPERATIONS=MPI`, under mpirun) reduce gradients through
OpenMPI: between ranks of one host its shared-memory btl (vader) instead of gloo's TCP loopback.
OpenMPI spins while it waits for the other rank, and on a CPU host every core already runs a
worker: `mpi_yield_when_idle` lets the waiting rank give its core back. Measured in
`chexflow bench --only horovod-options` (docs/benchmarks.md).
"""

from __future__ import annotations

CPU_HOROVOD_ENV = {"HOROVOD_CPU_OPERATIONS": "MPI", "OMPI_MCA_mpi_yield_when_idle": "1"}


def cpu_horovod_env(env: dict[str, str]) -> dict[str, str]:
    """CPU_HOROVOD_ENV less what `env` (the user's) already sets: theirs wins."""
    return {k: v for k, v in CPU_HOROVOD_ENV.items() if k not in env}
