#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over the small sweep in
# tests/sanitize/small.sweep, for each variant the GPU has, for a forced split-K config (its
# slice stores and fj_splitk_reduce), on Hopper for a forced TMA-store config and for the apply
# inside the GEMM (`.oa`, bf16 and tf32 configs over tests/sanitize/overlap_small.sweep), for the
# grid-synchronized train kernel (`.rc.gs`, over tests/sanitize/resident_small.sweep: one round
# and several) and the statistics taken from x before the GEMM
# (`.rc.cv`: a bf16 and a tf32 warpspec config, and a tiled one; the sweep's K = 64 is within its
# limit), and for the backward pass over tests/sanitize/backward_small.sweep ("backward": the
# heuristic's gradient GEMMs, cuBLASLt's for strict fp32; "bwd_tiles": fusejit's FFMA tiles
# forced, dW split, on the lines they can run), and for training steps whose forward is the
# cuBLASLt reference op writing `saved` ("reference", tests/sanitize/reference_small.sweep). Run
# on the GPU machine after a build:
#   scripts/gpu_sanitize.sh [/path/to/fusejit]    -> one line per (tool, variant), exit 1 on errors
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fj=${1:-${BUILD_DIR:-$here/build}/fusejit}
out=${OUT:-/tmp}
sweep=$here/tests/sanitize/small.sweep
variants="tiled splitk cv_tiled backward bwd_tiles reference"
"$fj" info | grep -q "sm_90" && variants="tiled splitk cv_tiled warpspec ts oa_bf16 oa_tf32 gs cv_bf16 cv_tf32 backward bwd_tiles reference"
variants=${SANITIZE_VARIANTS:-$variants}
# K = 64 everywhere in the sweep: 4 k tiles of 16, one per split.
splitk_config=tiled.64x64x16.w2x1.s3.g8.k4
ts_config=warpspec.128x256x64.c2.s4.g8.cl1.p1.ts
oa_bf16_config=warpspec.128x256x64.c2.s4.g1.cl1.p1.ts.oa
oa_tf32_config=warpspec.128x256x32.c2.s4.g1.cl1.p1.ts.oa
gs_config=warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs
cv_bf16_config=warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv
cv_tf32_config=warpspec.128x128x32.c2.s6.g8.cl1.p1.rc.cv
cv_tiled_config=tiled.128x128x32.w2x4.s3.g8.rc.cv
bwd_tiles_config=dx.tiled.128x128x32.w4x2.s3.g8.dw.tiled.128x128x32.w4x2.s3.g8.k4
status=0
printf '%-10s %-9s %s\n' tool variant result
for tool in memcheck racecheck initcheck synccheck; do
  for v in $variants; do
    log=$out/sanitize-$tool-$v.log
    case $v in
      splitk) pick=(--config "$splitk_config") ;;
      ts) pick=(--config "$ts_config") ;;
      oa_bf16) pick=(--config "$oa_bf16_config") ;;
      oa_tf32) pick=(--config "$oa_tf32_config") ;;
      gs) pick=(--config "$gs_config") ;;
      cv_bf16) pick=(--config "$cv_bf16_config") ;;
      cv_tf32) pick=(--config "$cv_tf32_config") ;;
      cv_tiled) pick=(--config "$cv_tiled_config") ;;
      backward | reference) pick=(--backward) ;;
      bwd_tiles) pick=(--backward --backward-config "$bwd_tiles_config") ;;
      *) pick=(--variant "$v") ;;
    esac
    case $v in
      backward | bwd_tiles) cases=$here/tests/sanitize/backward_small.sweep ;;
      reference) cases=$here/tests/sanitize/reference_small.sweep ;;
      oa_*) cases=$here/tests/sanitize/overlap_small.sweep ;;
      gs) cases=$here/tests/sanitize/resident_small.sweep ;;
      *) cases=$sweep ;;
    esac
    compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$fj" check --sweep "$cases" "${pick[@]}" --seed 1 >"$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|cases," "$log" | tr '\n' ' ')
    printf '%-10s %-9s rc=%s %s\n' "$tool" "$v" "$rc" "$summary"
    [ "$rc" = 0 ] || status=1
  done
done
exit $status
