#!/usr/bin/env bash
# python/tests (fusejit.torch against PyTorch) where the package and PyTorch are importable
# (after `pip install .`; scripts/device.sh python does both on the GPU machine); exit 77 (ctest:
# skipped) saying what is missing otherwise.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if ! why=$(python3 -c "import torch, fusejit._C" 2>&1); then
  echo "skipped: fusejit.torch needs PyTorch and the installed package (pip install .): ${why##*$'\n'}"
  exit 77
fi
cd /tmp && exec python3 -m pytest -q -rs "$here/python/tests" "$@"
