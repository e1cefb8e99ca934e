#!/usr/bin/env bash
# Runs one setup phase and records how long it took, for the summary at the end of `make test`.
#   images/phase.sh NAME COMMAND [ARGS...]
# Appends "NAME<TAB>SECONDS<TAB>EXIT<TAB>START" (START: seconds since the epoch) to
# $CHEXFLOW_SETUP_TIMES when that is set; phases may run side by side.
set -u
name=$1; shift
start=$(date +%s.%N)
"$@"; rc=$?
if [ -n "${CHEXFLOW_SETUP_TIMES:-}" ]; then
  mkdir -p "$(dirname "$CHEXFLOW_SETUP_TIMES")"
  printf '%s\t%.1f\t%s\t%.1f\n' "$name" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$rc" "$start" >>"$CHEXFLOW_SETUP_TIMES"
fi
exit $rc
