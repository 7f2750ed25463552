#!/usr/bin/env bash
# The benchmark report in one run on a GPU machine: build, compile every kernel the autotuner
# times, autotune the report's problems into a fresh tuning database, time fusejit against
# PyTorch side by side (bench/report.py), measure JIT latency and host cost, and render
# docs/report/ (scripts/report_render.py; scripts/check_report.py checks it in CI).
#   scripts/report.sh [DEST, default docs/report]
# Needs: CUDA toolkit, PyTorch, the C++ dependencies (scripts/deps.sh; .deps/ offline), and the
# wheels of scripts/fetch-wheels.sh in .whl/ where there is no package registry (nanobind for
# the extension; .whl/report/ for matplotlib). A `cache/` of kernels compiled elsewhere for
# this GPU (`fusejit compile --variant all --arch sm_90a ...`) saves compile time; its tuning
# database, if any, is not used.
# Subsets for a quick run: REPORT_SHAPES, REPORT_DTYPES, REPORT_MODES, REPORT_BWD_DTYPES (comma
# lists), REPORT_TUNE_DTYPES, REPORT_COMPILE_DTYPES (default bf16: see below), REPORT_GIT (the
# commit to record, where .git is not this tree's), REPORT_STEPS (default "build kernels autotune jit
# measure host render"). Logs and intermediate JSON go to $OUT (or /tmp/fj-report/logs).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$here/docs/report}
work=/tmp/fj-report
logs=${OUT:-$work/logs}
mkdir -p "$work" "$logs"
export PATH=/usr/local/cuda/bin:$PATH
export BUILD_DIR=${BUILD_DIR:-/tmp/fj-report-build}
shapes=${REPORT_SHAPES:-1024x8192x8192,16384x4096x4096,4096x4096x4096,8192x12288x3072,2048x2048x512,128x512x1024,65536x256x64,777x1536x2050,1000x1001x1003,4097x4095x129}
dtypes=${REPORT_DTYPES:-bf16,fp16,tf32,fp32}
modes=${REPORT_MODES:-train,eval}
bwd_dtypes=${REPORT_BWD_DTYPES-bf16}
# The tuner times ~20 candidates per problem (seconds each problem): the report tunes these
# dtypes' problems and plans the others as a user's Plan would with that database.
tune_dtypes=${REPORT_TUNE_DTYPES-bf16}
# torch.compile costs seconds per graph: these dtypes only.
compile_dtypes=${REPORT_COMPILE_DTYPES-bf16}
steps=" ${REPORT_STEPS:-build kernels autotune jit measure host render} "
cache=$work/cache
fj=$BUILD_DIR/fusejit
t_start=$(date +%s)
say() { echo "[$(($(date +%s) - t_start)) s] $*"; }
step() { [[ "$steps" == *" $1 "* ]]; }
fail() { say "FAILED: $*"; exit 1; }

# Parameters stored like the input for the 16-bit types (the seeds' bf16 variant: model.to(bf16)),
# fp32 otherwise: the problems the measure step's models pose, so the tuned entries are theirs.
param_dtype() { case $1 in bf16 | fp16) echo same ;; *) echo fp32 ;; esac; }
only_in() { # the dtypes of list $1 that list $2 holds
  local out=""
  for d in ${1//,/ }; do [[ ",$2," == *",$d,"* ]] && out+="${out:+ }$d"; done
  echo "$out"
}

site=$work/site
prefix=$("$here/scripts/deps.sh")  # the C++ dependencies: system, or .deps unpacked (offline)
export PYTHONPATH=$site:$here/bench
if step build; then
  say "build (Release: CLI, host benchmark; the Python package with pip)"
  rm -rf "$site" && mkdir -p "$site"
  if compgen -G "$here/.whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$site" "$here"/.whl/*.whl ||
      fail "pip install .whl"
  fi
  if ! python3 -c "import matplotlib" 2>/dev/null && compgen -G "$here/.whl/report/*.whl" >/dev/null; then
    skip=()
    python3 -c "import numpy" 2>/dev/null && skip=(-not -name 'numpy-*')
    mapfile -t wheels < <(find "$here/.whl/report" -name '*.whl' "${skip[@]}")
    python3 -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}" ||
      fail "pip install .whl/report"
  fi
  # The package exactly as `scripts/device.sh python` (and a user) builds it: pip, in parallel
  # with the CLI and the host benchmark.
  CMAKE_ARGS="${prefix:+-DCMAKE_PREFIX_PATH=$prefix -DCMAKE_INCLUDE_PATH=$prefix/include}" \
    python3 -m pip install -v --no-build-isolation --no-deps --no-index --target "$site" "$here" \
    >"$logs/pip.log" 2>&1 &
  pip_pid=$!
  BUILD_TYPE=Release BUILD_TARGETS="fusejit_cli fusejit_host_bench" "$here/scripts/build.sh" \
    -DFUSEJIT_WERROR=OFF >"$logs/build.log" 2>&1 || { tail -40 "$logs/build.log"; fail build; }
  wait $pip_pid || { tail -40 "$logs/pip.log"; fail "pip install ."; }
fi
# The package's libfusejit.so finds the C++ dependencies unpacked from .deps (an offline
# machine) only through LD_LIBRARY_PATH; with it set, torch must be imported before fusejit
# (the other order aborts in this setup: PyTorch then resolves libraries there too).
[ -n "$prefix" ] && export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
"$fj" info | tee "$logs/info.txt"
python3 -c "import torch, fusejit.torch
assert fusejit._C is not None, fusejit._C_import_error
print('fusejit', fusejit.__version__, 'torch', torch.__version__)" || fail "import fusejit.torch"

if step kernels; then
  say "kernels: every candidate the autotuner times, into a fresh cache"
  rm -rf "$cache" && mkdir -p "$cache"
  cp "$here"/cache/*.fjc "$cache/" 2>/dev/null
  # Every call at once (each runs one NVRTC job per core; together they keep the cores busy
  # through each call's slow tail), logs concatenated afterwards.
  jobs=()
  compile() { # name, then compile's arguments
    local name=$1
    shift
    "$fj" compile --shapes "$shapes" --cache-dir "$cache" "$@" >"$work/compile-$name.log" 2>&1 &
    jobs+=("$!:$name")
  }
  for d in ${dtypes//,/ }; do
    # What the measure step's Plans load: the heuristic's pick and each variant forced (a
    # variant that cannot run some problem fails its call; measure then reports it).
    for v in auto tiled warpspec; do
      compile "$d-$v" --dtypes "$d" --modes "$modes" --param-dtype "$(param_dtype "$d")" --variant $v
    done
  done
  for d in $(only_in "$tune_dtypes" "$dtypes"); do
    compile "$d-all" --dtypes "$d" --modes "$modes" --param-dtype "$(param_dtype "$d")" --variant all
  done
  for d in ${bwd_dtypes//,/ }; do
    compile "$d-backward" --dtypes "$d" --modes train --param-dtype "$(param_dtype "$d")" --backward
  done
  for j in "${jobs[@]}"; do
    wait "${j%%:*}" || say "  compile ${j#*:}: some kernel set failed (compile.log)"
  done
  cat "$work"/compile-*.log >"$logs/compile.log"
  grep -c '^  miss' "$logs/compile.log" | xargs echo "  compiled here:"
fi
export FUSEJIT_CACHE_DIR=$cache
unset FUSEJIT_AUTOTUNE

if step autotune; then
  say "autotune (fresh tuning database)"
  rm -rf "$cache/tuning"
  rm -f "$work"/autotune-*.json
  : >"$logs/autotune.log"
  for d in $(only_in "$tune_dtypes" "$dtypes"); do
    "$fj" autotune --shapes "$shapes" --dtypes "$d" --modes "$modes" --param-dtype "$(param_dtype "$d")" \
      --cache-dir "$cache" --json >"$work/autotune-$d.json" 2>>"$logs/autotune.log" ||
      fail "autotune (see autotune.log)"
  done
  python3 -c 'import json,sys; r=[x for f in sys.argv[2:] for x in json.load(open(f))["results"]]
json.dump({"results": r}, open(sys.argv[1], "w"), indent=1)' "$work/autotune.json" "$work"/autotune-*.json
fi

if step jit; then
  say "JIT latency"
  python3 "$here/bench/report.py" jit --out "$work/jit.json" 2>&1 | tee "$logs/jit.log" | tail -3
  [ "${PIPESTATUS[0]}" = 0 ] || fail jit
fi

if step measure; then
  say "measure (one process: fusejit, torch.mm, F.linear, eager, torch.compile)"
  python3 "$here/bench/report.py" measure --out "$work/measure.json" --shapes "$shapes" \
    --dtypes "$dtypes" --modes "$modes" --backward-dtypes "$bwd_dtypes" \
    --compile-dtypes "$compile_dtypes" 2>&1 | tee "$logs/measure.log" |
    grep -v Warning
  [ "${PIPESTATUS[0]}" = 0 ] || fail measure
fi

if step host; then
  say "host cost (C++ API)"
  "$BUILD_DIR/bench/fusejit_host_bench" --quick --only 0123 --out "$work/host.json" \
    >"$logs/host.log" 2>&1 || say "host benchmark failed (see host.log); report goes on without it"
fi

if step render; then
  say "render into $dest"
  clocks=$(nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv,noheader)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
  cuda=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  # REPORT_GIT: the commit, where this tree's .git is not the one it was checked out from
  # (a copy made for a remote machine).
  git=${REPORT_GIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}
  args=(--out "$work/raw.json" --measure "$work/measure.json" --driver "$driver" --cuda "$cuda"
    --clocks "SM/max SM/mem MHz, power limit: $clocks" --git "$git" --command "scripts/report.sh"
    --seconds $(($(date +%s) - t_start)))
  [ -f "$work/jit.json" ] && args+=(--jit "$work/jit.json")
  [ -f "$work/autotune.json" ] && args+=(--autotune "$work/autotune.json")
  [ -f "$work/host.json" ] && args+=(--host "$work/host.json")
  python3 "$here/bench/report.py" assemble "${args[@]}" || fail assemble
  cp "$work"/*.json "$logs/" 2>/dev/null
  mkdir -p "$dest"
  charts=()
  python3 -c "import matplotlib" 2>/dev/null || {
    charts=(--no-charts)
    say "no matplotlib here: charts skipped (render them elsewhere: scripts/report_render.py $dest)"
  }
  python3 "$here/scripts/report_render.py" "$dest" --raw "$work/raw.json" "${charts[@]}" || fail render
  [ "${charts[*]}" = "" ] && python3 "$here/scripts/check_report.py" "$dest"
fi
say "done"
