#!/usr/bin/env bash
# Creates the control environment (kfp, kubernetes client, Katib runner) and installs chexflow.
# The single source of truth for it: used by `make setup` and images/launcher/Dockerfile.
#   images/install-control.sh VENV [--editable|--install|--no-project]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${1:?usage: install-control.sh VENV [--editable|--install|--no-project]}
mode=${2:---editable}
python=${CHEXFLOW_PYTHON:-$(command -v python3.11 || command -v python3)}
# shellcheck source=images/python.sh
source "$here/python.sh"

stamp="$venv/.chexflow-stamp"
want=$(cat "$here/requirements-control.txt" "$here/requirements-katib-sdk.txt" "$0" "$here/python.sh" | sha256sum | cut -c1-16)
# --install always (re)installs the project: images install the environment first, then the source.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$mode" != --install ]; then
  echo "control environment $venv is up to date"
  exit 0
fi

echo ">> control environment: $venv (python: $python)"
uv_venv "$venv" "$python"
uv_install "$venv" "pip>=24" "setuptools>=70" wheel -r "$here/requirements-control.txt"
uv_install "$venv" --no-deps -r "$here/requirements-katib-sdk.txt"  # (why --no-deps: the file)
case "$mode" in
  --editable) uv_install "$venv" --no-deps -e "$root" ;;
  --install) uv_install "$venv" --no-deps "$root" ;;
  --no-project) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
echo "$want" >"$stamp"
echo ">> control environment ready: $venv"
