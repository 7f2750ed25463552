#!/usr/bin/env bash
# One call on a multi-GPU machine (device tool, kind nvidia-h200-x2 or larger): synchronized
# BatchNorm statistics across GPUs (Problem::stat_ranks). Builds (Release, tests on), then runs
# the multi-GPU tests (`ctest -L gpu_multi`, which also dumps one case for the PyTorch
# comparison), examples/sync_bn, bench/sync_stats_bench.cpp, bench/sync_bn_torch.py --bench and
# --compare on the dump; logs under $OUT, a short table last. Carry: .deps
# (scripts/fetch-deps.sh) and cache, as for scripts/device.sh.
#   scripts/device_multi.sh [all|tests|example|bench|torch]
# NCCL: the CUDA toolkit's (nccl.h beside cuda.h), else the one PyTorch's wheels installed
# (python package nvidia.nccl), else nothing multi-GPU gets built and the table says so.
set -uo pipefail
# NVLink multicast stays off on these machines, for NCCL, PyTorch's symmetric memory and NVSHMEM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/fusejit-out}
mkdir -p "$out"
what=${1:-all}
export PATH=/usr/local/cuda/bin:$PATH
export BUILD_DIR=/tmp/fj-build
export FUSEJIT_CACHE_DIR=$here/cache
dump=/tmp/fj-sync-dump
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader |
  tee "$out/gpu.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1

declare -a rows=()
status=0
# record STEP RC SECONDS NOTE: 77 is "skipped" (too few GPUs, no driver), as ctest reads it.
record() {
  local result=ok
  if [ "$2" = 77 ]; then result=skipped; elif [ "$2" != 0 ]; then result="FAILED($2)"; status=1; fi
  rows+=("$(printf '%-28s %-11s %6s s  %s' "$1" "$result" "$3" "$4")")
}
# run STEP LOG CMD...: runs CMD with its output in $out/LOG (and the last lines on the console);
# the table's note is the log's last line, or its lines matching $NOTE_GREP when that is set.
run() {
  local step=$1 log=$out/$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  "$@" >"$log" 2>&1
  rc=$?
  tail -25 "$log"
  local note
  if [ -n "${NOTE_GREP:-}" ]; then
    note=$(grep -E "$NOTE_GREP" "$log" | tr '\n' ' ')
  else
    note=$(grep -v '^\s*$' "$log" | tail -1)
  fi
  record "$step" "$rc" "$(( $(date +%s) - t0 ))" "${note:0:100}"
  return $rc
}

nccl_args=()
if [ ! -f /usr/local/cuda/include/nccl.h ]; then
  wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' \
    2>/dev/null || python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
    lib=$(find "$wheel/lib" -name 'libnccl.so*' | sort | head -1)
    nccl_args=(-DFUSEJIT_NCCL_INCLUDE_DIR="$wheel/include" -DFUSEJIT_NCCL_LIBRARY="$lib")
    echo "NCCL from PyTorch's wheel: $wheel"
  fi
fi
df -h /dev/shm >"$out/shm.txt" 2>&1  # NCCL's intra-node transports need room there
t0=$(date +%s)
# Release without -Werror: at -O3 GCC 12 reports a false -Wrestrict inside std::string's
# operator+ (codegen.cpp, kernel_set_problem_key); the warning-clean build is CI's job, not this.
BUILD_TYPE=Release BUILD_TARGETS="fusejit_cli gpu_multi_sync_stats gpu_sync_stats_one_rank sync_bn fusejit_sync_stats_bench" \
  "$here/scripts/build.sh" -DFUSEJIT_BUILD_TESTS=ON -DFUSEJIT_WERROR=OFF "${nccl_args[@]}" >"$out/build.log" 2>&1
rc=$?
record build "$rc" "$(( $(date +%s) - t0 ))" \
  "NCCL: $(grep -m1 '^FUSEJIT_NCCL_LIBRARY:' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | cut -d= -f2)"
if [ $rc != 0 ]; then
  tail -50 "$out/build.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi
"$BUILD_DIR/fusejit" info 2>&1 | tee "$out/info.txt" | head -20

if [ "$what" = all ] || [ "$what" = tests ]; then
  rm -rf "$dump"
  export FUSEJIT_SYNC_DUMP_DIR=$dump
  # The multi-GPU test and the one-rank test beside it (label gpu, one GPU).
  NOTE_GREP='cases passed|SKIPPED|tests passed' run "ctest -R sync_stats" multi-tests.log \
    ctest --test-dir "$BUILD_DIR" -R sync_stats --output-on-failure
  unset FUSEJIT_SYNC_DUMP_DIR
  grep -E 'cases passed' "$out/multi-tests.log"
  [ -f "$dump/manifest.json" ] && cp "$dump/manifest.json" "$out/sync-dump-manifest.json"
fi
if [ "$what" = all ] || [ "$what" = example ]; then
  run "examples/sync_bn" sync_bn.log "$BUILD_DIR/examples/sync_bn/sync_bn"
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  run "fusejit_sync_stats_bench" sync-stats-bench.log "$BUILD_DIR/bench/fusejit_sync_stats_bench"
fi
if [ "$what" = all ] || [ "$what" = torch ]; then
  run "sync_bn_torch.py --bench" torch-bench.log python3 "$here/bench/sync_bn_torch.py" --bench
  if [ -f "$dump/manifest.json" ]; then
    run "sync_bn_torch.py --compare" torch-compare.log \
      python3 "$here/bench/sync_bn_torch.py" --compare "$dump"
  else
    record "sync_bn_torch.py --compare" 77 0 "no dump (run the tests first: all or tests)"
  fi
fi

echo
echo "== synchronized statistics: fusejit (sync vs unsync) and PyTorch (SyncBatchNorm vs BatchNorm1d)"
[ -f "$out/sync-stats-bench.log" ] && sed -n '/^shape /,$p' "$out/sync-stats-bench.log"
[ -f "$out/torch-bench.log" ] && sed -n '/^shape /,$p' "$out/torch-bench.log"
[ -f "$out/torch-compare.log" ] && grep -E '^\s+(y|running|save)' "$out/torch-compare.log"
echo
printf '%-28s %-11s %8s  %s\n' step result time note
printf '%s\n' "${rows[@]}"
exit $status
