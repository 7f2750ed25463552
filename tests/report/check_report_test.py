#!/usr/bin/env python3
"""Self-test of scripts/check_report.py: it passes a consistent report and fails each kind of
drift the benchmark docs can suffer.

    tests/report/check_report_test.py      exit 0: every case behaves; 1: names each that did not

A small synthetic report (2 shapes, 2 dtypes, both modes, one system that could not run, a
backward entry, 2 autotune and 3 jit entries) is rendered with --no-charts; the charts are
stand-in 1x1 PNGs written here (no matplotlib in CI) carrying the sha256 of report.json. Then one
thing at a time is broken in a copy, and the checker must exit 1 and name the file at fault.
Standard library only.
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RENDER = os.path.join(ROOT, "scripts", "report_render.py")
CHECK = os.path.join(ROOT, "scripts", "check_report.py")
PNG_KEY = "fusejit-report-sha256"

SYSTEMS = {
    "fusejit": "fusejit, the autotuned config",
    "fusejit_heuristic": "fusejit, the heuristic's config",
    "fusejit_tiled": "fusejit, the tiled kernel",
    "linear": "F.linear (cuBLAS GEMM + bias), then the rest in eager PyTorch",
    "eager": "the reference module in eager PyTorch",
    "compile": "torch.compile of the reference module",
}


def ok(ms, detail="x"):
    return {"median_ms": ms, "samples": 50, "detail": detail}


def synthetic():
    """The raw report as the driver would write it: no charts list yet."""
    forward = []
    for dtype, scale in (("bf16", 1.0), ("fp32", 3.0)):
        for shape, base in (("1024x8192x8192", 0.2), ("256x512x1024", 0.011)):
            for mode in ("train", "eval"):
                lin = round(base * scale, 6)
                forward.append({"shape": shape, "dtype": dtype, "mode": mode, "results": {
                    "fusejit": ok(round(lin * 0.95, 6), "warpspec.128x128x64.c2.s5"),
                    "fusejit_heuristic": ok(round(lin * 1.02, 6)),
                    "fusejit_tiled": ok(round(lin * 1.3, 6)),
                    "linear": ok(lin),
                    "eager": ok(round(lin * 1.9, 6)),
                    "compile": ok(round(lin * 1.4, 6)),
                }})
    # One system that could not run: the table shows n/a and the chart leaves the bar out.
    forward[1]["results"]["compile"] = {"error": "torch.compile: out of memory"}
    return {
        "schema": "fusejit-report/1",
        "meta": {"gpu": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sm_count": 132, "driver": "580.65",
                 "cuda": "13.0", "torch": "2.11.0+cu130", "python": "3.12.3",
                 "fusejit": "0.1.0 (git abc1234)", "date": "2026-11-25",
                 "command": "scripts/report.sh", "clocks": "sm 1980 MHz\nmem 2619 MHz",
                 "timing": "CUDA events, median of 50 after 10 warm-up", "seconds": 512.3},
        "systems": SYSTEMS,
        "forward": forward,
        "backward": [{"shape": "1024x8192x8192", "dtype": "bf16", "mode": "train", "results": {
            "fusejit": ok(0.61, "tiled.128x128x32"), "linear": ok(0.66), "eager": ok(1.2),
            "compile": ok(0.9)}}],
        "autotune": [
            {"shape": "1024x8192x8192", "dtype": "bf16", "mode": "train", "seconds": 12.5,
             "winner": "warpspec.128x128x64.c2.s5", "candidates": 48},
            {"shape": "256x512x1024", "dtype": "fp32", "mode": "eval", "seconds": 3.25,
             "winner": "tiled.64x64x32", "candidates": 20},
        ],
        "jit": [
            {"name": "cold compile", "value": 850.0, "unit": "ms", "detail": "NVRTC, one kernel"},
            {"name": "warm cache load", "value": 420.5, "unit": "us", "detail": "disk cache"},
            {"name": "kernels compiled", "value": 3, "unit": "count", "detail": "not a time"},
        ],
    }


def chunk(kind, payload):
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))


def tiny_png(sha):
    """A valid 1x1 grey PNG with the report's hash in tEXt, as the renderer's charts carry it."""
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"tEXt", PNG_KEY.encode() + b"\0" + sha.encode())
            + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


def run(*args):
    p = subprocess.run([sys.executable] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def json_path(d):
    return os.path.join(d, "report.json")


def load(d):
    with open(json_path(d), encoding="utf-8") as f:
        return json.load(f)


def sha_of(d):
    with open(json_path(d), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_pngs(d, sha=None):
    for c in load(d)["charts"]:
        with open(os.path.join(d, c["file"]), "wb") as f:
            f.write(tiny_png(sha or sha_of(d)))


def rewrite_json(d, report):
    """report.json in the renderer's canonical bytes, so only the edit itself is wrong."""
    with open(json_path(d), "w", encoding="utf-8") as f:
        f.write(json.dumps(report, indent=1, sort_keys=True) + "\n")


def make_base(tmp):
    raw = os.path.join(tmp, "raw.json")
    with open(raw, "w", encoding="utf-8") as f:
        json.dump(synthetic(), f)
    d = os.path.join(tmp, "base")
    rc, out = run(RENDER, d, "--raw", raw, "--no-charts")
    assert rc == 0, f"report_render.py --no-charts failed:\n{out}"
    write_pngs(d)
    return d


# ---- the breakages: each edits a copy of the good report and names what must be reported ------

def edit_md_figure(d):
    with open(os.path.join(d, "report.md"), encoding="utf-8") as f:
        md = f.read()
    # The bf16 train fusejit time of the big shape: 0.2 * 0.95.
    assert "| 0.1900 |" in md, "the synthetic report.md lacks the figure this case edits"
    with open(os.path.join(d, "report.md"), "w", encoding="utf-8") as f:
        f.write(md.replace("| 0.1900 |", "| 0.1800 |", 1))
    return ["report.md: line"]


def edit_json_median(d):
    r = load(d)
    r["forward"][0]["results"]["fusejit"]["median_ms"] = 0.1234
    rewrite_json(d, r)
    return ["report.md: line", "forward_bf16.png: tEXt " + PNG_KEY]


def delete_png(d):
    os.remove(os.path.join(d, "forward_fp32.png"))
    return ["forward_fp32.png: missing"]


def wrong_png_hash(d):
    with open(os.path.join(d, "jit.png"), "wb") as f:
        f.write(tiny_png(hashlib.sha256(b"other data").hexdigest()))
    return ["jit.png: tEXt " + PNG_KEY]


def undescribed_system(d):
    r = load(d)
    r["forward"][2]["results"]["cutlass"] = {"median_ms": 0.3, "samples": 5, "detail": ""}
    rewrite_json(d, r)
    write_pngs(d)  # only the data is wrong, not the chart hashes
    return ["forward[2].results.cutlass: system id not described"]


def negative_median(d):
    r = load(d)
    r["forward"][3]["results"]["eager"]["median_ms"] = -0.5
    rewrite_json(d, r)
    write_pngs(d)
    return ["forward[3].results.eager.median_ms"]


CASES = [
    ("a figure edited in report.md", edit_md_figure),
    ("a median_ms edited in report.json, not re-rendered", edit_json_median),
    ("a chart PNG deleted", delete_png),
    ("a chart PNG whose hash is of other data", wrong_png_hash),
    ("a forward result whose system id is not in \"systems\"", undescribed_system),
    ("a negative median_ms", negative_median),
]


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = make_base(tmp)
        rc, out = run(CHECK, base)
        if rc != 0:
            failures.append(f"the consistent synthetic report does not pass:\n{out}")
        for i, (name, breaking) in enumerate(CASES):
            d = os.path.join(tmp, f"case{i}")
            shutil.copytree(base, d)
            expected = breaking(d)
            rc, out = run(CHECK, d)
            if rc != 1:
                failures.append(f"{name}: check_report.py exited {rc}, expected 1:\n{out}")
                continue
            for text in expected:
                if text not in out:
                    failures.append(f"{name}: the output does not name {text!r}:\n{out}")
        missing = os.path.join(tmp, "empty")
        os.makedirs(missing)
        rc, out = run(CHECK, missing)
        if rc != 1 or "report.json: missing" not in out:
            failures.append(f"a directory without report.json: exit {rc}, output:\n{out}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print(f"check_report self-test: the good report passes; all {len(CASES) + 1} breakages fail")
    return 0


if __name__ == "__main__":
    sys.exit(main())
