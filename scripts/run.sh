#!/usr/bin/env bash
# The main job: install, build, show the GPU and cache, compile the seed shapes' kernels ahead
# of time, and (on a GPU) run the example application.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/build.sh"
fj="${BUILD_DIR:-$here/build}/fusejit"
"$fj" info
arch=()
"$fj" info | grep -q '^gpu [0-9]' || arch=(--arch sm_90a)
"$fj" compile "${arch[@]}" --shapes 1024x8192x8192,16384x4096x4096,128x512x1024 \
  --dtypes bf16,fp16,fp32 --modes train,eval
for example in train_eval train_sgd; do
  bin="${BUILD_DIR:-$here/build}/examples/$example/$example"
  if [ -x "$bin" ]; then "$bin"; fi
done
