#!/usr/bin/env bash
# One call on the GPU machine (device tool): build, run the GPU tests, check, benchmark, and
# print a short table last. Carry: .deps (scripts/fetch-deps.sh), cache (kernels compiled here
# with `fusejit compile --arch sm_90a`), .anchors (copy of ../shared/spec/*.py).
#   scripts/device.sh [tests|check|bench|backward|soak|ab|host|python|all] [extra ctest -R regex]
# backward: `fusejit check --backward --sweep full` (BWD_CHECK=0 skips it) and `fusejit bench
#     --backward` on the seed shapes (BWD_SHAPES, BWD_DTYPES override them).
# python: pip install . from this tree (carry .whl: scikit-build-core, nanobind, pytest and
#     their wheels) and pytest python/tests against the PyTorch there.
# host: bench/host_cost.cpp (planning, hot plan, host time per run, dynamic vs exact M, bounded
#     cache soak); HOST_ARGS=--quick for its short form.
# soak: scripts/cache_soak.py (2,000 random cases while the cache directory is corrupted).
# ab: the same benchmark table for the tree carried in .baseline (e.g. `git archive REF | tar -x
#     -C .baseline`) and this tree, built side by side, run twice interleaved in this one call.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/fusejit-out}
mkdir -p "$out"
what=${1:-all}
export PATH=/usr/local/cuda/bin:$PATH
export BUILD_DIR=/tmp/fj-build
export FUSEJIT_CACHE_DIR=$here/cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
status=0
if [ "$what" = python ]; then
  # The package as a user gets it: pip builds it from this tree (build backend and test wheels
  # carried in .whl/, see README), then its tests run against the PyTorch installed here.
  prefix=$("$here/scripts/deps.sh")
  site=/tmp/fj-site
  python3 -m pip install -q --no-index --no-deps --target "$site" "$here"/.whl/*.whl
  export PYTHONPATH=$site
  t0=$(date +%s)
  CMAKE_ARGS="${prefix:+-DCMAKE_PREFIX_PATH=$prefix -DCMAKE_INCLUDE_PATH=$prefix/include}" \
    python3 -m pip install -v --no-build-isolation --no-deps --no-index --target "$site" "$here" \
    >"$out/pip.log" 2>&1 || { tail -60 "$out/pip.log"; exit 1; }
  echo "pip install .: $(( $(date +%s) - t0 )) s"
  [ -n "$prefix" ] && export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  (cd /tmp && python3 -m pytest -q -rs "$here/python/tests" ${2:+-k "$2"} 2>&1) | tee "$out/pytest.log" | tail -60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  exit $status
fi
t0=$(date +%s)
"$here/scripts/build.sh" >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
fj=$BUILD_DIR/fusejit
"$fj" info
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
if [ "$what" = backward ]; then
  # The backward pass: its regression sweep, then a training step's layer against its 3 GEMMs.
  if [ "${BWD_CHECK:-1}" = 1 ]; then
    "$fj" check --backward --sweep full -v 2>&1 | tee "$out/check-backward.log" | tail -12 || status=1
  fi
  : >"$out/bench-backward.log"
  for shape in ${BWD_SHAPES:-1024x8192x8192 16384x4096x4096 4096x4096x4096 128x512x1024}; do
    for dtype in ${BWD_DTYPES:-bf16 fp16}; do
      "$fj" bench --backward --shape $shape --dtype $dtype --mode train 2>&1 |
        tee -a "$out/bench-backward.log" | tail -7
    done
  done
fi
if [ "$what" = soak ]; then
  python3 "$here/scripts/cache_soak.py" "$fj" --cases "${SOAK_CASES:-2000}" --pool "${SOAK_POOL:-300}" \
    --out "$out" 2>&1 | tee "$out/soak.log" || status=1
fi
if [ "$what" = host ]; then
  "$BUILD_DIR/bench/fusejit_host_bench" ${HOST_ARGS:-} --out "$out/host_cost.json" 2>&1 |
    tee "$out/host_cost.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$what" = ab ]; then
  base_build=/tmp/fj-base
  if [ ! -x "$base_build/fusejit" ]; then
    cp -r "$here/.deps" "$here/.baseline/" 2>/dev/null
    BUILD_DIR=$base_build "$here/.baseline/scripts/build.sh" >"$out/build-base.log" 2>&1 ||
      { tail -30 "$out/build-base.log"; exit 1; }
  fi
  shapes=${AB_SHAPES:-1024x8192x8192,4096x4096x4096,128x512x1024,65536x256x64}
  for round in 1 2; do
    for side in base new; do
      bin=$fj; [ $side = base ] && bin=$base_build/fusejit
      echo "== $side, round $round"
      FUSEJIT_CACHE_DIR=/tmp/fj-cache-$side python3 "$here/scripts/bench_table.py" "$bin" \
        --shapes "$shapes" --dtypes bf16 --modes train,eval 2>&1 | tee -a "$out/ab-$side.log"
    done
  done
fi
exit $status
