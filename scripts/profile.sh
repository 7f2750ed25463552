#!/usr/bin/env bash
# Per-kernel profile on the GPU machine (after `scripts/device.sh none` built /tmp/fj-build):
# real clocks, caches not flushed, so the figures add up to what `fusejit bench` times.
#   scripts/profile.sh SHAPE DTYPE MODE VARIANT [ncu section args...]
# Prints one line per fj_* / cuBLAS kernel of one timed run: name, duration, DRAM bytes.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PATH=/usr/local/cuda/bin:$PATH
export FUSEJIT_CACHE_DIR=$here/cache
fj=${BUILD_DIR:-/tmp/fj-build}/fusejit
shape=$1 dtype=$2 mode=$3 variant=$4
shift 4
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active)
# bench runs: fused (warmup 2 + 1 timed), then the GEMM and the reference; skip the warm-ups.
ncu --clock-control none --cache-control none -k 'regex:fj_|gemm|sm90|sm80|Kernel' \
    "${extra[@]}" "$fj" bench --shape "$shape" --dtype "$dtype" --mode "$mode" \
    --variant "$variant" --runs 2 --warmup 1 2>&1
