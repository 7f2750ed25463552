"""GPU timing shared by the PyTorch-side benchmarks (torch_layer.py, sync_bn_torch.py)."""
import statistics

import torch


def median_ms(fn, runs, warmup=5, per_sample=10):
    """Median over `runs` samples of the mean time of `per_sample` back-to-back calls: the
    queue stays full, so a call's host time hides behind the previous call's kernels, as in a
    training loop (one call between events would time the host's launch latency too)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_sample):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / per_sample)
    return statistics.median(times)
