#!/usr/bin/env python3
"""The cache soak (docs/reliability.md section 6): one `fusejit check` process plans and runs
N random cases against the float64 reference with a shared cache directory while this script
keeps clearing and corrupting that directory, and samples the checker's resident memory.

    scripts/cache_soak.py FUSEJIT [--cases 2000] [--pool 300] [--seed 1] [--out DIR]

The cases are drawn (with repetition) from a pool of distinct problems; the pool is compiled
into the directory first, so every problem's first plan in the soak process reads an entry the
corrupter may have flipped, truncated, swapped with another key's, replaced by a FIFO or a
symlink, or removed. Pass: 0 failed cases, RSS flat after warm-up, GPU memory back to where
the sweep found it plus the modules it keeps loaded (printed by `fusejit check`).
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import threading
import time


def pool_lines(n, rng):
    Ms = [2, 3, 17, 64, 100, 127, 128, 129, 257, 1000]
    Ns = [1, 7, 8, 64, 200, 256]
    Ks = [1, 5, 8, 64, 100, 256]
    seen, out = set(), []
    while len(out) < n:
        M, N, K = rng.choice(Ms), rng.choice(Ns), rng.choice(Ks)
        dtype = rng.choice(["fp32", "tf32", "fp16", "bf16"])
        mode = rng.choice(["train", "eval"])
        flags = []
        if rng.random() < 0.3:
            flags.append(rng.choice(["nobias", "noscale", "noaffine"]))
        if mode == "train" and rng.random() < 0.3:
            flags.append("momentum=none")
        if rng.random() < 0.2:
            flags.append(f"ldx={K + rng.choice([1, 8])}")
        if rng.random() < 0.2:
            flags.append("non_centred")
        line = " ".join([f"{M}x{N}x{K}", dtype, mode] + flags)
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out


def corrupt(dir, rng, stop, counts):
    """Damages the cache directory at random until `stop` is set."""
    while not stop.is_set():
        time.sleep(rng.uniform(0.005, 0.05))
        try:
            names = [n for n in os.listdir(dir) if n.endswith(".fjc")]
        except FileNotFoundError:
            continue
        if not names:
            continue
        path = os.path.join(dir, rng.choice(names))
        action = rng.choice(["flip", "truncate", "swap", "fifo", "symlink", "remove", "clear"])
        try:
            if action == "flip":
                with open(path, "r+b") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size == 0:
                        continue
                    at = rng.randrange(size)
                    f.seek(at)
                    b = f.read(1)
                    f.seek(at)
                    f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            elif action == "truncate":
                os.truncate(path, rng.randrange(max(1, os.path.getsize(path))))
            elif action == "swap":
                other = os.path.join(dir, rng.choice(names))
                if other != path:
                    os.replace(other, path)
            elif action == "fifo":
                os.unlink(path)
                os.mkfifo(path, 0o600)
            elif action == "symlink":
                other = os.path.join(dir, rng.choice(names))
                os.unlink(path)
                os.symlink(other, path)
            elif action == "remove":
                os.unlink(path)
            elif action == "clear":
                if rng.random() < 0.1:  # rarely: everything goes
                    for n in names:
                        try:
                            os.unlink(os.path.join(dir, n))
                        except OSError:
                            pass
            counts[action] = counts.get(action, 0) + 1
        except OSError:
            pass  # raced with the checker or another action: fine


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fusejit")
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--pool", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--dir", default="/tmp/fusejit-soak-cache")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir, mode=0o700)
    pool = pool_lines(a.pool, rng)
    pool_file = os.path.join(a.out, "soak-pool.sweep")
    with open(pool_file, "w") as f:
        f.write("\n".join(pool) + "\n")
    cases_file = os.path.join(a.out, "soak-cases.sweep")
    with open(cases_file, "w") as f:
        f.write("\n".join(rng.choice(pool) for _ in range(a.cases)) + "\n")

    env = dict(os.environ, FUSEJIT_CACHE_DIR=a.dir, FUSEJIT_LOG_LEVEL="error")
    t0 = time.time()
    warm = subprocess.run([a.fusejit, "check", "--sweep", pool_file, "--seed", "7"], env=env,
                          capture_output=True, text=True)
    print(f"warm-up: {len(pool)} problems, rc {warm.returncode}, {time.time() - t0:.1f} s, "
          f"{len(os.listdir(a.dir))} entries")
    print(warm.stdout.strip().splitlines()[-1] if warm.stdout.strip() else warm.stderr[-2000:])

    stop = threading.Event()
    counts = {}
    corrupter = threading.Thread(target=corrupt, args=(a.dir, random.Random(a.seed + 1), stop,
                                                       counts))
    corrupter.start()
    t0 = time.time()
    log = open(os.path.join(a.out, "soak-check.log"), "w")
    proc = subprocess.Popen([a.fusejit, "check", "--sweep", cases_file, "--seed", "11"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    curve = []
    while proc.poll() is None:
        r = rss_kib(proc.pid)
        if r is not None:
            curve.append((round(time.time() - t0, 1), r))
        time.sleep(0.5)
    stop.set()
    corrupter.join()
    log.close()
    with open(os.path.join(a.out, "soak-rss.csv"), "w") as f:
        f.write("seconds,rss_kib\n" + "".join(f"{t},{r}\n" for t, r in curve))
    out = open(os.path.join(a.out, "soak-check.log")).read().strip().splitlines()
    print(f"soak: {a.cases} cases over {len(pool)} problems, rc {proc.returncode}, "
          f"{time.time() - t0:.1f} s; corruptions: {dict(sorted(counts.items()))}")
    for line in out[-3:]:
        print(line)
    if curve:
        n = len(curve)
        pick = [curve[i * (n - 1) // 9] for i in range(10)] if n >= 10 else curve
        print("RSS curve (s, MiB): " + ", ".join(f"{t}:{r / 1024:.0f}" for t, r in pick))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
