#!/usr/bin/env bash
# One call on the GPU machine (device tool): build, run the GPU tests, check, benchmark, and
# print a short table last. Carry: .deps (scripts/fetch-deps.sh), cache (kernels compiled here
# with `fusejit compile --arch sm_90a`), .anchors (copy of ../shared/spec/*.py).
#   scripts/device.sh [tests|check|bench|all] [extra ctest -R regex]
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/fusejit-out}
mkdir -p "$out"
what=${1:-all}
export PATH=/usr/local/cuda/bin:$PATH
export BUILD_DIR=/tmp/fj-build
export FUSEJIT_CACHE_DIR=$here/cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
t0=$(date +%s)
"$here/scripts/build.sh" >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
fj=$BUILD_DIR/fusejit
"$fj" info
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure ${2:+-R "$2"} 2>&1) | tee "$out/gpu-tests.log" | tail -60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$what" = check ] || [ "$what" = all ]; then
  "$fj" check --sweep quick 2>&1 | tee "$out/check.log" | tail -25 || status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  : >"$out/bench.log"
  for shape in 1024x8192x8192 16384x4096x4096 128x512x1024; do
    for dtype in bf16 fp32; do
      for mode in train eval; do
        "$fj" bench --shape $shape --dtype $dtype --mode $mode 2>&1 | tee -a "$out/bench.log" | tail -5
      done
    done
  done
  [ -f "$here/.anchors/anchors.py" ] && python3 "$here/.anchors/anchors.py" --dtypes bf16,fp32 \
    --compile 2>&1 | tee "$out/anchors.log" | tail -30
fi
exit $status
