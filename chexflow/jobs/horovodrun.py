"""`python -m chexflow.jobs.horovodrun ARGS`: Horovod's own horovodrun with ARGS, less the cost
of its build checks. On every launch horovodrun asks whether Horovod was built with MPI (--mpi)
or gloo (--gloo) by importing horovod.tensorflow, so all of TensorFlow, in a forked process:
4-9 s of each local training's start on 2 cores. Here the same C functions of the same library
answer (`horovod_mpi_built`, `horovod_gloo_built` of horovod/tensorflow/mpi_lib*.so, which
Horovod's own check calls), the library loaded with ctypes beside TensorFlow's two shared
libraries in a short-lived process (about 1 s). Where that load fails, horovodrun's own checks
run as before."""

from __future__ import annotations

import subprocess
import sys

# prints "MPI GLOO" (1 or 0 each), read from the library the ranks will load
PROBE = """
import ctypes, importlib.util as u
from pathlib import Path
tf = Path(u.find_spec("tensorflow").submodule_search_locations[0])
hvd = Path(u.find_spec("horovod").submodule_search_locations[0])
for name in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2"):
    ctypes.CDLL(str(tf / name), mode=ctypes.RTLD_GLOBAL)
(lib,) = sorted((hvd / "tensorflow").glob("mpi_lib*.so"))
lib = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
print(int(bool(lib.horovod_mpi_built())), int(bool(lib.horovod_gloo_built())))
"""


def built() -> tuple[bool, bool] | None:
    """(built with MPI, built with gloo) of this interpreter's Horovod, or None if unknown."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=120)
        mpi, gloo = (bool(int(x)) for x in proc.stdout.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return (mpi, gloo) if proc.returncode == 0 else None


def main() -> int:
    from horovod.runner import launch

    answers = built()
    if answers is not None:
        mpi, gloo = answers
        launch.mpi_built = lambda verbose=False: mpi
        launch.gloo_built = lambda verbose=False: gloo
    sys.argv[0] = "horovodrun"
    launch.run_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
