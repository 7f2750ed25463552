#!/usr/bin/env python3
"""Renders the benchmark report (docs/report) from the raw report.json a GPU run writes.

    scripts/report_render.py DIR [--raw RAW.json] [--no-charts]

bench/report.py measures; this script only lays the numbers out: DIR/report.json (canonical, with
the list of charts added), DIR/report.md, and one PNG per chart. Every figure in the markdown comes
from report.json through render_md(), a pure function of it, so scripts/check_report.py (CI, CPU,
no matplotlib) can render the markdown again and prove the committed page was not edited by hand or
left behind by a newer run. Each PNG carries the sha256 of the report.json it was drawn from in a
tEXt chunk (PNG_KEY), which lets the checker tie charts to the data without redrawing them.

The schema ("fusejit-report/1") is described in scripts/check_report.py, which enforces it.
"""
import argparse
import hashlib
import json
import math
import os
import re
import sys

SCHEMA = "fusejit-report/1"
PNG_KEY = "fusejit-report-sha256"
BASELINE = "linear"

# The forward table's ratio columns: (header, system id), each system's time over F.linear's.
RATIO_COLUMNS = [
    ("fusejit / F.linear", "fusejit"),
    ("heuristic / F.linear", "fusejit_heuristic"),
    ("tiled / F.linear", "fusejit_tiled"),
    ("warpspec / F.linear", "fusejit_warpspec"),
    ("mm / F.linear", "mm"),
]
# The systems a forward chart draws next to the F.linear line, with their legend names.
CHART_SYSTEMS = [("fusejit", "fusejit"), ("eager", "PyTorch eager"),
                 ("compile", "torch.compile")]
# Microseconds per unit; a jit entry in any other unit is not a latency and is not charted.
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "\u00b5s": 1.0, "\u03bcs": 1.0, "ms": 1e3, "s": 1e6}
MODE_ORDER = ["train", "eval"]


# ---- the parts the checker shares: pure functions of the report ---------------------------------

def canonical_json(report):
    """The one byte form of report.json, so the PNG hashes and the diffs stay stable."""
    return json.dumps(report, indent=1, sort_keys=True) + "\n"


def dtypes_of(entries):
    """The dtypes of `entries` in order of first appearance: the driver's order is the reader's."""
    seen = []
    for e in entries:
        if e.get("dtype") not in seen:
            seen.append(e.get("dtype"))
    return seen


def modes_of(entries):
    """train before eval, then any other mode in order of appearance."""
    modes = [m for m in MODE_ORDER if any(e.get("mode") == m for e in entries)]
    for e in entries:
        if e.get("mode") not in modes:
            modes.append(e.get("mode"))
    return modes


def chart_file(dtype):
    # A dtype is any string; it must not turn into a path or a name the checker cannot read.
    return "forward_" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(dtype)) + ".png"


def charts_for(report):
    """The charts list that belongs in report.json: a pure function of the data."""
    meta = report.get("meta", {})
    where = f"{meta.get('gpu', '?')}, {meta.get('date', '?')}"
    charts = [{"file": chart_file(d),
               "title": f"Forward {d}: time / F.linear, {where}"}
              for d in dtypes_of(report.get("forward", []))]
    charts.append({"file": "jit.png", "title": f"JIT latency, {where}"})
    return charts


def median(result):
    """A result's median in ms, or None when the system did not run (an error) or is absent."""
    if isinstance(result, dict) and "median_ms" in result and "error" not in result:
        return result["median_ms"]
    return None


def fmt_ms(v):
    # Four decimals read well from 0.01 ms to seconds; below that they would print zeros.
    return f"{v:.4f}" if abs(v) >= 0.001 else f"{v:.3g}"


def fmt_num(v):
    """A jit value or a duration: integers as integers, others to four significant figures."""
    if isinstance(v, int) or (float(v).is_integer() and abs(v) < 1e15):
        return str(int(v))
    s = f"{v:.4g}"
    return f"{v:.1f}" if "e" in s and abs(v) >= 1 else s


def cell(text):
    """A markdown table cell: a pipe or a newline in free text would break the row."""
    return flat(text).replace("|", "\\|")


def flat(text):
    """Free text on one line: nvidia-smi output and the like carry newlines and runs of spaces."""
    return " ".join(str(text).split())


def time_cell(results, system):
    r = results.get(system)
    if r is None:
        return "\u2014"
    return "n/a" if median(r) is None else fmt_ms(median(r))


def ratio_cell(results, system, over, form):
    """results[system] against results[over]; `form` formats the quotient."""
    r = results.get(system)
    if r is None:
        return "\u2014"
    a, b = median(r), median(results.get(over))
    if a is None:
        return "n/a"
    return "\u2014" if b is None else form(a / b)


def ratio(x):
    return f"{x:.3f}"


def speedup(x):
    return f"{x:.2f}x"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def timing_row(e, ratio_columns):
    """One forward or backward row: times, ratios to F.linear, speedups of fusejit."""
    res = e.get("results", {})
    row = [e.get("shape"), e.get("mode"), time_cell(res, "fusejit"), time_cell(res, BASELINE)]
    row += [ratio_cell(res, s, BASELINE, ratio) for _, s in ratio_columns]
    row += [time_cell(res, "eager"), time_cell(res, "compile")]
    # A speedup is the other system's time over fusejit's: above 1x, fusejit is faster.
    row += [ratio_cell(res, "eager", "fusejit", lambda x: speedup(x)),
            ratio_cell(res, "compile", "fusejit", lambda x: speedup(x))]
    fj = res.get("fusejit")
    row.append(fj.get("detail", "") if median(fj) is not None else "")
    return row


def timing_header(ratio_columns):
    return (["shape", "mode", "fusejit ms", "F.linear ms"] + [h for h, _ in ratio_columns]
            + ["eager ms", "compile ms", "speedup vs eager", "speedup vs compile",
               "fusejit config"])


def has_error(entries):
    return any(isinstance(r, dict) and "error" in r
               for e in entries for r in e.get("results", {}).values())


def meta_paragraph(meta):
    m = {k: flat(meta.get(k, "?")) for k in ("gpu", "cc", "sm_count", "driver", "cuda", "torch",
                                       "python", "fusejit", "date", "command", "timing",
                                       "clocks", "seconds")}
    secs = meta.get("seconds")
    secs = fmt_num(secs) if isinstance(secs, (int, float)) else m["seconds"]
    return (f"Measured on **{m['gpu']}** (compute capability {m['cc']}, {m['sm_count']} SMs), "
            f"driver {m['driver']}, CUDA {m['cuda']}, PyTorch {m['torch']}, Python {m['python']}, "
            f"fusejit {m['fusejit']}, on {m['date']} by `{m['command']}` ({secs} s in all). "
            f"Timing: {m['timing']}. Clocks: {m['clocks']}.")


def forward_section(report):
    fwd = report.get("forward", [])
    out = ["## Forward", "",
           "Times are medians in milliseconds. A ratio column is that system's time over "
           "F.linear's (cuBLAS GEMM + bias), lower is better; a speedup is the other system's "
           "time over fusejit's, above 1x means fusejit is faster.", ""]
    for d in dtypes_of(fwd):
        rows = [timing_row(e, RATIO_COLUMNS) for e in fwd if e.get("dtype") == d]
        out += [f"### {d}", ""] + table(timing_header(RATIO_COLUMNS), rows) + [""]
    return out


def backward_section(report):
    bwd = report.get("backward", [])
    if not bwd:
        return []
    out = ["## Forward + backward", "",
           "The pass timed is forward then backward, in train mode.", ""]
    for d in dtypes_of(bwd):
        rows = [timing_row(e, RATIO_COLUMNS[:1]) for e in bwd if e.get("dtype") == d]
        out += [f"### {d}", ""] + table(timing_header(RATIO_COLUMNS[:1]), rows) + [""]
    return out


def autotune_section(report):
    tune = report.get("autotune", [])
    if not tune:
        return []

    def ms(t, key):
        v = t.get(key)
        return fmt_ms(v) if isinstance(v, (int, float)) else "\u2014"

    def vs_reference(t):
        w, r = t.get("winner_ms"), t.get("reference_ms")
        ok = isinstance(w, (int, float)) and isinstance(r, (int, float)) and r > 0
        return ratio(w / r) if ok else "\u2014"

    rows = [[t.get("shape"), t.get("dtype"), t.get("mode"), f"{t.get('seconds', 0):.1f}",
             t.get("winner"), ms(t, "winner_ms"), ms(t, "reference_ms"), vs_reference(t),
             str(t.get("candidates"))] for t in tune]
    total_s = sum(t.get("seconds", 0) for t in tune)
    total_c = sum(t.get("candidates", 0) for t in tune)
    rows.append(["**total**", "", "", f"{total_s:.1f}", "", "", "", "", str(total_c)])
    return (["## Autotune", "",
             "`fusejit autotune` in this run, into a fresh tuning database: its own timings "
             "(CUDA events, its own process) of the winner and of the cuBLASLt reference path "
             "(cuBLASLt GEMM + plain BatchNorm kernels), which it times as a contender.", ""]
            + table(["shape", "dtype", "mode", "seconds", "winner", "winner ms",
                     "reference path ms", "winner / reference", "candidates"], rows) + [""])


def summary_section(report):
    """Per dtype and mode, geometric means over the shapes measured: fusejit's time over
    F.linear's, and eager's and torch.compile's over fusejit's."""
    fwd = report.get("forward", [])
    rows = []
    for d in dtypes_of(fwd):
        for mode in modes_of(fwd):
            es = [e.get("results", {}) for e in fwd if e.get("dtype") == d and e.get("mode") == mode]
            cols = []
            for num, den, form in (("fusejit", BASELINE, ratio), ("eager", "fusejit", speedup),
                                   ("compile", "fusejit", speedup)):
                xs = [median(r.get(num)) / median(r.get(den)) for r in es
                      if median(r.get(num)) is not None and median(r.get(den)) is not None]
                cols.append(f"{form(math.exp(sum(map(math.log, xs)) / len(xs)))} ({len(xs)})"
                            if xs else "\u2014")
            rows.append([d, mode] + cols)
    if not rows:
        return []
    return (["## Summary", "",
             "Geometric means over the shapes measured (their number in parentheses) of the "
             "forward tables below.", ""]
            + table(["dtype", "mode", "fusejit / F.linear", "speedup vs eager",
                     "speedup vs torch.compile"], rows) + [""])


def jit_section(report):
    jit = report.get("jit", [])
    if not jit:
        return []
    rows = [[j.get("name"), fmt_num(j.get("value")), j.get("unit"), j.get("detail", "")]
            for j in jit]
    return ["## JIT latency", ""] + table(["name", "value", "unit", "detail"], rows) + [""]


def systems_section(report):
    rows = [[f"`{k}`", v] for k, v in sorted(report.get("systems", {}).items())]
    return ["## Systems", ""] + table(["id", "what it runs"], rows) + [""]


def render_md(report):
    """report.md as a string. A pure function of `report`: no clock, no environment, so the
    checker renders it again and compares bytes."""
    out = ["# fusejit benchmark report", "",
           "Generated from report.json by scripts/report_render.py; do not edit by hand.", "",
           meta_paragraph(report.get("meta", {})), ""]
    out += summary_section(report)
    out += systems_section(report)
    out += forward_section(report)
    out += backward_section(report)
    if has_error(report.get("forward", []) + report.get("backward", [])):
        out += ["n/a: the system could not run that problem; report.json holds the reason. "
                "\u2014: the system was not measured.", ""]
    out += autotune_section(report)
    out += jit_section(report)
    charts = report.get("charts", [])
    if charts:
        out += ["## Charts", ""]
        for c in charts:
            out += [f"![{c.get('title')}]({c.get('file')})", ""]
    return "\n".join(out).rstrip("\n") + "\n"


# ---- the charts: matplotlib, imported only here so the checker never needs it ------------------

def forward_ratios(entries, mode):
    """(shapes, {system: [ratio or None per shape]}) of one mode's entries."""
    rows = [e for e in entries if e.get("mode") == mode]
    shapes = [e.get("shape") for e in rows]
    series = {}
    for s, _ in CHART_SYSTEMS:
        vals = []
        for e in rows:
            a, b = median(e["results"].get(s)), median(e["results"].get(BASELINE))
            vals.append(a / b if a is not None and b is not None else None)
        series[s] = vals
    return shapes, series


def draw_forward(plt, report, dtype, title, path, metadata):
    entries = [e for e in report.get("forward", []) if e.get("dtype") == dtype]
    modes = modes_of(entries)
    panels = [(m,) + forward_ratios(entries, m) for m in modes]
    values = [v for _, _, ser in panels for vs in ser.values() for v in vs if v is not None]
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 8), sharey=True, squeeze=False)
    # Ratios that span more than 10x would flatten the small bars on a linear axis.
    log = bool(values) and max(values) / min(values) > 10
    width = 0.8 / len(CHART_SYSTEMS)
    colors = {"fusejit": "#1f77b4", "eager": "#ff7f0e", "compile": "#2ca02c"}
    for ax, (mode, shapes, series) in zip(axes[:, 0], panels):
        for i, (s, label) in enumerate(CHART_SYSTEMS):
            xs = [k + (i - (len(CHART_SYSTEMS) - 1) / 2) * width
                  for k, v in enumerate(series[s]) if v is not None]
            ys = [v for v in series[s] if v is not None]
            bars = ax.bar(xs, ys, width, label=label, color=colors[s])
            ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], fontsize=8, padding=1)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1,
                   label="F.linear (cuBLAS GEMM + bias)")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=30, ha="right")
        ax.set_title(f"{mode} (shape MxNxK)", fontsize=10)
        ax.set_ylabel("time / F.linear (lower is better)")
        ax.grid(axis="y", alpha=0.3)
    if log:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
        ax = axes[0, 0]
        ax.set_yscale("log")
        # Plain 0.5, 1, 2, 5, 10 read as ratios; powers of ten alone leave too few ticks.
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        # A bar starts at the axis bottom: below the smallest ratio, or one under 1 is a sliver.
        ax.set_ylim(min(values + [1.0]) / 2, max(values) * 1.5)
    else:
        axes[0, 0].set_ylim(0, max(values + [1.0]) * 1.1)
    # One legend above both panels: inside an axes it would cover the tallest bars.
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=9,
               bbox_to_anchor=(0.5, 0.955), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=100, metadata=metadata)
    plt.close(fig)


def draw_jit(plt, report, title, path, metadata):
    items = [(j["name"], j["value"] * TIME_UNITS[j["unit"]], j)
             for j in report.get("jit", [])
             if j.get("unit") in TIME_UNITS and j.get("value", 0) > 0]
    fig, ax = plt.subplots(figsize=(13, max(3.0, 0.45 * len(items) + 1.5)))
    if items:
        ys = range(len(items))
        bars = ax.barh(ys, [us for _, us, _ in items], color="#1f77b4")
        ax.bar_label(bars, labels=[f"{fmt_num(j['value'])} {j['unit']}" for _, _, j in items],
                     fontsize=8, padding=3)
        ax.set_yticks(ys)
        ax.set_yticklabels([n for n, _, _ in items])
        ax.invert_yaxis()  # the first entry on top, as in the table
        ax.set_xscale("log")
        lo, hi = min(us for _, us, _ in items), max(us for _, us, _ in items)
        ax.set_xlim(lo / 3, hi * 8)  # room for the value labels right of the longest bar
    else:
        ax.text(0.5, 0.5, "no latency entries", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("microseconds (log scale)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata=metadata)
    plt.close(fig)


def write_charts(report, out_dir, sha):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metadata = {PNG_KEY: sha}
    by_file = {chart_file(d): d for d in dtypes_of(report.get("forward", []))}
    for c in report["charts"]:
        path = os.path.join(out_dir, c["file"])
        if c["file"] == "jit.png":
            draw_jit(plt, report, c["title"], path, metadata)
        else:
            draw_forward(plt, report, by_file[c["file"]], c["title"], path, metadata)
        print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--raw", help="the driver's report.json (default: DIR/report.json)")
    ap.add_argument("--no-charts", action="store_true", help="write report.json and report.md only")
    a = ap.parse_args()
    with open(a.raw or os.path.join(a.dir, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    if report.get("schema") != SCHEMA:
        print(f"report_render: schema is {report.get('schema')!r}, expected {SCHEMA!r}",
              file=sys.stderr)
        return 1
    report["charts"] = charts_for(report)
    os.makedirs(a.dir, exist_ok=True)
    data = canonical_json(report).encode("utf-8")
    with open(os.path.join(a.dir, "report.json"), "wb") as f:
        f.write(data)
    with open(os.path.join(a.dir, "report.md"), "w", encoding="utf-8", newline="\n") as f:
        f.write(render_md(report))
    print(f"wrote {os.path.join(a.dir, 'report.json')} and report.md")
    if not a.no_charts:
        write_charts(report, a.dir, hashlib.sha256(data).hexdigest())
    # A chart from an older run would fail the checker; name it rather than delete files here.
    listed = {c["file"] for c in report["charts"]}
    for name in sorted(os.listdir(a.dir)):
        if name.endswith(".png") and name not in listed:
            print(f"report_render: {name} is not in the charts list; delete it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
