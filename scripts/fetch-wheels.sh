#!/usr/bin/env bash
# Downloads the Python package's build backend and test runner as wheels into .whl/ (git-ignored)
# so they can travel to a machine without a package registry (the device tool's `carry`);
# `scripts/device.sh python` installs them there and builds the package with pip. Also
# matplotlib and its dependencies into .whl/report/, for scripts/report.sh's charts.
#   scripts/fetch-wheels.sh [python version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version "${1:-3.12}" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  scikit-build-core nanobind packaging pathspec pytest pluggy iniconfig pygments
mkdir -p .whl/report
python3 -m pip download --only-binary=:all: --python-version "${1:-3.12}" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl/report matplotlib
ls -1 .whl .whl/report
