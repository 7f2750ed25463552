#!/usr/bin/env bash
# Installs what is missing, configures and builds into ${BUILD_DIR:-build}. Extra arguments go
# to cmake's configure step (e.g. -DFUSEJIT_SANITIZE=address,undefined).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$here/build}
prefix=$("$here/scripts/deps.sh")
args=(-S "$here" -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DFUSEJIT_WERROR=ON)
[ -n "$prefix" ] && args+=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_INCLUDE_PATH="$prefix/include")
cmake "${args[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
