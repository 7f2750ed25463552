#!/usr/bin/env bash
# Downloads the build's Debian packages into .deps/ (git-ignored) so they can travel to a
# machine without a package registry (the device tool's `carry`); scripts/deps.sh unpacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 doctest-dev nlohmann-json3-dev \
  libcli11-dev libxxhash-dev 2>&1 | grep -v '^W:' || true
ls -1
