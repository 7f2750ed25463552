#!/usr/bin/env bash
# The CPU test suite under sanitizers, each in its own build tree (see CMakePresets.json):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer) in build-asan. This
#         tree also builds the libFuzzer targets (tests/fuzz); their ctests (label fuzz) run each
#         fuzzer for a fixed number of inputs from its seed corpus.
#   tsan  ThreadSanitizer in build-tsan.
# Any report fails the run: UBSan does not recover, TSan halts on the first report, and
# ASan/LSan exit non-zero. tests/sanitizers/*.supp silence only the uninstrumented CUDA
# libraries (see the comments there).
#
#   scripts/sanitize.sh [asan] [tsan]      (default: both, asan first)
#   CTEST_ARGS="-R fault" scripts/sanitize.sh asan           # more ctest arguments
#   SANITIZE_EXCLUDE="nvrtc_all_archs" scripts/sanitize.sh   # a regex of tests to leave out
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
prefix=$(scripts/deps.sh)

# libFuzzer and the sanitizer runtimes used here come with Debian's clang (clang-14 on
# bookworm); GCC has no libFuzzer.
clang=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "installing: clang libclang-rt-dev" >&2
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang libclang-rt-dev >&2
  clang=$(command -v clang++)
fi

presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(asan tsan)
jobs=$(nproc)
for preset in "${presets[@]}"; do
  case "$preset" in asan | tsan) ;; *) echo "usage: $0 [asan] [tsan]" >&2; exit 2 ;; esac
  args=(--preset "$preset" -DCMAKE_CXX_COMPILER="$clang")
  [ -n "$prefix" ] && args+=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_INCLUDE_PATH="$prefix/include")
  t0=$(date +%s)
  cmake "${args[@]}" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  t1=$(date +%s)
  # The package test installs the library and links the example without sanitizer flags, which
  # a sanitized libfusejit.so cannot serve; it runs in the normal build. Given here rather than
  # only in the preset because a -E on the command line replaces the preset's.
  exclude='^cpu_package_example$'
  [ -n "${SANITIZE_EXCLUDE:-}" ] && exclude="$exclude|$SANITIZE_EXCLUDE"
  # shellcheck disable=SC2086  # CTEST_ARGS is a list of words on purpose
  ctest --preset "$preset" -j "$jobs" -E "$exclude" ${CTEST_ARGS:-}
  echo "sanitize $preset: build $((t1 - t0)) s, tests $(($(date +%s) - t1)) s"
done
