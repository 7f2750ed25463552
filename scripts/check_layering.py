#!/usr/bin/env python3
"""The include rule of the source tree: every folder may include only folders below it.

    scripts/check_layering.py [ROOT]      exit 0: one-way; 1: prints each upward include

The table below is the one place the directions live (docs/design.md shows it in prose). A
folder is named by its path under ROOT; a file in a folder not listed fails the check too, so a
new folder has to be placed before it can be used. Includes of system and third-party headers
("<...>") and of the kernel templates (the paths under templates/, which the library embeds)
are not arrows between folders and are ignored; a quoted include that names a file of the
tree is an arrow.
"""
import os
import re
import sys

# Bottom first. A folder may include itself and any folder listed before it.
LAYERS = [
    ("include/fusejit", "the installed API: problem, dtype, error, tensors, plan, device info"),
    ("src/fusejit/util", "hashing, logging, fault hooks, durable files, single flight, timers"),
    ("src/fusejit/device", "the driver table (dlopen), devices, contexts, device memory"),
    ("src/fusejit/cache", "the disk cache of compiled kernels"),
    ("src/fusejit/config", "kernel configs, validity rules, candidates, the heuristic"),
    ("src/fusejit/codegen", "generated sources: Spec preludes, schedules, embedded templates"),
    ("src/fusejit/compile", "NVRTC, cache keys, compile_cached"),
    ("src/fusejit/runtime", "loaded modules and their in-process registry"),
    ("src/fusejit/plan", "built kernel sets (PlanCore), tensor checks, launches: the hot path"),
    ("src/fusejit/reference", "the cuBLASLt reference op and baseline GEMM"),
    ("src/fusejit/verify", "the float64 verification core: inputs, reference, compare, passes()"),
    ("src/fusejit/tune", "the autotuner, the tuning database, the dispatch"),
    ("src/fusejit/api", "the public classes' implementations (Plan): pick, build, run"),
    ("src/tools", "not shipped: the sweep runner, progress bar, timing harness"),
    ("src/cli", "the fusejit command"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = (".cpp", ".hpp", ".h", ".cuh")


def folder_of(path, folders):
    """The longest listed folder that contains `path` (a path relative to the root)."""
    best = None
    for f in folders:
        if path == f or path.startswith(f + "/"):
            if best is None or len(f) > len(best):
                best = f
    return best


def resolve(root, including, target):
    """The tree file a quoted include names, as a root-relative path, or None (not ours)."""
    candidates = [
        os.path.join(os.path.dirname(including), target),
        os.path.join("include", target),
        os.path.join("src", target),
        target,
    ]
    for c in candidates:
        c = os.path.normpath(c)
        if os.path.isfile(os.path.join(root, c)):
            return c
    return None


def check(root):
    folders = [f for f, _ in LAYERS]
    rank = {f: i for i, f in enumerate(folders)}
    problems = []
    for top in ("include/fusejit", "src"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                home = folder_of(path, folders)
                if home is None:
                    problems.append(f"{path}: its folder is not in the layering table")
                    continue
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for target in INCLUDE.findall(text):
                    file = resolve(root, path, target)
                    if file is None or file.startswith("templates/"):
                        continue
                    there = folder_of(file, folders)
                    if there is None:
                        problems.append(f'{path}: includes "{target}", outside the table')
                    elif rank[there] > rank[home]:
                        problems.append(
                            f'{path}: includes "{target}" ({there}), above its own folder '
                            f"({home})")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} include(s) break the one-way rule "
              "(table: scripts/check_layering.py)")
        return 1
    print("layering: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
