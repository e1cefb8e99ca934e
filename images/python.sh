# Sourced by the install scripts: `chexflow_python` prints the interpreter for a new environment;
# `uv_venv` and `uv_install` make it and install into it (below).
# CHEXFLOW_PYTHON wins; then Python 3.12 (on PATH, or one pyenv installed), then 3.13 or 3.11
# (CHEXFLOW_PYTHON_VERSIONS changes that order).
# A pyenv shim that exists but is not selected fails when run, so each candidate is run once.
chexflow_python() {
  if [ -n "${CHEXFLOW_PYTHON:-}" ]; then echo "$CHEXFLOW_PYTHON"; return; fi
  local root candidate
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for version in ${CHEXFLOW_PYTHON_VERSIONS:-3.12 3.13 3.11}; do
    for candidate in "$(command -v "python$version" 2>/dev/null)" "$root"/versions/"$version".*/bin/"python$version"; do
      if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import venv, ensurepip' 2>/dev/null; then
        echo "$candidate"; return
      fi
    done
  done
  echo "no Python 3.12, 3.13 or 3.11 found: install one, or set CHEXFLOW_PYTHON" >&2
  return 1
}

# `uv_venv VENV PYTHON` makes a virtual environment with uv in it; `uv_install VENV ARGS...` is
# `uv pip install` into it, compiling the bytecode as pip does (an image's user cannot write
# __pycache__ under the root-owned environment: without it every process there compiles what it
# imports). `make setup`'s environment took 30 s so (20 s without the bytecode), pip 59 s
# (2026-11-26, this 2-core machine, Horovod's wheel cached). pip stays in the environment:
# Horovod's sdist is built with it. pip's index, find-links and CA settings apply.
UV_VERSION=0.13.9
uv_venv() {
  "$2" -m venv "$1"
  "$1/bin/python" -m pip install --quiet "uv==$UV_VERSION"
}
uv_install() {
  local venv=$1; shift
  [ -n "${PIP_INDEX_URL:-}" ] && export UV_INDEX_URL=${UV_INDEX_URL:-$PIP_INDEX_URL}
  [ -n "${PIP_EXTRA_INDEX_URL:-}" ] && export UV_EXTRA_INDEX_URL=${UV_EXTRA_INDEX_URL:-$PIP_EXTRA_INDEX_URL}
  [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ] && export UV_FIND_LINKS=${UV_FIND_LINKS:-$PIP_FIND_LINKS}
  [ -n "${PIP_CERT:-}" ] && export SSL_CERT_FILE=${SSL_CERT_FILE:-$PIP_CERT}
  "$venv/bin/uv" pip install --quiet --native-tls --compile-bytecode --python "$venv/bin/python" "$@"
}
