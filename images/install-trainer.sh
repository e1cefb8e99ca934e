#!/usr/bin/env bash
# Creates the trainer environment: TensorFlow 2.15.1 (Keras 2), Horovod 0.28.1 built from source
# (gloo always; MPI where mpicc exists; NCCL where CUDA is present), and installs chexflow.
# The single source of truth for it: used by `make setup` and images/trainer/Dockerfile.
#   images/install-trainer.sh VENV [--editable|--install|--no-project]
# Environment: TF_PACKAGE (default tensorflow-cpu==2.15.1; the GPU image uses
# tensorflow[and-cuda]==2.15.1), CHEXFLOW_CACHE (built Horovod wheels, default ~/.cache/chexflow).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${1:?usage: install-trainer.sh VENV [--editable|--install|--no-project]}
mode=${2:---editable}
python=${CHEXFLOW_PYTHON:-$(command -v python3.11 || command -v python3)}
tf_package=${TF_PACKAGE:-tensorflow-cpu==2.15.1}
horovod_version=0.28.1
cache=${CHEXFLOW_CACHE:-$HOME/.cache/chexflow}

with_mpi=0; command -v mpicc >/dev/null 2>&1 && with_mpi=1
with_nccl=0; [ -n "${HOROVOD_NCCL_HOME:-}" ] || [ -e /usr/include/nccl.h ] && with_nccl=1

stamp="$venv/.chexflow-stamp"
want=$(cat "$here/requirements-trainer.txt" "$0" | sha256sum | cut -c1-12)-$tf_package-mpi$with_mpi-nccl$with_nccl
# --install always (re)installs the project: images install the environment first, then the source.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$mode" != --install ]; then
  echo "trainer environment $venv is up to date"
  exit 0
fi

echo ">> trainer environment: $venv (python: $python, $tf_package, mpi=$with_mpi, nccl=$with_nccl)"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade "pip>=24" "setuptools>=70,<75" wheel
"${pip[@]}" install --quiet "$tf_package" -r "$here/requirements-trainer.txt"

# Horovod compiles against the installed TensorFlow, so the built wheel is cached under a key
# of everything it was built with; a rebuild takes minutes, a cached install seconds.
pyver=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
key="horovod-$horovod_version-py$pyver-$(echo "$tf_package" | tr -c 'A-Za-z0-9.=\n' _)-mpi$with_mpi-nccl$with_nccl"
wheels="$cache/wheels/$key"
if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
  echo ">> building Horovod $horovod_version from source (a few minutes; cached in $wheels)"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
  if [ "$with_mpi" = 1 ]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
  if [ "$with_nccl" = 1 ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
  export MAKEFLAGS="-j$(nproc)"
  tmp=$(mktemp -d)
  "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$tmp" "horovod==$horovod_version"
  mkdir -p "$wheels" && mv "$tmp"/horovod-*.whl "$wheels"/ && rm -rf "$tmp"
fi
"${pip[@]}" install --quiet --no-deps "$wheels"/horovod-*.whl
# horovod's runtime dependencies (its wheel was installed without them)
"${pip[@]}" install --quiet cloudpickle psutil pyyaml packaging

case "$mode" in
  --editable) "${pip[@]}" install --quiet --no-deps -e "$root" ;;
  --install) "${pip[@]}" install --quiet --no-deps "$root" ;;
  --no-project) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
"$venv/bin/python" -c 'import horovod.tensorflow.keras as hvd, tensorflow as tf; print("horovod", hvd.__version__ if hasattr(hvd, "__version__") else "", "tensorflow", tf.__version__, "gloo", hvd.gloo_built(), "mpi", hvd.mpi_built())'
echo "$want" >"$stamp"
echo ">> trainer environment ready: $venv"
