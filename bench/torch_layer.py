"""fusejit.torch against the seeds' Model, as a PyTorch user sees it (issue 19's benchmark).

One process, CUDA-event medians: the fused module vs Model eager vs torch.compile(Model) for the
forward in train and eval mode and for forward + backward (train and eval with the fused backward,
train with the PyTorch-ops one: "f+b pt"), bf16; then the host time per
call of the module's forward beside the extension's plan.run alone (the binding's overhead).
    python3 bench/torch_layer.py [--shapes 1024x8192x8192,...] [--runs 20]
"""
import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import fusejit.torch as fjt
from timing import median_ms


class Model(nn.Module):  # the seeds' Model: Linear -> * scale -> BatchNorm1d
    def __init__(self, k, n):
        super().__init__()
        self.gemm = nn.Linear(k, n)
        self.scale = nn.Parameter(torch.randn(n) * 0.02 + 1.0)
        self.bn = nn.BatchNorm1d(n)

    def forward(self, x):
        return self.bn(self.gemm(x) * self.scale)


def host_us(fn, bursts=20, calls=100):
    """Median host CPU time per call (thread time) over bursts of `calls` calls, each burst
    after a synchronize: a burst's launches fit in the GPU's queue, so no call waits for the GPU
    (a long unsynchronized loop fills the queue and then times the GPU instead)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(bursts):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        samples.append((time.thread_time() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1024x8192x8192,16384x4096x4096,4096x4096x4096,128x512x1024")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="cProfile the module's eval forward")
    a = ap.parse_args()
    dt = torch.bfloat16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; per row: median of "
          f"{a.runs} samples, each the mean of 10 back-to-back calls between CUDA events, after "
          "5 warm-ups; inputs fixed (L2 warm for the small shape)")
    print(f"{'shape':<18}{'what':<14}{'fusejit ms':>12}{'eager ms':>10}{'compile ms':>12}"
          f"{'vs eager':>10}{'vs compile':>11}")
    for shape in filter(None, a.shapes.split(",")):  # --shapes "": the host times alone
        M, N, K = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        model = Model(K, N).cuda().to(dt)
        ours = fjt.LinearScaleBatchNorm1d.from_module(model)
        compiled = torch.compile(copy.deepcopy(model))
        x = torch.rand(M, K, device="cuda", dtype=dt)
        xg = x.clone().requires_grad_()
        dy = torch.randn(M, N, device="cuda", dtype=dt)
        # fwd+bwd with fusejit's fused backward (the default), and with the PyTorch-ops one.
        for what in ("train fwd", "eval fwd", "train fwd+bwd", "eval fwd+bwd", "train f+b pt"):
            train = what.startswith("train")
            backward = what.endswith("bwd") or what.endswith("pt")
            fjt.set_backward("pytorch" if what.endswith("pt") else "fused")
            for m in (model, ours, compiled):
                m.train(train)

            def step(m):
                if backward:
                    return lambda: m(xg).backward(dy)
                return lambda: m(x)

            with torch.set_grad_enabled(backward):
                t = [median_ms(step(m), a.runs) for m in (ours, model, compiled)]
            print(f"{shape:<18}{what:<14}{t[0]:>12.4f}{t[1]:>10.4f}{t[2]:>12.4f}"
                  f"{t[1] / t[0]:>9.2f}x{t[2] / t[0]:>10.2f}x")
    # Host time per call: the module's forward (no grad: the recorded call; autograd on: the
    # checked call and the autograd Function), the functional form, and the extension's plan.run
    # alone on the same tensors, with PyTorch's own module call and torch.empty for scale.
    M, N, K = 128, 512, 1024
    torch.manual_seed(0)
    ours = fjt.LinearScaleBatchNorm1d.from_module(Model(K, N).cuda().to(dt))
    x = torch.rand(M, K, device="cuda", dtype=dt)
    plan = fjt._C.Plan(M, N, K, "bf16", "eval", "fp32", 1e-5, 0.1, True, True, True, 0, 0, 0, 0)
    y = torch.empty(M, N, device="cuda", dtype=dt)
    p = {k: v.float().contiguous() for k, v in
         dict(b=ours.gemm.bias, s=ours.scale, g=ours.bn.weight, bt=ours.bn.bias,
              rm=ours.bn.running_mean, rv=ours.bn.running_var).items()}
    w = ours.gemm.weight.detach()
    stream = torch.cuda.current_stream().cuda_stream
    ident = nn.Identity()

    def raw():
        plan.run(stream, x.data_ptr(), w.data_ptr(), y.data_ptr(), p["b"].data_ptr(),
                 p["s"].data_ptr(), p["g"].data_ptr(), p["bt"].data_ptr(), p["rm"].data_ptr(),
                 p["rv"].data_ptr(), 0, 0, 0, 0, 0, 0)

    saved = torch.empty(M, N, device="cuda", dtype=dt)

    def raw_saved():
        plan.run(stream, x.data_ptr(), w.data_ptr(), y.data_ptr(), p["b"].data_ptr(),
                 p["s"].data_ptr(), p["g"].data_ptr(), p["bt"].data_ptr(), p["rm"].data_ptr(),
                 p["rv"].data_ptr(), 0, 0, 0, 0, 0, saved.data_ptr())

    def functional():
        bn = ours.bn
        return fjt.linear_scale_batch_norm(
            x, ours.gemm.weight, ours.gemm.bias, ours.scale, bn.weight, bn.bias,
            bn.running_mean, bn.running_var, training=False)

    print("\nhost time per call, 128x512x1024 bf16 (thread CPU time, median of 20 bursts of 100 "
          "calls, synchronized between bursts), and the time per call of a loop (CUDA events "
          "around 10 calls: the host's or the GPU's, whichever is longer):")
    # One second of calls first: the host's clocks ramp up under load (the first row of a
    # fresh process measured 24.5 us where the same row measured 16.2 us in the next process).
    with torch.no_grad():
        t_end = time.time() + 1.0
        while time.time() < t_end:
            host_us(lambda: ours(x), bursts=1)
    rows = []

    def measure(what, fn):
        rows.append((what, host_us(fn), median_ms(fn, 10)))

    forward = lambda: ours(x)  # noqa: E731
    for mode in ("eval", "train"):
        ours.train(mode == "train")
        with torch.no_grad():
            measure(f"module forward, {mode}, no grad (recorded call)", forward)
        measure(f"module forward, {mode}, autograd on (recorded, Function)", forward)
    ours.eval()
    with torch.no_grad():
        measure("linear_scale_batch_norm, eval, no grad", functional)
        measure("nn.Identity module call (PyTorch's own)", lambda: ident(x))
        b16 = p["b"].to(dt)
        measure("F.linear (PyTorch's own op, same x and weight)", lambda: F.linear(x, w, b16))
        measure("torch.empty of y", lambda: torch.empty(M, N, device="cuda", dtype=dt))
        measure("_C.Plan.run, eval, writing saved too", raw_saved)
        measure("_C.Plan.run alone (eval, the op's own host time)", raw)
    run = rows[-1][1]
    for what, us, ms in rows:
        print(f"  {what:<58}{us:>7.1f} us  (beyond Plan.run: {us - run:5.1f})  "
              f"loop {ms * 1e3:7.1f} us/call")
    if a.profile:
        import cProfile
        import pstats

        ours.eval()
        with torch.no_grad():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                ours(x)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
