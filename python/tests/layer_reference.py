"""What both test files compare fusejit.torch with: the seeds' Model as an nn.Module with the
options the fused module takes, inputs and parameters drawn the same way, and the error
measure. Imported by test_torch.py (GPU) and test_torch_cpu.py (CPU) after they have made sure
PyTorch is there."""
import copy

import torch
import torch.nn as nn


class RefModel(nn.Module):
    """The seeds' Model (shared/spec/reference_model.py) with the nn options the fused module
    takes; forward is the same three calls."""

    def __init__(self, in_features, out_features, scale_shape=None, eps=1e-5, momentum=0.1,
                 bias=True, affine=True, track_running_stats=True):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=bias)
        self.scale = nn.Parameter(torch.randn(scale_shape or (out_features,)))
        self.bn = nn.BatchNorm1d(out_features, eps=eps, momentum=momentum, affine=affine,
                                 track_running_stats=track_running_stats)

    def forward(self, x):
        x = self.gemm(x)
        x = x * self.scale
        x = self.bn(x)
        return x


def rel_err(a, b):
    """max |a - b| / max |b|, in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def make_x(M, K, kind="rand", dtype=torch.float32, device="cpu"):
    # "rand" is KernelBench's uniform [0, 1): every column of x W^T has a large mean against
    # its spread. Never zeros either way.
    if kind == "rand":
        x = torch.rand(M, K, device=device) * 0.999 + 0.001
    else:
        x = torch.randn(M, K, device=device)
    return x.to(dtype)


def make_ref(K, N, seed=0, **kw):
    torch.manual_seed(seed)
    m = RefModel(K, N, **kw)
    with torch.no_grad():
        if m.bn.affine:
            m.bn.weight.uniform_(0.5, 1.5)
            m.bn.bias.normal_(0.0, 0.2)
        if m.bn.track_running_stats:
            m.bn.running_mean.normal_(0.0, 0.3)
            m.bn.running_var.uniform_(0.5, 2.0)
    return m


def pair(K, N, dtype=torch.float32, device="cpu", **kw):
    """(fused module, float64 reference) holding the same values."""
    import fusejit.torch as fjt

    ref = make_ref(K, N, **kw).to(device, dtype)
    ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
    return ours, copy.deepcopy(ref).double()


def assert_stats_match(ours, ref64, tol):
    if ref64.bn.running_mean is None:
        assert ours.bn.running_mean is None and ours.bn.running_var is None
        return
    assert rel_err(ours.bn.running_mean, ref64.bn.running_mean) < tol
    assert rel_err(ours.bn.running_var, ref64.bn.running_var) < tol
    assert int(ours.bn.num_batches_tracked) == int(ref64.bn.num_batches_tracked)


def grads(module):
    """The layer's parameter gradients by role (the fused module and RefModel share the names)."""
    return {
        "weight": module.gemm.weight.grad,
        "bias": module.gemm.bias.grad,
        "scale": module.scale.grad,
        "gamma": module.bn.weight.grad,
        "beta": module.bn.bias.grad,
    }
