#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over the small sweep in
# tests/sanitize/small.sweep, for each variant the GPU has. Run on the GPU machine after a build:
#   scripts/gpu_sanitize.sh [/path/to/fusejit]    -> one line per (tool, variant), exit 1 on errors
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fj=${1:-${BUILD_DIR:-$here/build}/fusejit}
out=${OUT:-/tmp}
sweep=$here/tests/sanitize/small.sweep
variants="tiled"
"$fj" info | grep -q "sm_90" && variants="tiled warpspec"
status=0
printf '%-10s %-9s %s\n' tool variant result
for tool in memcheck racecheck initcheck synccheck; do
  for v in $variants; do
    log=$out/sanitize-$tool-$v.log
    compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$fj" check --sweep "$sweep" --variant "$v" --seed 1 >"$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|cases," "$log" | tr '\n' ' ')
    printf '%-10s %-9s rc=%s %s\n' "$tool" "$v" "$rc" "$summary"
    [ "$rc" = 0 ] || status=1
  done
done
exit $status
