#!/usr/bin/env bash
# Proves the warpspec kernels run on the Hopper tensor-core path: compiles one kernel set per
# 16-bit dtype and tf32 for sm_90a into a scratch cache, pulls the cubin out of each entry (it
# follows the entry header) and counts HGMMA / UTMALDG instructions in its SASS (cuobjdump).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fj=${1:-${BUILD_DIR:-$here/build}/fusejit}
dir=$(mktemp -d)
"$fj" compile --arch sm_90a --shapes 1024x8192x8192 --dtypes bf16,fp16,tf32 --modes train,eval \
  --variant warpspec --cache-dir "$dir" >/dev/null
printf '%-34s %7s %8s\n' entry HGMMA UTMALDG
for f in "$dir"/*.fjc; do
  python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); open(sys.argv[2],"wb").write(d[d.index(b"\x7fELF"):])' "$f" "$dir/k.cubin"
  sass=$(cuobjdump -sass "$dir/k.cubin")
  printf '%-34s %7s %8s\n' "$(basename "$f")" "$(grep -c HGMMA <<<"$sass" || true)" \
    "$(grep -c UTMALDG <<<"$sass" || true)"
done
rm -rf "$dir"
