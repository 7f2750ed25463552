#!/usr/bin/env bash
# Makes the build dependencies available and prints the CMAKE_PREFIX_PATH to use (may be empty).
#  - A machine with Debian/Ubuntu packages and a registry: apt-get installs what is missing.
#  - A machine without a registry (the GPU machine): unpacks the .deb files that
#    scripts/fetch-deps.sh downloaded into .deps/ (carried there) into /tmp/fusejit-deps.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
pkgs="libspdlog-dev libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev libxxhash-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -z "$missing" ]; then exit 0; fi
if ls "$here"/.deps/*.deb >/dev/null 2>&1; then
  prefix=/tmp/fusejit-deps
  if [ ! -f "$prefix/.unpacked" ]; then
    mkdir -p "$prefix"
    for f in "$here"/.deps/*.deb; do dpkg -x "$f" "$prefix"; done
    touch "$prefix/.unpacked"
  fi
  echo "$prefix/usr"
  exit 0
fi
echo "installing:$missing" >&2
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
$sudo apt-get update -qq >&2 || true
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >&2
