#!/usr/bin/env bash
# Runs one setup phase and records how long it took, for the summary at the end of `make test`.
#   images/phase.sh NAME COMMAND [ARGS...]
# Appends "NAME<TAB>SECONDS<TAB>EXIT<TAB>START<TAB>BUSY" (START: seconds since the epoch; BUSY:
# the machine's busy core-seconds meanwhile, from /proc/stat) to $CHEXFLOW_SETUP_TIMES when that
# is set; phases may run side by side.
set -u
name=$1; shift
busy() {  # core-seconds the machine's CPUs have been busy since boot (all but idle and iowait)
  awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat
}
start=$(date +%s.%N) busy0=$(busy)
"$@"; rc=$?
if [ -n "${CHEXFLOW_SETUP_TIMES:-}" ]; then
  mkdir -p "$(dirname "$CHEXFLOW_SETUP_TIMES")"
  printf '%s\t%.1f\t%s\t%.1f\t%.1f\n' "$name" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" \
    "$rc" "$start" "$(awk -v a="$busy0" -v b="$(busy)" 'BEGIN { print b - a }')" >>"$CHEXFLOW_SETUP_TIMES"
fi
exit $rc
