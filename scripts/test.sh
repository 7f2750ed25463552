#!/usr/bin/env bash
# Installs, builds and runs every test this machine can run: CPU tests always; GPU tests run
# when a GPU is usable and report "skipped" otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/build.sh"
cd "${BUILD_DIR:-$here/build}"
ctest --output-on-failure -j "$(nproc)" "$@"
