#!/usr/bin/env bash
# Per-kernel profile on the GPU machine (after `scripts/device.sh none` built /tmp/fj-build):
# real clocks, caches not flushed, so the figures add up to what `fusejit bench` times.
#   scripts/profile.sh SHAPE DTYPE MODE VARIANT [ncu section args...]
# Prints ncu's figures for the fused op's kernels (fj_*) over its first runs.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PATH=/usr/local/cuda/bin:$PATH
export FUSEJIT_CACHE_DIR=$here/cache
fj=${BUILD_DIR:-/tmp/fj-build}/fusejit
shape=$1 dtype=$2 mode=$3 variant=$4
shift 4
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active)
# The first fused runs of bench (its warm-up, then the timed ones): two runs' worth of kernels.
ncu --clock-control none --cache-control none -k 'regex:^fj_' -c "${FJ_PROFILE_COUNT:-6}" \
    "${extra[@]}" "$fj" bench --shape "$shape" --dtype "$dtype" --mode "$mode" \
    --variant "$variant" --runs 50 --warmup 1 2>&1
