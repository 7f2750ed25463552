#!/usr/bin/env python3
"""The include rule of the source tree: every folder may include only folders below it.

    scripts/check_layering.py [ROOT]      exit 0: one-way; 1: prints each upward include
    scripts/check_layering.py --self-test [ROOT]   proves the check fails on a planted upward
                                                   include and on an unlisted folder (CI runs it)

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
    ("src/fusejit/types", "the public value types' code: dtype, problem, version"),
    ("src/fusejit/util", "hashing, logging, fault hooks, durable files, single flight, timers"),
    ("src/fusejit/device", "the driver table (dlopen), devices, contexts, device memory"),
    ("src/fusejit/comm", "NCCL loaded at run time: the statistics exchange of synchronized ranks"),
    ("src/fusejit/cache", "the disk cache of compiled kernels"),
    ("src/fusejit/config", "kernel configs, validity rules, candidates, the heuristic"),
    ("src/fusejit/codegen", "generated sources: Spec preludes, schedules, embedded templates"),
    ("src/fusejit/compile", "NVRTC, cache keys, compile_cached"),
    ("src/fusejit/runtime", "loaded modules and their in-process registry"),
    ("src/fusejit/blas", "cuBLASLt matmuls set up once: descriptors, layouts, the heuristic's algorithm"),
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


def self_test(root):
    """The check passes on `root`, and fails on copies of it with one upward include planted in
    the bottom library folder, and with a file in a folder the table does not list."""
    import shutil
    import tempfile
    if check(root):
        print("self-test: the tree itself does not pass")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for top in ("include", "src"):
            shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
        with open(os.path.join(tmp, "src/fusejit/util/hash.cpp"), "a") as f:
            f.write('\n#include "fusejit/tune/tuner.hpp"\n')
        planted = check(tmp)
        if not any("util/hash.cpp" in p and "above its own folder" in p for p in planted):
            print("self-test: a planted upward include was not caught:", planted)
            return 1
        os.makedirs(os.path.join(tmp, "src/fusejit/newstage"))
        with open(os.path.join(tmp, "src/fusejit/newstage/x.cpp"), "w") as f:
            f.write("int x;\n")
        if not any("newstage" in p and "not in the layering table" in p for p in check(tmp)):
            print("self-test: a file in an unlisted folder was not caught")
            return 1
    print("layering self-test: an upward include and an unlisted folder are both caught")
    return 0


def main():
    args = sys.argv[1:]
    test = bool(args) and args[0] == "--self-test"
    if test:
        args = args[1:]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..")
    if test:
        return self_test(os.path.abspath(root))
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
