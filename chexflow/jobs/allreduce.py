"""Horovod's allreduce on CPU-only ranks, stated once for every launch (`chexflow train`'s
horovodrun, the MPIJob and TrainJob renderers, Slurm scripts): MPI tensor operations with Open
MPI yielding the core while a rank waits. On an idle 2-core machine that was the fastest setting
giving gloo's numbers (1.097x gloo, docs/benchmarks.md). GPU ranks keep NCCL: none of this is set
for them. Locally, gloo is the fallback where mpirun or Horovod's MPI build is missing.
"""

from __future__ import annotations

import mmap
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# Horovod's CPU tensor operations over MPI (OpenMPI's shared-memory transport between ranks of
# one host), and OpenMPI's progress loop giving the core away while a rank waits (with as many
# ranks as cores, a spinning rank takes the core its peer or TensorFlow needs).
MPI_CPU_ENV = {"HOROVOD_CPU_OPERATIONS": "MPI", "OMPI_MCA_mpi_yield_when_idle": "1"}

# Ranks of a local launch talk over OpenMPI's shared memory (vader) or TCP. horovodrun's own
# `-mca btl ^openib` replaces Debian's `btl = ^uct,openib,ofi`, which lets the ofi btl pick
# libfabric's `net` provider (OpenMPI 4.1's exclude list predates it); it once made a rank exit
# inside MPI_Init. No libfabric provider is named "none", so the ofi btl opens no endpoint.
LOCAL_MPI_ENV = {"FI_PROVIDER": "none"}


def cpu_env(gpus: int) -> dict[str, str]:
    """The environment of CPU-only MPI ranks (`gpus` per rank 0); nothing for GPU ranks."""
    return {} if gpus else dict(MPI_CPU_ENV)


def horovod_has_mpi(python: Path) -> bool:
    """Whether the Horovod of `python` was built with MPI: its TensorFlow library links libmpi.
    Read from the library (milliseconds), not by loading it (`horovodrun --check-build`
    imports TensorFlow, ~15 s)."""
    try:
        where = subprocess.run(
            [str(python), "-c", "import importlib.util as u; "
             "print(u.find_spec('horovod').submodule_search_locations[0])"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    if where.returncode != 0 or not where.stdout.strip():
        return False
    for lib in sorted(Path(where.stdout.strip(), "tensorflow").glob("mpi_lib*.so")):
        with lib.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(b"\0libmpi.so") >= 0:  # a DT_NEEDED name in .dynstr
                return True
    return False


@dataclass(frozen=True)
class Allreduce:
    """horovodrun's controller, the environment its ranks get, and why (a fallback's note)."""

    controller: str
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None


def local_allreduce(controller: str | None, python: Path, gpus: int = 0) -> Allreduce:
    """The allreduce of a local horovodrun launch: `controller` as asked, or by default MPI
    (with MPI_CPU_ENV on a machine without GPUs) where mpirun is on PATH and Horovod was built
    with MPI, else gloo with a note saying why."""
    if controller is None:
        missing = ("no mpirun on PATH" if not shutil.which("mpirun") else
                   None if horovod_has_mpi(python) else "Horovod was built without MPI")
        if missing:
            return Allreduce("gloo", note=f"allreduce over gloo: {missing} (MPI tensor "
                             f"operations are faster on CPU, docs/benchmarks.md)")
        controller = "mpi"
    return Allreduce(controller, {**cpu_env(gpus), **LOCAL_MPI_ENV} if controller == "mpi" else {})
