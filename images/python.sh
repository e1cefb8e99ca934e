# Sourced by the install scripts: `chexflow_python` prints the interpreter for a new environment.
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
