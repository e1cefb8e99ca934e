#!/usr/bin/env bash
# Creates the trainer environment: TensorFlow 2.20 with tf-keras (Keras 2), numpy 2, and Horovod
# 0.28.1 built from its sdist with images/horovod-0.28.1-tf2.20.patch (gloo always; MPI where
# mpicc exists; NCCL where CUDA is present), then installs chexflow.
#   images/install-trainer.sh VENV [--editable|--install|--no-project] [--with-control]
# --with-control adds the control side (kfp, Katib's libraries, the test tools) in the same
# resolve: `make setup`'s one local environment. The images keep the two apart (install-control.sh).
# Environment: TF_PACKAGE (default tensorflow-cpu==2.20.0; the GPU image uses
# tensorflow[and-cuda]==2.20.0), KERAS_PACKAGE (default tf-keras==2.20.1; empty for none),
# CHEXFLOW_PYTHON (default: images/python.sh), CHEXFLOW_CACHE (built Horovod wheels, default ~/.cache/chexflow), TRAINER_REQUIREMENTS (default
# images/requirements-trainer.txt; the TF 2.15 baseline of `chexflow bench` names its own).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${1:?usage: install-trainer.sh VENV [--editable|--install|--no-project] [--with-control]}
mode=${2:---editable}
with_control=${3:-}
# shellcheck source=images/python.sh
source "$here/python.sh"
python=$(chexflow_python)
tf_package=${TF_PACKAGE:-tensorflow-cpu==2.20.0}
keras_package=${KERAS_PACKAGE-tf-keras==2.20.1}
requirements=${TRAINER_REQUIREMENTS:-$here/requirements-trainer.txt}
horovod_version=0.28.1
patch_file=$here/horovod-$horovod_version-tf2.20.patch
cache=${CHEXFLOW_CACHE:-$HOME/.cache/chexflow}

with_mpi=0; command -v mpicc >/dev/null 2>&1 && with_mpi=1
with_nccl=0; [ -n "${HOROVOD_NCCL_HOME:-}" ] || [ -e /usr/include/nccl.h ] && with_nccl=1

control=()
[ "$with_control" = --with-control ] && control=(-r "$here/requirements-control.txt")
stamp="$venv/.chexflow-stamp"
want=$(cat "$requirements" "$0" "$here/python.sh" "$patch_file" ${control:+"$here/requirements-control.txt" "$here/requirements-katib-sdk.txt"} | sha256sum | cut -c1-12)-$tf_package-$keras_package-mpi$with_mpi-nccl$with_nccl-$("$python" -V 2>&1 | tr -d ' ')$with_control
# --install always (re)installs the project: images install the environment first, then the source.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$mode" != --install ]; then
  echo "trainer environment $venv is up to date"
  exit 0
fi

echo ">> trainer environment: $venv (python: $python, $tf_package, mpi=$with_mpi, nccl=$with_nccl${with_control:+, with control})"
uv_venv "$venv" "$python"
pip=("$venv/bin/python" -m pip)
uv_install "$venv" "pip>=24" "setuptools>=70,<75" wheel "$tf_package" -r "$requirements" "${control[@]}"
if [ -n "$keras_package" ]; then
  # tf-keras requires `tensorflow` by that name; tensorflow-cpu is the same TensorFlow without
  # CUDA (the full package logs a failed cuInit on every start without a GPU), so beside it
  # tf-keras goes in without that dependency, which would be a second TensorFlow over its files.
  nodeps=(); case "$tf_package" in tensorflow-cpu*) nodeps=(--no-deps) ;; esac
  uv_install "$venv" "${nodeps[@]}" "$keras_package"
fi
if [ "$with_control" = --with-control ]; then
  uv_install "$venv" --no-deps -r "$here/requirements-katib-sdk.txt"  # (why --no-deps: the file)
fi

# Horovod compiles against the installed TensorFlow, so the built wheel is cached under a key
# of everything it was built with; a rebuild takes minutes, a cached install seconds.
pyver=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
patch_key=$(sha256sum "$patch_file" | cut -c1-8)
key="horovod-$horovod_version-py$pyver-$(echo "$tf_package" | tr -c 'A-Za-z0-9.=\n' _)-mpi$with_mpi-nccl$with_nccl-patch$patch_key"
wheels="$cache/wheels/$key"
if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
  echo ">> building Horovod $horovod_version from source with $(basename "$patch_file") (minutes; cached in $wheels)"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
  if [ "$with_mpi" = 1 ]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
  if [ "$with_nccl" = 1 ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
  export MAKEFLAGS="-j$(nproc)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "${pip[@]}" download --quiet --no-deps --no-binary :all: -d "$tmp" "horovod==$horovod_version"
  tar -xzf "$tmp"/horovod-"$horovod_version".tar.gz -C "$tmp"
  patch -d "$tmp/horovod-$horovod_version" -p1 --quiet <"$patch_file"
  "${pip[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$tmp/wheel" "$tmp/horovod-$horovod_version"
  mkdir -p "$wheels" && mv "$tmp"/wheel/horovod-*.whl "$wheels"/
fi
# with horovod's runtime dependencies (its wheel goes in without them)
uv_install "$venv" cloudpickle psutil pyyaml packaging
uv_install "$venv" --no-deps --reinstall-package horovod "$wheels"/horovod-*.whl

case "$mode" in
  --editable) uv_install "$venv" --no-deps -e "$root" ;;
  --install) uv_install "$venv" --no-deps "$root" ;;
  --no-project) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
# tf-keras when one was installed; TF <= 2.15 (the bench baseline) has its own Keras 2
legacy_keras=0; [ -n "$keras_package" ] && legacy_keras=1
TF_USE_LEGACY_KERAS=$legacy_keras "$venv/bin/python" -c 'import horovod.tensorflow.keras as hvd, tensorflow as tf, numpy; print("horovod", hvd.__version__ if hasattr(hvd, "__version__") else "", "tensorflow", tf.__version__, "keras", tf.keras.Model.__module__.split(".")[0], "numpy", numpy.__version__, "gloo", hvd.gloo_built(), "mpi", hvd.mpi_built())'
echo "$want" >"$stamp"
echo ">> trainer environment ready: $venv"
