#!/usr/bin/env python3
"""Runs `fusejit bench --json` for every (variant, shape, dtype, mode) asked and prints one
markdown table: fused op vs the bare cuBLASLt GEMM (and the cuBLASLt reference path), all
measured side by side in the same process.

    scripts/bench_table.py FUSEJIT --shapes 1024x8192x8192,... --dtypes bf16,fp32 \
        --modes train,eval --variants auto,tiled [--json out.json]

--variants also takes kernel config keys (warpspec.128x128x64.c2.s5.g8.cl1.p1.pp): each one is
forced with `fusejit bench --config` on every problem it can run.
"""
import argparse, json, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("fusejit")
ap.add_argument("--shapes", required=True)
ap.add_argument("--dtypes", default="bf16")
ap.add_argument("--modes", default="train,eval")
ap.add_argument("--variants", default="auto")
ap.add_argument("--json")
a = ap.parse_args()
rows, raw = [], []
for variant in a.variants.split(","):
    cmd = [a.fusejit, "bench", "--json", "--shapes", a.shapes, "--dtypes", a.dtypes,
           "--modes", a.modes] + (["--config", variant] if "." in variant else ["--variant", variant])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1) or not p.stdout.strip():
        print(f"bench failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}", file=sys.stderr)
        continue
    out = json.loads(p.stdout)
    raw.append(out)
    for r in out["results"]:
        sys_ = {s["system"]: s for s in r["systems"]}
        f, g, ref = sys_.get("fused", {}), sys_.get("gemm", {}), sys_.get("reference", {})
        rows.append((r.get("shape"), r.get("dtype"), r.get("mode"), variant,
                     f.get("detail", f.get("error", "")).split(" ")[0], f.get("ms"), g.get("ms"),
                     ref.get("ms")))
print("\n| shape | dtype | mode | variant | config | fused ms | cuBLASLt GEMM ms | fused / GEMM | reference ms |")
print("|---|---|---|---|---|---|---|---|---|")
for shape, dt, mode, var, cfg, fm, gm, rm in rows:
    ratio = f"{fm / gm:.3f}" if fm and gm else "-"
    fmt = lambda v: f"{v:.4f}" if isinstance(v, (int, float)) else "-"
    print(f"| {shape} | {dt} | {mode} | {var} | {cfg} | {fmt(fm)} | {fmt(gm)} | {ratio} | {fmt(rm)} |")
if a.json:
    with open(a.json, "w") as fh:
        json.dump(raw, fh, indent=1)
