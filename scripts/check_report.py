#!/usr/bin/env python3
"""Proves the benchmark report in DIR (docs/report) cannot drift from its data.

    scripts/check_report.py DIR     exit 0: consistent; 1: prints every problem, file and field

Runs in CI on a CPU with the standard library only (no matplotlib, no GPU). Three promises:

  * DIR/report.json follows the schema "fusejit-report/1" (below): the types, the required keys,
    shapes that are MxNxK of positive integers, finite positive medians, every system id used
    described in "systems", F.linear measured wherever fusejit is, and the charts list the one
    the renderer derives from the data.
  * DIR/report.md is byte for byte what scripts/report_render.py renders from that JSON, so every
    figure on the page comes from the data; a hand edit, or a JSON changed without re-rendering,
    fails.
  * every chart listed exists, is a well-formed PNG (signature, chunk CRCs, IHDR first, IEND
    last), and its tEXt "fusejit-report-sha256" is the sha256 of report.json's bytes: a chart
    drawn from other data fails. A PNG in DIR that the list does not name fails too.

The schema, as bench/report.py writes it (report_render.py adds "charts"):

  schema    "fusejit-report/1"
  meta      gpu cc driver cuda torch python fusejit date command clocks timing: strings;
            sm_count: int; seconds: number
  systems   {system id: one-line description}
  forward   [{shape: "MxNxK", dtype: str, mode: "train"|"eval",
              results: {system id: {median_ms: number, samples: int, detail: str}
                                   | {error: str}}}]
  backward  the same, mode "train" (forward + backward timed); may be empty
  autotune  [{shape, dtype, mode: str, seconds: number, winner: str, candidates: int}]
  jit       [{name: str, value: number, unit: str, detail: str}]
  charts    [{file: str, title: str}]
"""
import hashlib
import json
import math
import os
import re
import struct
import sys
import zlib

sys.dont_write_bytecode = True  # CI runs this in the source tree: leave no __pycache__ there
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_render  # noqa: E402  (the renderer's pure functions; it imports matplotlib lazily)

META_STRINGS = ("gpu", "cc", "driver", "cuda", "torch", "python", "fusejit", "date", "command",
                "clocks", "timing")
MODES = ("train", "eval")
SHAPE = re.compile(r"^([0-9]+)x([0-9]+)x([0-9]+)$")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Problems:
    """Collects every problem, each prefixed by the file it is in, so one run shows them all."""

    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append(f"{where}: {what}")


def is_int(v):
    # bool is an int to Python but never a count in this schema.
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def is_str(v, nonempty=True):
    return isinstance(v, str) and (bool(v.strip()) or not nonempty)


def expect(p, obj, key, test, what, where):
    """obj[key] passes `test`, else one problem naming `where`.key and what was expected."""
    if not isinstance(obj, dict) or key not in obj:
        p.add("report.json", f"{where}.{key}: missing")
        return False
    if not test(obj[key]):
        p.add("report.json", f"{where}.{key}: {obj[key]!r} is not {what}")
        return False
    return True


def check_shape(p, entry, where):
    if expect(p, entry, "shape", is_str, "a string", where):
        m = SHAPE.match(entry["shape"])
        if not m or any(int(g) <= 0 for g in m.groups()):
            p.add("report.json", f"{where}.shape: {entry['shape']!r} is not MxNxK of positive "
                                 "integers")


def check_result(p, r, where):
    if not isinstance(r, dict):
        p.add("report.json", f"{where}: not an object")
        return
    if "error" in r:
        expect(p, r, "error", is_str, "a non-empty string", where)
        return
    expect(p, r, "median_ms", lambda v: is_num(v) and v > 0, "a finite number > 0", where)
    expect(p, r, "samples", lambda v: is_int(v) and v > 0, "an integer > 0", where)
    expect(p, r, "detail", lambda v: is_str(v, False), "a string", where)


def check_timings(p, report, section, systems, modes):
    """forward or backward: each entry's keys, and its results against the systems table."""
    entries = report.get(section)
    if not isinstance(entries, list):
        p.add("report.json", f"{section}: missing or not a list")
        return
    seen = {}
    for i, e in enumerate(entries):
        where = f"{section}[{i}]"
        if not isinstance(e, dict):
            p.add("report.json", f"{where}: not an object")
            continue
        check_shape(p, e, where)
        expect(p, e, "dtype", is_str, "a non-empty string", where)
        expect(p, e, "mode", lambda v: v in modes, " or ".join(map(repr, modes)), where)
        # Two rows for one problem would leave the reader to guess which one is the report.
        key = (e.get("shape"), e.get("dtype"), e.get("mode"))
        if key in seen:
            p.add("report.json", f"{where}: the same shape, dtype and mode as {seen[key]}")
        seen.setdefault(key, where)
        if not expect(p, e, "results", lambda v: isinstance(v, dict) and v, "a non-empty object",
                      where):
            continue
        for sid, r in e["results"].items():
            if sid not in systems:
                p.add("report.json", f"{where}.results.{sid}: system id not described in "
                                     "\"systems\"")
            check_result(p, r, f"{where}.results.{sid}")
        # Every ratio in the report is over F.linear's time.
        if section == "forward" and "fusejit" in e["results"] and \
                report_render.BASELINE not in e["results"]:
            p.add("report.json", f"{where}.results: has fusejit but no "
                                 f"{report_render.BASELINE!r} (the baseline of every ratio)")


def check_meta(p, report):
    meta = report.get("meta")
    if not isinstance(meta, dict):
        p.add("report.json", "meta: missing or not an object")
        return
    for k in META_STRINGS:
        expect(p, meta, k, is_str, "a non-empty string", "meta")
    expect(p, meta, "sm_count", lambda v: is_int(v) and v > 0, "an integer > 0", "meta")
    expect(p, meta, "seconds", lambda v: is_num(v) and v >= 0, "a finite number >= 0", "meta")


def check_systems(p, report):
    systems = report.get("systems")
    if not isinstance(systems, dict):
        p.add("report.json", "systems: missing or not an object")
        return {}
    for sid, text in systems.items():
        if not is_str(text):
            p.add("report.json", f"systems.{sid}: {text!r} is not a non-empty description")
    return systems


# The fields of each entry of the flat sections: (key, test, what a passing value is).
NON_EMPTY = (is_str, "a non-empty string")
ANY_STRING = (lambda v: is_str(v, False), "a string")
FLAT_SECTIONS = {
    "autotune": [("dtype", *NON_EMPTY),
                 ("mode", lambda v: v in MODES, "'train' or 'eval'"),
                 ("seconds", lambda v: is_num(v) and v >= 0, "a finite number >= 0"),
                 ("winner", *NON_EMPTY),
                 ("candidates", lambda v: is_int(v) and v >= 0, "an integer >= 0")],
    "jit": [("name", *NON_EMPTY), ("value", is_num, "a finite number"), ("unit", *NON_EMPTY),
            ("detail", *ANY_STRING)],
}


def check_flat(p, report, section):
    """autotune or jit: a list of entries, each with its section's fields (an autotune entry
    also names a shape)."""
    entries = report.get(section)
    if not isinstance(entries, list):
        p.add("report.json", f"{section}: missing or not a list")
        return
    for i, e in enumerate(entries):
        where = f"{section}[{i}]"
        if section == "autotune":
            check_shape(p, e, where)
        for key, test, what in FLAT_SECTIONS[section]:
            expect(p, e, key, test, what, where)


def check_json(p, report):
    if not isinstance(report, dict):
        p.add("report.json", "not a JSON object")
        return
    if report.get("schema") != report_render.SCHEMA:
        p.add("report.json", f"schema: {report.get('schema')!r} is not "
                             f"{report_render.SCHEMA!r}")
    check_meta(p, report)
    systems = check_systems(p, report)
    check_timings(p, report, "forward", systems, MODES)
    check_timings(p, report, "backward", systems, ("train",))
    for section in FLAT_SECTIONS:
        check_flat(p, report, section)
    try:
        want = report_render.charts_for(report)
    except Exception as e:  # the data is malformed enough that the renderer cannot read it
        p.add("report.json", f"charts: cannot be derived ({type(e).__name__}: {e})")
        return
    if report.get("charts") != want:
        p.add("report.json", f"charts: {report.get('charts')!r} is not what the renderer "
                             f"derives from the data: {want!r}")


def check_canonical(p, data, report):
    """The bytes are the renderer's canonical form: the hashes in the PNGs are of these bytes,
    and a hand-formatted file would have been written by something other than the renderer."""
    if data.decode("utf-8", "replace") != report_render.canonical_json(report):
        p.add("report.json", "not in the renderer's canonical form (indent 1, sorted keys); "
                             "run scripts/report_render.py")


def check_md(p, out_dir, report):
    path = os.path.join(out_dir, "report.md")
    if not os.path.isfile(path):
        p.add("report.md", "missing")
        return
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        have = f.read()
    try:
        want = report_render.render_md(report)
    except Exception as e:
        p.add("report.md", f"cannot be rendered again from report.json ({type(e).__name__}: {e})")
        return
    if have == want:
        return
    a, b = have.split("\n"), want.split("\n")
    for n, (x, y) in enumerate(zip(a, b), 1):
        if x != y:
            p.add("report.md", f"line {n} is not what report.json renders to:\n"
                               f"    have: {x}\n    want: {y}")
            return
    p.add("report.md", f"{len(a)} lines where report.json renders to {len(b)}")


def png_chunks(data):
    """[(type, payload)] of a PNG, or raises ValueError naming what is malformed."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("no PNG signature")
    chunks, pos = [], len(PNG_SIGNATURE)
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError(f"truncated chunk header at byte {pos}")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        end = pos + 8 + length + 4
        if end > len(data):
            raise ValueError(f"chunk {kind!r} at byte {pos} runs past the end of the file")
        payload = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[end - 4:end])
        if crc != zlib.crc32(kind + payload) & 0xFFFFFFFF:
            raise ValueError(f"chunk {kind!r} at byte {pos} has a bad CRC")
        chunks.append((kind, payload))
        pos = end
    if not chunks or chunks[0][0] != b"IHDR":
        raise ValueError("the first chunk is not IHDR")
    if chunks[-1][0] != b"IEND":
        raise ValueError("the last chunk is not IEND")
    return chunks


def png_text(chunks):
    """The tEXt entries of a PNG: keyword NUL text, both Latin-1."""
    text = {}
    for kind, payload in chunks:
        if kind == b"tEXt" and b"\0" in payload:
            key, _, value = payload.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
    return text


def check_charts(p, out_dir, report, sha):
    charts = report.get("charts") if isinstance(report.get("charts"), list) else []
    listed = set()
    for i, c in enumerate(charts):
        name = c.get("file") if isinstance(c, dict) else None
        if not is_str(name) or os.path.basename(name) != name:
            p.add("report.json", f"charts[{i}].file: {name!r} is not a file name")
            continue
        listed.add(name)
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):
            p.add(name, "missing (listed in report.json charts)")
            continue
        with open(path, "rb") as f:
            data = f.read()
        try:
            text = png_text(png_chunks(data))
        except ValueError as e:
            p.add(name, f"not a valid PNG: {e}")
            continue
        have = text.get(report_render.PNG_KEY)
        if have is None:
            p.add(name, f"tEXt {report_render.PNG_KEY}: missing")
        elif have != sha:
            p.add(name, f"tEXt {report_render.PNG_KEY}: {have} is not sha256(report.json) "
                        f"{sha}; the chart was drawn from other data")
    # A leftover chart would sit in the docs beside the report without being part of it.
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".png") and name not in listed:
            p.add(name, "not in report.json charts (left from an older run?)")


def check(out_dir):
    """Every problem of the report in `out_dir`, as strings; empty when it is consistent."""
    p = Problems()
    path = os.path.join(out_dir, "report.json")
    if not os.path.isfile(path):
        p.add("report.json", "missing (render it with scripts/report_render.py)")
        return p.items
    with open(path, "rb") as f:
        data = f.read()
    try:
        report = json.loads(data.decode("utf-8"))
    except ValueError as e:
        p.add("report.json", f"not JSON: {e}")
        return p.items
    check_json(p, report)
    if isinstance(report, dict):
        check_canonical(p, data, report)
        check_md(p, out_dir, report)
        check_charts(p, out_dir, report, hashlib.sha256(data).hexdigest())
    return p.items


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    problems = check(out_dir)
    for problem in problems:
        print(f"{os.path.join(out_dir, '')}{problem}")
    if problems:
        print(f"report: {len(problems)} problem(s) in {out_dir} "
              "(render with scripts/report_render.py; schema: scripts/check_report.py)")
        return 1
    print(f"report: {out_dir} matches its report.json (schema, markdown, chart hashes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
