"""The benchmark report's measurements (issue 20); scripts/report.sh runs it on a GPU machine.

    python3 bench/report.py measure --out FILE [--shapes S,..] [--dtypes D,..] [--modes M,..]
                                    [--backward-dtypes D,..] [--compile-dtypes D,..] [--errors]
    python3 bench/report.py jit --out FILE       JIT latency: cold / warm / hot plans, host time
    python3 bench/report.py assemble --out RAW --measure F --jit F [--autotune F] [--host F] ...

`measure` times, per shape and dtype and side by side in this one process, fusejit's op through
its extension (the tuned choice, the built-in heuristic, each variant forced), torch.mm (the
bare cuBLAS GEMM), F.linear (GEMM + bias: the baseline every ratio is stated against), the
seeds' Model in eager mode and under torch.compile, forward only and (--backward-dtypes, train)
forward + backward. `assemble` joins those with the autotune run's and the host benchmark's JSON
into the raw report scripts/report_render.py turns into docs/report/.
"""
import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# The child process that times planning (plan-once) needs fusejit alone: importing PyTorch
# would cost it seconds. Elsewhere PyTorch comes first (see scripts/report.sh on the order).
if sys.argv[1:2] != ["plan-once"]:
    import torch
    import torch.nn.functional as F

    import fusejit.torch as fjt
    from torch_layer import Model, host_us
import fusejit  # noqa: E402

SHAPES = ("1024x8192x8192,16384x4096x4096,4096x4096x4096,8192x12288x3072,2048x2048x512,"
          "128x512x1024,65536x256x64,777x1536x2050,1000x1001x1003,4097x4095x129")
# GPU time, side by side: each system's calls are captured once in a CUDA graph (back-to-back
# calls, as many as make ~2 ms, at most 10), then the graphs are replayed in rounds, every system
# once per round in a rotating order, and each system's median over the rounds is reported. The
# graph takes the host out (PyTorch's eager dispatch costs ~20 us a call, more than a small
# layer's kernels; host cost has its own rows). The rounds matter more: an H100 running GEMMs
# back to back moves its clocks under its power limit, and two timings of the same kernel taken
# one after the other differed by up to 10% on it; interleaved, every system sees the same drift.
SAMPLE_MS = 2.0
ROUND_MS = 400.0  # the rounds' GPU work per problem: ~ROUND_MS / sum(sample) rounds, 7 to 31
TIMING = ("GPU time, side by side: each system's calls captured once in a CUDA graph (1-10 "
          "back-to-back calls, as many as make ~2 ms; 3 warm-up calls on a side stream "
          "before capture), the graphs replayed in 7-31 rounds with every system once per "
          "round in a rotating order, each between CUDA events; the median per call over the "
          "rounds. Where capture fails, the calls themselves without a graph (detail says "
          "so). Inputs fixed across calls (operands stay in L2 where they fit in its {l2}); "
          "forward under torch.no_grad; train calls update running stats as a training step "
          "does")
SYSTEMS = {
    "fusejit": "fusejit, the tuned choice (tuning database filled by this run's autotune)",
    "fusejit_heuristic": "fusejit, the built-in heuristic (tuning database ignored)",
    "fusejit_tiled": "fusejit, tiled variant (mma.sync) forced",
    "fusejit_warpspec": "fusejit, warpspec variant (TMA + wgmma) forced",
    "mm": "torch.mm(x, W.t()): the bare cuBLAS GEMM, no bias",
    "linear": "F.linear(x, W, b): GEMM + bias, the baseline of every ratio",
    "eager": "the seeds' Model (Linear, * scale, BatchNorm1d) in PyTorch eager mode",
    "compile": "torch.compile of the same Model (default mode)",
}


def error_text(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


class Sampler:
    """One system's calls, ready to time: warmed up, captured in a graph where it can be."""

    def __init__(self, fn):
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as capture requires
            for _ in range(3):
                fn()
        main.wait_stream(side)
        self.a = torch.cuda.Event(enable_timing=True)
        self.b = torch.cuda.Event(enable_timing=True)
        self.per_sample, self.method = 1, "graph"
        self.step = fn
        self.est = self.sample()
        self.per_sample = max(1, min(10, round(SAMPLE_MS / max(self.est, 1e-3))))
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                for _ in range(self.per_sample):
                    fn()
            self.step = self.graph.replay
        except Exception as e:  # not capturable: time the calls themselves
            torch.cuda.synchronize()
            self.method = f"no graph ({type(e).__name__})"
            n = self.per_sample

            def step():
                for _ in range(n):
                    fn()
            self.step = step
        self.step()

    def sample(self):
        self.a.record()
        self.step()
        self.b.record()
        self.b.synchronize()
        return self.a.elapsed_time(self.b) / self.per_sample


def measure(systems):
    """{name: result} for {name: (fn, detail) | error dict}, see TIMING."""
    out, samplers = {}, {}
    for name, sys_ in systems.items():
        if isinstance(sys_, dict):
            out[name] = sys_
            continue
        try:
            samplers[name] = Sampler(sys_[0])
        except Exception as e:  # a system that cannot run this problem: recorded, not fatal
            out[name] = {"error": error_text(e)}
    if samplers:
        per_round = sum(s.est * s.per_sample for s in samplers.values())
        rounds = max(7, min(31, int(ROUND_MS / max(per_round, 1e-3))))
        names = list(samplers)
        times = {n: [] for n in names}
        for r in range(rounds):
            for i in range(len(names)):
                n = names[(r + i) % len(names)]
                times[n].append(samplers[n].sample())
        for n, s in samplers.items():
            detail = systems[n][1]
            if s.method != "graph":
                detail = f"{detail}; {s.method}" if detail else s.method
            out[n] = {"median_ms": statistics.median(times[n]), "samples": rounds,
                      "detail": detail}
    return {n: out[n] for n in systems}  # the caller's order


def fusejit_forward(model, x, dtype, mode, **forced):
    """(call, detail, y) of fusejit's op through the extension's Plan.run on the model's own
    tensors (copies of its running stats, so eager and fusejit see the same inputs; y: its
    output), or the error planning it raised."""
    M, K = x.shape
    N = model.gemm.weight.shape[0]
    param = fjt._STORAGE[model.scale.dtype]  # the module's own dtype -> fusejit name
    bn = model.bn
    try:
        plan = fusejit._C.Plan(M, N, K, dtype, mode, param, bn.eps, bn.momentum, True, True, True,
                               x.stride(0), model.gemm.weight.stride(0), N,
                               x.device.index or 0, **forced)
    except Exception as e:
        return {"error": error_text(e)}
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(max(plan.workspace_size, 1), device=x.device, dtype=torch.uint8)
    rm, rv = bn.running_mean.clone(), bn.running_var.clone()
    nbt = bn.num_batches_tracked.clone()
    train = mode == "train"
    save = [torch.empty(N, device=x.device, dtype=torch.float32) for _ in range(2)]
    w = model.gemm.weight.detach()
    args = [x.data_ptr(), w.data_ptr(), y.data_ptr(), model.gemm.bias.data_ptr(),
            model.scale.data_ptr(), bn.weight.data_ptr(), bn.bias.data_ptr(), rm.data_ptr(),
            rv.data_ptr(), nbt.data_ptr() if train else 0,
            save[0].data_ptr() if train else 0, save[1].data_ptr() if train else 0,
            ws.data_ptr(), ws.numel()]
    run, current = plan.run, torch.cuda.current_stream
    # The stream of the call, so that graph capture sees the launches on its stream.
    # The call holds every tensor whose address it passes: a graph captured from it replays
    # those addresses long after this function returns.
    keep = (plan, y, ws, rm, rv, nbt, save, w)
    # (call, detail, y): measure() reads the first two; --errors reads y after the timed calls.
    return (lambda keep=keep: run(current().cuda_stream, *args),
            "cuBLASLt reference op" if plan.uses_reference else plan.config, y)


def torch_dtype(dtype):
    return {"fp32": torch.float32, "tf32": torch.float32, "tf32x3": torch.float32,
            "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def relative_errors(systems, model, x, mode):
    """{system: ||y - y64|| / ||y64||} (Frobenius norms) against the same model in float64, for
    every system that ran: fusejit's y as its timed calls left it, the others called once more.
    F.linear and torch.mm are compared with x W^T (+ b) in float64, the rest with the layer."""
    ref_model = copy.deepcopy(model).double().train(mode == "train")
    with torch.no_grad():
        x64 = x.double()
        w64 = ref_model.gemm.weight
        refs = {"layer": ref_model(x64), "mm": x64 @ w64.t()}
        refs["linear"] = refs["mm"] + ref_model.gemm.bias
        out = {}
        for name, sys_ in systems.items():
            if isinstance(sys_, dict):
                continue
            y = sys_[2] if len(sys_) > 2 else sys_[0]()
            ref = refs.get(name, refs["layer"])
            out[name] = ((y.double() - ref).norm() / ref.norm()).item()
    return out


def compiled_call(compiled, *args):
    """(call, detail) of a torch.compile'd module, compiled now (its first call), or the error."""
    t0 = time.time()
    try:
        compiled(*args)
        torch.cuda.synchronize()
    except Exception as e:
        return {"error": error_text(e)}
    return (lambda: compiled(*args)), f"first call (compile) {time.time() - t0:.1f} s"


def show(shape, dtype, what, r):
    print(f"{shape:>16} {dtype:>5} {what:>7} " + " ".join(
        f"{k}={v['median_ms']:.4f}" if "median_ms" in v else f"{k}=ERR" for k, v in r.items()),
        flush=True)


def forward_entries(shape, dtype, modes, use_compile, configs=(), errors=False):
    M, N, K = (int(v) for v in shape.split("x"))
    dt = torch_dtype(dtype)
    torch.manual_seed(0)
    model = Model(K, N).cuda().to(dt)
    x = torch.rand(M, K, device="cuda", dtype=dt)
    w, b = model.gemm.weight.detach(), model.gemm.bias.detach()
    compiled = None
    if use_compile:
        torch._dynamo.reset()  # no graph of another dtype or tf32 setting is reused
        compiled = torch.compile(model)
    out = []
    for mode in modes:
        model.train(mode == "train")
        with torch.no_grad():
            systems = {"linear": (lambda: F.linear(x, w, b), ""),
                       "mm": (lambda: torch.mm(x, w.t()), "")}
            for name, forced in (("fusejit", {}), ("fusejit_heuristic", {"use_tuning_db": False}),
                                 ("fusejit_tiled", {"variant": "tiled"}),
                                 ("fusejit_warpspec", {"variant": "warpspec"})):
                systems[name] = fusejit_forward(model, x, dtype, mode, **forced)
            # --configs: forced kernel configs beside the others (an error where one does not
            # fit the problem), to compare schedules in the same rounds.
            for key in configs:
                systems[f"fusejit[{key}]"] = fusejit_forward(model, x, dtype, mode, config=key)
            systems["eager"] = (lambda: model(x), "")
            if compiled is not None:
                systems["compile"] = compiled_call(compiled, x)
            r = measure(systems)
        entry = {"shape": shape, "dtype": dtype, "mode": mode, "results": r}
        show(shape, dtype, mode, r)
        if errors:
            entry["errors"] = relative_errors(systems, model, x, mode)
            print(f"{shape:>16} {dtype:>5} {'error':>7} " + " ".join(
                f"{k}={v:.2e}" for k, v in entry["errors"].items()), flush=True)
        out.append(entry)
    return out


def backward_entry(shape, dtype, use_compile):
    """forward + backward in train mode: fusejit's module (its fused backward), F.linear's own
    forward + backward (three GEMMs and the bias gradient: the baseline), eager, compile."""
    M, N, K = (int(v) for v in shape.split("x"))
    dt = torch_dtype(dtype)
    torch.manual_seed(0)
    model = Model(K, N).cuda().to(dt).train()
    ours = fjt.LinearScaleBatchNorm1d.from_module(model).train()
    xg = torch.rand(M, K, device="cuda", dtype=dt).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=dt)
    w, b = model.gemm.weight, model.gemm.bias
    systems = {"linear": (lambda: F.linear(xg, w, b).backward(dy), ""),
               "fusejit": (lambda: ours(xg).backward(dy), "fusejit.torch module"),
               "eager": (lambda: model(xg).backward(dy), "")}
    if use_compile:
        torch._dynamo.reset()
        compiled = torch.compile(model)
        c = compiled_call(compiled, xg)
        systems["compile"] = c if isinstance(c, dict) else (
            lambda: compiled(xg).backward(dy), c[1])
    r = measure(systems)
    show(shape, dtype, "fwd+bwd", r)
    return {"shape": shape, "dtype": dtype, "mode": "train", "results": r}


def cmd_measure(a):
    torch._dynamo.config.recompile_limit = 1 << 10  # one Model class, many shapes and dtypes
    split = lambda s: [v for v in s.split(",") if v]  # noqa: E731
    forward, backward = [], []
    for shape in split(a.shapes):
        for dtype in split(a.dtypes):
            tf32 = dtype == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            forward += forward_entries(shape, dtype, split(a.modes),
                                       dtype in split(a.compile_dtypes), split(a.configs),
                                       a.errors)
        torch.backends.cuda.matmul.allow_tf32 = False
        for dtype in split(a.backward_dtypes):
            backward.append(backward_entry(shape, dtype, dtype in split(a.compile_dtypes)))
    with open(a.out, "w") as f:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2_mb = getattr(props, "L2_cache_size", 0) >> 20  # the timing text names this GPU's L2
        l2 = f"{l2_mb} MB" if l2_mb else "L2"
        json.dump({"systems": SYSTEMS, "timing": TIMING.format(l2=l2), "forward": forward,
                   "backward": backward}, f, indent=1)


# ---------------------------------------------------------------------------------------------
# JIT latency: planning in fresh processes against an empty and then a filled disk cache.
# ---------------------------------------------------------------------------------------------
JIT_PROBLEMS = [("4096x4096x4096", "bf16", "train"), ("4096x4096x4096", "bf16", "eval"),
                ("128x512x1024", "bf16", "train"), ("1024x1024x1024", "fp32", "train")]


def plan_args(shape, dtype, mode):
    M, N, K = (int(v) for v in shape.split("x"))
    return (M, N, K, dtype, mode, "fp32", 1e-5, 0.1, True, True, True, K, K, N, 0)


def cmd_plan_once(a):
    """Child process: plan a.problem (cold or warm by the cache dir it is given), then plan it
    again and plan another M of its M class (hot: in-process), printing the times as JSON."""
    shape, dtype, mode = a.problem.split(":")
    args = plan_args(shape, dtype, mode)
    t0 = time.perf_counter()
    p = fusejit._C.Plan(*args)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fusejit._C.Plan(*args)
    again = time.perf_counter() - t0
    t0 = time.perf_counter()
    fusejit._C.Plan(args[0] - 1, *args[1:])
    other_m = time.perf_counter() - t0
    print(json.dumps({"first_s": first, "again_s": again, "other_m_s": other_m,
                      "kernels": len(p.kernel_names), "config": p.config}))


def cmd_jit(a):
    import tempfile
    out = []
    env = dict(os.environ)
    env.pop("FUSEJIT_AUTOTUNE", None)
    for shape, dtype, mode in JIT_PROBLEMS:
        name = f"{shape} {dtype} {mode}"
        with tempfile.TemporaryDirectory(prefix="fj-jit-") as d:
            env["FUSEJIT_CACHE_DIR"] = d
            runs = []
            for _ in range(2):  # an empty cache (compile), then a new process on the filled one
                p = subprocess.run([sys.executable, __file__, "plan-once", "--problem",
                                    f"{shape}:{dtype}:{mode}"], env=env, capture_output=True,
                                   text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"plan-once {shape} {dtype} {mode}: {p.stderr[-2000:]}")
                runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        cfg = runs[0]["config"]
        out += [
            {"name": f"cold plan (NVRTC compile), {name}", "value": runs[0]["first_s"] * 1e3,
             "unit": "ms", "detail": f"empty disk cache, new process; {cfg}"},
            {"name": f"warm plan (disk cache), {name}", "value": runs[1]["first_s"] * 1e3,
             "unit": "ms", "detail": "filled disk cache, new process"},
            {"name": f"hot plan (in process), {name}", "value": runs[1]["again_s"] * 1e6,
             "unit": "us", "detail": "same problem planned again in the process"},
            {"name": f"hot plan, new batch size, {name}", "value": runs[1]["other_m_s"] * 1e6,
             "unit": "us", "detail": "M-1: same M class, no compile"},
        ]
    # Host time per call from Python: the extension's Plan.run alone and the module's forward.
    M, N, K = 128, 512, 1024
    torch.manual_seed(0)
    model = Model(K, N).cuda().to(torch.bfloat16).eval()
    ours = fjt.LinearScaleBatchNorm1d.from_module(model).eval()
    x = torch.rand(M, K, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        t_end = time.time() + 1.0  # host clocks ramp up under load
        while time.time() < t_end:
            host_us(lambda: ours(x), bursts=1)
        plan = fusejit._C.Plan(*plan_args(f"{M}x{N}x{K}", "bf16", "eval"))
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        vec = [t.float().contiguous() for t in (model.gemm.bias, model.scale, model.bn.weight,
                                                model.bn.bias, model.bn.running_mean,
                                                model.bn.running_var)]
        w = model.gemm.weight.detach()
        stream = torch.cuda.current_stream().cuda_stream
        args = [x.data_ptr(), w.data_ptr(), y.data_ptr()] + [v.data_ptr() for v in vec] + [
            0, 0, 0, 0, 0]
        rows = [("host per call: _C.Plan.run, 128x512x1024 bf16 eval", lambda: plan.run(
            stream, *args)),
                ("host per call: fusejit.torch module forward, 128x512x1024 bf16 eval",
                 lambda: ours(x)),
                ("host per call: F.linear, 128x512x1024 bf16", lambda: F.linear(
                    x, w, model.gemm.bias))]
        for name, fn in rows:
            out.append({"name": name, "value": host_us(fn), "unit": "us",
                        "detail": "thread CPU time, median of 20 bursts of 100 calls"})
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


def cmd_assemble(a):
    meas = json.load(open(a.measure))
    jit = json.load(open(a.jit)) if a.jit else []
    autotune = []
    if a.autotune:
        for r in json.load(open(a.autotune))["results"]:
            if "failure" in r:
                continue
            ref = r.get("reference_ms")
            autotune.append({"shape": r["shape"], "dtype": r["dtype"], "mode": r["mode"],
                             "seconds": r["seconds"], "winner": r["winner"],
                             "candidates": len(r["candidates"]), "winner_ms": r["winner_ms"],
                             "reference_ms": ref})
        secs = [t["seconds"] for t in autotune]
        if secs:
            jit += [{"name": "autotune wall per problem (median)", "value": statistics.median(secs),
                     "unit": "s", "detail": f"{len(secs)} problems, fusejit autotune"},
                    {"name": "autotune wall per problem (max)", "value": max(secs), "unit": "s",
                     "detail": "compile (mostly cached), time, verify against float64"}]
    if a.host:
        # Its headline rows (those with a target) of sections 0-3: the launch primitives, the
        # planning loop, hot plans and the host time per run; wall time only (CPU time reads
        # the same within 1%), and of the driver's calls the launches alone.
        for m in json.load(open(a.host))["measurements"]:
            name = m["name"]
            if m.get("unit") in ("us", "ms", "s") and isinstance(m.get("value"), (int, float)) \
                    and "target" in m and name[0] in "0123" and "CPU per" not in name \
                    and (not name.startswith("0 ") or "Launch" in name):
                jit.append({"name": m["name"], "value": float(m["value"]), "unit": m["unit"],
                            "detail": "bench/host_cost.cpp (C++ API)"})
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "cc": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "driver": a.driver, "cuda": a.cuda,
            "torch": torch.__version__, "python": platform.python_version(),
            "fusejit": f"{fusejit.__version__} (git {a.git})",
            "date": datetime.date.today().isoformat(), "command": a.command,
            "clocks": a.clocks, "timing": meas["timing"], "seconds": a.seconds}
    raw = {"schema": "fusejit-report/1", "meta": meta, "systems": meas["systems"],
           "forward": meas["forward"], "backward": meas["backward"], "autotune": autotune,
           "jit": jit}
    with open(a.out, "w") as f:
        json.dump(raw, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--shapes", default=SHAPES)
    m.add_argument("--dtypes", default="bf16,fp16,tf32,fp32")
    m.add_argument("--modes", default="train,eval")
    m.add_argument("--backward-dtypes", default="bf16")
    m.add_argument("--compile-dtypes", default="bf16", help="torch.compile these dtypes only "
                   "(seconds of compile per graph)")
    m.add_argument("--configs", default="", help="also time fusejit forced to these kernel "
                   "configs (keys as `fusejit bench` prints them), comma-separated")
    m.add_argument("--errors", action="store_true", help="also each system's forward output's "
                   "relative error against the layer in float64 (\"errors\" of each entry)")
    j = sub.add_parser("jit")
    j.add_argument("--out", required=True)
    p = sub.add_parser("plan-once")
    p.add_argument("--problem", required=True)
    s = sub.add_parser("assemble")
    s.add_argument("--out", required=True)
    s.add_argument("--measure", required=True)
    s.add_argument("--jit")
    s.add_argument("--autotune")
    s.add_argument("--host")
    for k in ("driver", "cuda", "clocks", "git", "command"):
        s.add_argument(f"--{k}", default="")
    s.add_argument("--seconds", type=float, default=0)
    a = ap.parse_args()
    {"measure": cmd_measure, "jit": cmd_jit, "plan-once": cmd_plan_once,
     "assemble": cmd_assemble}[a.cmd](a)


if __name__ == "__main__":
    main()
