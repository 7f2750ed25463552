#!/usr/bin/env bash
# fusejit.torch without a GPU (python/tests/test_torch_cpu.py) in a virtual environment of its
# own: a pinned PyTorch from PyPI, pytest, the build backend, and the package built from this
# tree by `pip install .` (incremental in build-py/ after the first build). PyPI's Linux wheel
# of PyTorch brings CUDA libraries that stay unused here (about 5 GB installed, 2 min to make);
# the CPU-only wheels' index is not reachable from CI. The environment is kept and reused while
# it was made for the same Python, PyTorch and packages; a run that must make it and cannot
# reach PyPI exits 77 (ctest: skipped) saying so. ctest runs it as cpu_python_package.
#   scripts/python_cpu_tests.sh [pytest arguments]
#   FUSEJIT_CPU_TORCH=2.11.0   another PyTorch (default: the oldest supported, 2.4.1, where
#                              PyPI has it for this Python)
#   FUSEJIT_CPU_VENV=DIR       the environment (default /tmp/fusejit-cpu-py<X.Y>-torch<version>)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || {
  echo "no $py"
  exit 1
}
# The oldest PyTorch the package supports (>= 2.4) that PyPI has for this Python: the GPU tests
# run a recent one, so this end of the range is covered here.
case "$pyver" in
  3.9 | 3.10 | 3.11 | 3.12) default_torch=2.4.1 ;;
  3.13) default_torch=2.5.1 ;;
  3.14) default_torch=2.9.1 ;;
  *) default_torch="" ;;
esac
torch_version=${FUSEJIT_CPU_TORCH:-$default_torch}
if [ -z "$torch_version" ]; then
  echo "no PyTorch pinned for Python $pyver here: set FUSEJIT_CPU_TORCH to a version PyPI has"
  exit 1
fi
venv=${FUSEJIT_CPU_VENV:-/tmp/fusejit-cpu-py$pyver-torch$torch_version}
base=$("$py" -c 'import sys; print(sys.base_prefix)')
reqs=("torch==$torch_version" numpy "pytest>=8" "scikit-build-core>=0.10" "nanobind>=2.0")
stamp="python $base $pyver; ${reqs[*]}"

# One run at a time per environment (another checkout's ctest may share it).
exec 9>"$venv.lock"
if ! flock -w 1200 9; then
  echo "$venv is locked by another run for 20 min; giving up"
  exit 1
fi

if [ "$(cat "$venv/.fusejit-stamp" 2>/dev/null)" != "$stamp" ]; then
  index=$("$py" -m pip config get global.index-url 2>/dev/null || true)
  index=${PIP_INDEX_URL:-${index:-https://pypi.org/simple}}
  if ! "$py" - "$index" <<'EOF' >/dev/null 2>&1; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=30).read(1)
EOF
    echo "skipped: the package index ($index) is not reachable to install PyTorch into $venv"
    exit 77
  fi
  echo "making $venv: ${reqs[*]}"
  t0=$(date +%s)
  rm -rf "$venv"
  log=$venv.log
  if ! { "$py" -m venv "$venv" &&
    "$venv/bin/python" -m pip install --no-cache-dir -q "${reqs[@]}"; } >"$log" 2>&1; then
    tail -30 "$log"
    echo "could not make $venv (log above, in $log)"
    exit 1
  fi
  # Written last: an interrupted run leaves an environment without it, made anew next time.
  echo "$stamp" >"$venv/.fusejit-stamp"
  echo "made $venv in $(($(date +%s) - t0)) s"
fi
vpy=$venv/bin/python

# The package as a user builds it. No build isolation: the backend comes from the environment,
# which keeps the paths CMake sees stable, so build-py/ rebuilds only what changed.
t0=$(date +%s)
log=$venv/pip-install.log
if ! "$vpy" -m pip install --no-build-isolation --no-deps --force-reinstall "$here" \
  >"$log" 2>&1; then
  tail -60 "$log"
  echo "pip install . failed (log above, in $log)"
  exit 1
fi
echo "pip install .: $(($(date +%s) - t0)) s"
# Everything must import here: a missing piece would only skip the tests.
if ! "$vpy" -c "import torch, fusejit, fusejit.torch
assert fusejit._C is not None, fusejit._C_import_error
print('torch', torch.__version__, '| fusejit', fusejit.__version__)"; then
  echo "the installed package does not import"
  exit 1
fi
# Outside the tree (and not /tmp, where a stray folder could shadow a package).
cd "$venv" && exec "$vpy" -m pytest -q -rs -p no:cacheprovider \
  "$here/python/tests/test_torch_cpu.py" "$@"
