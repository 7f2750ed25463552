"""fusejit.torch against the seeds' Model evaluated in float64.

Needs PyTorch, a CUDA device fusejit supports (sm_80+) and the built extension fusejit._C;
without any of them the whole module is skipped, saying which. FUSEJIT_TEST_DEVICE (default
"cuda") exists for harnesses that stand in an extension for another device type; the CUDA-only
tests (graphs) skip there.
"""
import copy
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusejit  # noqa: E402

DEVICE = os.environ.get("FUSEJIT_TEST_DEVICE", "cuda")
if fusejit._C is None:
    pytest.skip(
        f"fusejit._C is not built or does not load: {fusejit._C_import_error}",
        allow_module_level=True,
    )
if DEVICE == "cuda":
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)
    _ok, _why = fusejit._C.device_supported(torch.cuda.current_device())
    if not _ok:
        pytest.skip(f"fusejit cannot run on this GPU: {_why}", allow_module_level=True)

import fusejit.torch as fjt  # noqa: E402
import layer_reference  # noqa: E402
from layer_reference import RefModel, assert_stats_match, make_ref, rel_err  # noqa: E402,F401
from layer_reference import grads as _grads  # noqa: E402

cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")

# Relative error (max |a - b| / max |b|) against float64.
TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
GRAD_TOL = {k: 2 * v for k, v in TOL.items()}


def set_tf32(on):
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        m.fp32_precision = "tf32" if on else "ieee"
    else:
        m.allow_tf32 = on


@pytest.fixture(autouse=True)
def _strict_fp32_and_fresh_state():
    # fp32 means fp32 unless a test asks for tf32; every test starts with no one-time warnings
    # given and the default backward (fused).
    set_tf32(False)
    fjt._reset_warnings()
    fjt.set_backward("fused")
    yield
    set_tf32(False)
    fjt.set_backward("fused")


def make_x(M, K, kind="rand", dtype=torch.float32, device=DEVICE):
    return layer_reference.make_x(M, K, kind, dtype, device)


def pair(K, N, dtype=torch.float32, **kw):
    return layer_reference.pair(K, N, dtype, DEVICE, **kw)


def fresh_pair(K, N, dtype=torch.float32, train=True):
    """pair() in train or eval mode, with no plan cached from an earlier test."""
    fjt.clear_plan_cache()
    ours, ref64 = pair(K, N, dtype)
    ours.train(train)
    ref64.train(train)
    return ours, ref64


def dscale_error(got, ref64, x64, dy):
    """Train-mode dscale's error against the size of its terms. It is g eps invstd^3 sum dy c
    (c = x W^T less its batch column mean), and the fused backward reads c as the forward saved
    it, rounded to the storage type: a column whose sum cancels keeps that rounding's precision
    of its terms, not of its value (`fusejit check --backward` measures it the same way)."""
    want = ref64.scale.grad
    with torch.no_grad():
        a = F.linear(x64, ref64.gemm.weight)
        c = a - a.mean(0)
        z = ref64.scale * a
        invstd = torch.rsqrt(z.var(0, unbiased=False) + ref64.bn.eps)
        g = ref64.bn.weight.abs() if ref64.bn.affine else 1.0
        natural = g * ref64.bn.eps * invstd**3 * (dy.double() * c).abs().sum(0)
    return ((got.double() - want).abs().max() / (want.abs() + natural).max()).item()


# ------------------------------------------------------------------------------------------------
# Forward
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["rand", "randn"])
def test_forward_matches_reference(dtype, train, bias, kind):
    M, K, N = 300, 192, 136
    ours, ref64 = pair(K, N, dtype, bias=bias)
    ours.train(train)
    ref64.train(train)
    x = make_x(M, K, kind, dtype)
    y = ours(x)
    assert y.dtype == dtype and y.shape == (M, N) and y.device == x.device
    assert rel_err(y, ref64(x.double())) < TOL[dtype]
    assert_stats_match(ours, ref64, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_odd_shapes(dtype):
    for M, K, N in [(2, 1, 1), (3, 7, 5), (129, 33, 65)]:
        ours, ref64 = pair(K, N, dtype)
        for train in (True, False):
            ours.train(train)
            ref64.train(train)
            x = make_x(M, K, "randn", dtype)
            assert rel_err(ours(x), ref64(x.double())) < TOL[dtype], (M, K, N, train)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_momentum_none_is_cumulative_average(dtype):
    K, N = 96, 80
    ours, ref64 = pair(K, N, dtype, momentum=None)
    for M in (64, 17, 128):
        x = make_x(M, K, "rand", dtype)
        assert rel_err(ours(x), ref64(x.double())) < TOL[dtype]
        assert_stats_match(ours, ref64, TOL[dtype])
    assert int(ours.bn.num_batches_tracked) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_running_stats_uses_batch_stats_in_eval_too(dtype):
    K, N, M = 96, 80, 50
    ours, ref64 = pair(K, N, dtype, track_running_stats=False)
    assert ours.bn.running_mean is None and ours.bn.num_batches_tracked is None
    for train in (True, False):
        ours.train(train)
        ref64.train(train)
        x = make_x(M, K, "rand", dtype)
        assert rel_err(ours(x), ref64(x.double())) < TOL[dtype]


def test_affine_false():
    K, N, M = 64, 48, 40
    ours, ref64 = pair(K, N, affine=False)
    for train in (True, False):
        ours.train(train)
        ref64.train(train)
        x = make_x(M, K)
        assert rel_err(ours(x), ref64(x.double())) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_running_stats_over_three_steps_with_changing_batch(dtype):
    K, N = 256, 192
    ours, ref64 = pair(K, N, dtype)
    for M in (300, 7, 1000):
        x = make_x(M, K, "rand", dtype)
        assert rel_err(ours(x), ref64(x.double())) < TOL[dtype], M
        assert_stats_match(ours, ref64, TOL[dtype])
    assert int(ours.bn.num_batches_tracked) == 3
    ours.eval()
    ref64.eval()
    x = make_x(33, K, "rand", dtype)
    assert rel_err(ours(x), ref64(x.double())) < TOL[dtype]
    assert int(ours.bn.num_batches_tracked) == 3


def test_strided_and_unaligned_inputs():
    M, K, N = 100, 64, 48
    ours, ref64 = pair(K, N)
    ours.eval()
    ref64.eval()
    big = make_x(M, K + 8)
    padded = big[:, :K]  # rows 288 bytes apart: handed to the kernel as they are
    assert rel_err(ours(padded), ref64(padded.double())) < TOL[torch.float32]
    shifted = big[:, 1:K + 1]  # 4 bytes off 16-byte alignment: copied, with one warning
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y1 = ours(shifted)
        y2 = ours(shifted)
    assert len([m for m in w if "fusejit" in str(m.message)]) == 1
    assert rel_err(y1, ref64(shifted.double())) < TOL[torch.float32]
    assert torch.equal(y1, y2)
    transposed = make_x(K, M).t()
    assert rel_err(ours(transposed), ref64(transposed.double())) < TOL[torch.float32]


def test_tf32_opt_in():
    M, K, N = 256, 512, 128
    ours, ref64 = pair(K, N)
    set_tf32(True)
    x = make_x(M, K, "randn")
    assert rel_err(ours(x), ref64(x.double())) < 5e-3


def test_errors():
    ours, _ = pair(16, 8)
    with pytest.raises(ValueError, match="2-D"):
        ours(torch.rand(2, 3, 16, device=DEVICE))
    with pytest.raises(ValueError, match="more than 1 value"):
        ours(make_x(1, 16))
    with pytest.raises(ValueError, match="dtype"):
        ours(make_x(4, 16, dtype=torch.bfloat16))
    ours.eval()
    assert ours(make_x(1, 16)).shape == (1, 8)  # one row is fine with running stats


# ------------------------------------------------------------------------------------------------
# Modules and state
# ------------------------------------------------------------------------------------------------
def test_state_dict_round_trip_with_seeds_model():
    K, N, M = 48, 40, 32
    torch.manual_seed(3)
    ref = RefModel(K, N)
    torch.manual_seed(3)
    ours = fjt.LinearScaleBatchNorm1d(K, N)
    # Same keys in the same order, and one seed gives the same initial values.
    assert list(ours.state_dict().keys()) == list(ref.state_dict().keys())
    assert set(ours.state_dict().keys()) == {
        "gemm.weight", "gemm.bias", "scale", "bn.weight", "bn.bias", "bn.running_mean",
        "bn.running_var", "bn.num_batches_tracked",
    }
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k

    ref = make_ref(K, N, seed=4).to(DEVICE)
    ours = fjt.LinearScaleBatchNorm1d(K, N, device=DEVICE)
    ours.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    x = make_x(M, K)
    assert rel_err(ours(x), ref64(x.double())) < TOL[torch.float32]
    back = RefModel(K, N).to(DEVICE)
    back.load_state_dict(ours.state_dict())
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_from_module_copies_or_shares():
    K, N, M = 48, 40, 32
    ref = make_ref(K, N).to(DEVICE)
    copied = fjt.LinearScaleBatchNorm1d.from_module(ref)
    shared = fjt.LinearScaleBatchNorm1d.from_module(ref, share=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(copied.state_dict()[k], v)
        assert copied.state_dict()[k].data_ptr() != v.data_ptr() or v.numel() == 0
        assert shared.state_dict()[k].data_ptr() == v.data_ptr()
    ref64 = copy.deepcopy(ref).double()
    x = make_x(M, K)
    assert rel_err(copied(x), ref64(x.double())) < TOL[torch.float32]
    assert int(ref.bn.num_batches_tracked) == 0  # the copy's step left the original alone
    shared(x)
    assert int(ref.bn.num_batches_tracked) == 1
    ref.eval()
    assert not fjt.LinearScaleBatchNorm1d.from_module(ref).training


# ------------------------------------------------------------------------------------------------
# Backward
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backward", ["fused", "pytorch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kind", ["rand", "randn"])
def test_backward_matches_float64_autograd(backward, dtype, train, kind):
    fjt.set_backward(backward)
    M, K, N = 200, 96, 72
    ref = make_ref(K, N).to(DEVICE, dtype)
    with torch.no_grad():
        ref.bn.weight[5] = 0  # a gamma = 0 column still has a gradient for gamma
    ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
    ref64 = copy.deepcopy(ref).double()
    ours.train(train)
    ref64.train(train)
    x = make_x(M, K, kind, dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    dy = torch.randn(M, N, device=DEVICE).to(dtype)
    y = ours(x)
    y.backward(dy)
    y64 = ref64(x64)
    y64.backward(dy.double())
    tol = GRAD_TOL[dtype]
    assert x.grad.dtype == dtype
    assert rel_err(x.grad, x64.grad) < tol
    got, want = _grads(ours), _grads(ref64)
    for name in ("weight", "scale", "gamma", "beta"):
        assert got[name].dtype == dtype, name
        if name == "scale" and train and backward == "fused":
            assert dscale_error(got[name], ref64, x64, dy) < tol
        else:
            assert rel_err(got[name], want[name]) < tol, name
    assert want["gamma"][5].abs() > 0 and rel_err(got["gamma"][5], want["gamma"][5]) < tol
    if train:
        # db is 0 in exact math (the fused backward writes 0); the reference's is its rounding
        # noise: bound the difference by the size of the terms.
        with torch.no_grad():
            z = ref64.scale * ref64.gemm(x64)
            size = (dy.double().abs().sum(0) * (ref64.scale * ref64.bn.weight).abs()
                    / z.std(0)).max()
        assert (got["bias"].double() - want["bias"]).abs().max() < tol * size
    else:
        assert rel_err(got["bias"], want["bias"]) < tol


@pytest.mark.parametrize("backward", ["fused", "pytorch"])
def test_backward_without_bias_and_affine(backward):
    fjt.set_backward(backward)
    M, K, N = 64, 32, 24
    ours, ref64 = pair(K, N, bias=False, affine=False)
    x = make_x(M, K, "randn").requires_grad_()
    x64 = x.detach().double().requires_grad_()
    dy = torch.randn(M, N, device=DEVICE)
    ours(x).backward(dy)
    ref64(x64).backward(dy.double())
    assert rel_err(x.grad, x64.grad) < GRAD_TOL[torch.float32]
    assert rel_err(ours.scale.grad, ref64.scale.grad) < GRAD_TOL[torch.float32]
    assert rel_err(ours.gemm.weight.grad, ref64.gemm.weight.grad) < GRAD_TOL[torch.float32]


def test_set_backward():
    # Both backwards match float64; "fused" runs fusejit's backward plan (cached beside the
    # forward's), "pytorch" does not.
    for kind in ("pytorch", "fused"):
        fjt.set_backward(kind)
        assert fjt.get_backward() == kind
        fjt.clear_plan_cache()
        ours, ref64 = pair(32, 16)
        x = make_x(40, 32, "randn").requires_grad_()
        x64 = x.detach().double().requires_grad_()
        # A random dy: the gradient of e.g. sum(y^2) through BatchNorm cancels to nearly nothing.
        dy = torch.randn(40, 16, device=DEVICE)
        ours(x).backward(dy)
        ref64(x64).backward(dy.double())
        ran_backward_plan = any(k[0] == "backward" for k in fjt._plan_cache)
        assert ran_backward_plan == (kind == "fused" and DEVICE == "cuda")
        tol = GRAD_TOL[torch.float32]
        assert rel_err(x.grad, x64.grad) < tol, kind
        assert rel_err(ours.gemm.weight.grad, ref64.gemm.weight.grad) < tol, kind
        assert rel_err(ours.scale.grad, ref64.scale.grad) < tol, kind
        assert rel_err(ours.bn.weight.grad, ref64.bn.weight.grad) < tol, kind
    with pytest.raises(ValueError):
        fjt.set_backward("cudnn")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
def test_fused_backward_odd_shapes_and_strided_x(dtype, train):
    # Rows only element-aligned (the tiled gradient GEMMs), M = 2 (eval: in train, dx of two
    # rows is a tiny remainder of cancelling terms, which `fusejit check --backward` measures
    # against their size), and x a column slice.
    for M, K, N in ((37, 45, 29), (300, 136, 72)) + (() if train else ((2, 24, 16),)):
        ref = make_ref(K, N).to(DEVICE, dtype)
        ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
        ref64 = copy.deepcopy(ref).double()
        ours.train(train)
        ref64.train(train)
        wide = make_x(M, K + 8, "randn", dtype)
        x = wide[:, 3:3 + K].detach().requires_grad_()
        x64 = x.detach().double().requires_grad_()
        dy = torch.randn(M, N, device=DEVICE).to(dtype)
        ours(x).backward(dy)
        ref64(x64).backward(dy.double())
        tol = GRAD_TOL[dtype]
        assert rel_err(x.grad, x64.grad) < tol, (M, K, N)
        got, want = _grads(ours), _grads(ref64)
        for name in ("weight", "scale", "gamma", "beta"):
            if name == "scale" and train:
                assert dscale_error(got[name], ref64, x64, dy) < tol, (M, K, N)
            else:
                assert rel_err(got[name], want[name]) < tol, (M, K, N, name)


# ------------------------------------------------------------------------------------------------
# Ops, torch.compile, CUDA graphs
# ------------------------------------------------------------------------------------------------
def test_opcheck():
    M, K, N = 16, 24, 12
    d = dict(device=DEVICE)
    x, w = make_x(M, K), torch.randn(N, K, **d) * 0.2
    vec = [torch.rand(N, **d) + 0.5 for _ in range(4)]
    rm, rv = torch.randn(N, **d) * 0.1, torch.rand(N, **d) + 0.5
    nbt = torch.zeros((), dtype=torch.long, **d)
    torch.library.opcheck(
        torch.ops.fusejit.linear_scale_bn_train.default,
        (x, w, *vec, rm, rv, nbt, 1e-5, 0.1),
    )
    torch.library.opcheck(
        torch.ops.fusejit.linear_scale_bn_train_saving.default,
        (x, w, *vec, rm, rv, nbt, 1e-5, 0.1),
    )
    torch.library.opcheck(
        torch.ops.fusejit.linear_scale_bn_eval_saving.default,
        (x, w, *vec, rm, rv, 1e-5),
    )
    y, mean, invstd, saved = torch.ops.fusejit.linear_scale_bn_train_saving(
        x, w, *vec, rm.clone(), rv.clone(), nbt.clone(), 1e-5, 0.1
    )
    dy = torch.randn_like(y)
    for needs in ([True] * 6, [False, True, False, True, True, False]):
        torch.library.opcheck(
            torch.ops.fusejit.linear_scale_bn_backward.default,
            (dy, x, w, saved, vec[0], vec[1], vec[2], mean, invstd, True, True, 1e-5, needs),
        )
    torch.library.opcheck(
        torch.ops.fusejit.linear_scale_bn_eval.default,
        (x.requires_grad_(), w.requires_grad_(), *vec, rm, rv, 1e-5),
    )


@pytest.mark.parametrize("backward", ["fused", "pytorch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
def test_torch_compile_fullgraph_matches_eager(backward, dtype, train):
    fjt.set_backward(backward)
    torch._dynamo.reset()
    M, K, N = 128, 96, 64
    ours, _ = pair(K, N, dtype)
    ours.train(train)
    eager = copy.deepcopy(ours)
    compiled = torch.compile(ours, fullgraph=True)
    tol = TOL[dtype]
    for step in range(2):
        x = make_x(M, K, "rand", dtype)
        xe = x.clone().requires_grad_()
        xc = x.clone().requires_grad_()
        dy = torch.randn(M, N, device=DEVICE).to(dtype)
        ye, yc = eager(xe), compiled(xc)
        assert rel_err(yc, ye) < tol, step
        ye.backward(dy)
        yc.backward(dy)
        assert rel_err(xc.grad, xe.grad) < tol
        assert rel_err(ours.gemm.weight.grad, eager.gemm.weight.grad) < tol
        assert rel_err(ours.bn.weight.grad, eager.bn.weight.grad) < tol
    if train:
        assert int(ours.bn.num_batches_tracked) == 2
        assert rel_err(ours.bn.running_mean, eager.bn.running_mean) < tol
        assert rel_err(ours.bn.running_var, eager.bn.running_var) < tol
    with torch.no_grad():
        x = make_x(M, K, "rand", dtype)
        assert rel_err(compiled(x), eager(x)) < tol


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
def test_cuda_graph_replays(dtype, train):
    M, K, N = 256, 128, 96
    ours, _ = pair(K, N, dtype)
    ours.train(train)
    static_x = make_x(M, K, "rand", dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):  # plans made and kernels loaded before capture
            ours(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y = ours(static_x)
    eager = copy.deepcopy(ours)  # capturing ran nothing: same state as after the warm-up
    for _ in range(3):
        x = make_x(M, K, "rand", dtype)
        static_x.copy_(x)
        graph.replay()
        with torch.no_grad():
            ye = eager(x)
        torch.cuda.synchronize()
        assert rel_err(static_y, ye) < TOL[dtype]
    if train:
        assert int(ours.bn.num_batches_tracked) == int(eager.bn.num_batches_tracked) == 5
        assert rel_err(ours.bn.running_mean, eager.bn.running_mean) < TOL[dtype]
        assert rel_err(ours.bn.running_var, eager.bn.running_var) < TOL[dtype]


# ------------------------------------------------------------------------------------------------
# Fallbacks and autocast
# ------------------------------------------------------------------------------------------------
def _fallback_once(ours, ref, x):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            y = ours(x)
            want = ref(x)
            assert torch.equal(y, want)
    msgs = [str(m.message) for m in w if "fusejit" in str(m.message)]
    assert len(msgs) == 1, msgs
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k


@pytest.mark.skipif(DEVICE == "cpu", reason="the harness runs the kernel path on CPU")
def test_cpu_tensors_fall_back_with_one_warning():
    ref = make_ref(32, 24)
    ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
    _fallback_once(ours, ref, make_x(20, 32, device="cpu"))


def test_float64_falls_back_with_one_warning():
    ref = make_ref(32, 24).to(DEVICE, torch.float64)
    ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
    _fallback_once(ours, ref, make_x(20, 32, dtype=torch.float64))


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_autocast(low):
    M, K, N = 128, 96, 64
    ours, ref64 = pair(K, N)
    with torch.no_grad():
        ref64.gemm.weight.copy_(ref64.gemm.weight.to(low).double())  # what autocast feeds the GEMM
    x = make_x(M, K, "rand").requires_grad_()
    x64 = x.detach().to(low).double().requires_grad_()
    dy = torch.randn(M, N, device=DEVICE)
    with torch.autocast(DEVICE, dtype=low):
        y = ours(x)
    y64 = ref64(x64)
    assert y.dtype == low
    assert rel_err(y, y64) < TOL[low]
    y.float().backward(dy)
    y64.backward(dy.double())
    assert ours.gemm.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    assert rel_err(x.grad, x64.grad) < GRAD_TOL[low]
    assert rel_err(ours.gemm.weight.grad, ref64.gemm.weight.grad) < GRAD_TOL[low]
    assert rel_err(ours.bn.weight.grad, ref64.bn.weight.grad) < GRAD_TOL[low]


def test_import_fusejit_leaves_torch_alone():
    code = "import sys, fusejit; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@cuda_only
def test_first_compile_after_importing_torch(tmp_path):
    # A fresh process that imports torch first, then compiles a kernel set (an empty cache
    # directory: NVRTC runs, and its ptxas report is parsed with std::regex) and checks the
    # forward against float64. While libfusejit.so exported its libstdc++ instantiations, this
    # process bound fusejit's std::regex calls to PyTorch's and died of a stack overflow in the
    # first compile (H200; cmake/libfusejit.map). A subprocess, so that such a crash fails this
    # test instead of ending the session.
    code = "\n".join([
        "import torch, fusejit.torch as fjt, layer_reference",
        "torch.backends.cuda.matmul.allow_tf32 = False",  # strict fp32, whatever the environment
        "ours, ref64 = layer_reference.pair(96, 80, torch.float32, 'cuda')",
        "x = layer_reference.make_x(200, 96, 'rand', torch.float32, 'cuda')",
        "err = layer_reference.rel_err(ours(x), ref64(x.double()))",
        "assert err < 2e-5, err",
        "print('ok', err)",
    ])
    env = dict(os.environ, FUSEJIT_CACHE_DIR=str(tmp_path), FUSEJIT_AUTOTUNE="0")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(__file__), env.get("PYTHONPATH")) if p)
    # faulthandler: a crash leaves the Python stack in stderr.
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-3000:]}"
    assert p.stdout.startswith("ok"), p.stdout
    assert any(tmp_path.rglob("*.fjc")), "no kernel was compiled into the fresh cache"


def test_functional_form_matches_module():
    M, K, N = 64, 48, 40
    ours, ref64 = pair(K, N)
    x = make_x(M, K)
    bn = ours.bn
    y = fjt.linear_scale_batch_norm(
        x, ours.gemm.weight, ours.gemm.bias, ours.scale, bn.weight, bn.bias, bn.running_mean,
        bn.running_var, bn.num_batches_tracked, training=True, momentum=0.1, eps=1e-5,
    )
    assert rel_err(y, ref64(x.double())) < TOL[torch.float32]
    assert_stats_match(ours, ref64, TOL[torch.float32])


# ------------------------------------------------------------------------------------------------
# On the GPU: fusejit's kernels run (no silent fallback), on any stream, inside a graph with
# the backward
# ------------------------------------------------------------------------------------------------
@cuda_only
@pytest.mark.parametrize("train", [True, False])
def test_cuda_forward_runs_fusejit_kernels(train):
    ours, ref64 = fresh_pair(128, 96, torch.bfloat16, train=train)
    x = make_x(200, 128, "rand", torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        y = ours(x)
    assert fjt.plan_cache_size() >= 1
    with torch.no_grad():
        assert rel_err(y, ref64(x.double())) < TOL[torch.bfloat16]


@cuda_only
def test_non_default_stream():
    ours, ref64 = pair(96, 80, torch.float32)
    side = torch.cuda.Stream()
    x = make_x(300, 96, "randn")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = ours(x)
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        assert rel_err(y, ref64(x.double())) < TOL[torch.float32]
    assert_stats_match(ours, ref64, TOL[torch.float32])


@cuda_only
@pytest.mark.parametrize("backward", ["fused", "pytorch"])
def test_cuda_graph_captures_forward_and_backward(backward):
    fjt.set_backward(backward)
    M, K, N = 256, 128, 96
    ours, _ = pair(K, N, torch.bfloat16)
    static_x = make_x(M, K, "rand", torch.bfloat16).requires_grad_()
    static_dy = torch.randn(M, N, device=DEVICE).to(torch.bfloat16)
    params = [ours.gemm.weight, ours.gemm.bias, ours.scale, ours.bn.weight, ours.bn.bias]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # plans, kernels and the backward's allocations before capture
            ours(static_x).backward(static_dy)
    torch.cuda.current_stream().wait_stream(side)
    for p in params + [static_x]:
        p.grad = None
    eager = copy.deepcopy(ours)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = ours(static_x)
        static_y.backward(static_dy)
    x = make_x(M, K, "rand", torch.bfloat16)
    dy = torch.randn(M, N, device=DEVICE).to(torch.bfloat16)
    with torch.no_grad():
        static_x.copy_(x)
        static_dy.copy_(dy)
    graph.replay()
    xe = x.clone().requires_grad_()
    ye = eager(xe)
    ye.backward(dy)
    torch.cuda.synchronize()
    tol = 2 * TOL[torch.bfloat16]
    assert rel_err(static_y, ye) < tol
    assert rel_err(static_x.grad, xe.grad) < tol
    assert rel_err(ours.gemm.weight.grad, eager.gemm.weight.grad) < tol
    assert rel_err(ours.scale.grad, eager.scale.grad) < tol
    assert rel_err(ours.bn.weight.grad, eager.bn.weight.grad) < tol


@cuda_only
@pytest.mark.parametrize("train", [True, False])
def test_recorded_calls_follow_every_change(train):
    # A no-grad forward replays the module's checked call (fjt._RecordedCall) while the layer
    # and x's layout are as recorded. Each step changes one thing the replay must not miss;
    # every result is checked against float64: a stale plan or address gives a wrong y or
    # running stat.
    ours, ref64 = fresh_pair(96, 80, torch.float32, train=train)

    def check(M=200, step=""):
        x = make_x(M, ours.in_features, "randn", ours.gemm.weight.dtype)
        with torch.no_grad():
            y = ours(x)
            want = ref64(x.double())
        tol = TOL[x.dtype]
        assert rel_err(y, want) < tol, step
        assert_stats_match(ours, ref64, tol)
        return ours._recorded

    first = check(step="first")
    assert first is not None and first.c.plan_count == 1
    assert check(step="replay") is first  # same record, replayed
    check(M=64, step="new batch size")
    assert first.c.plan_count == 2
    with torch.no_grad():
        for m in (ours, ref64):
            m.bn.eps = 1e-2
            m.bn.momentum = 0.3
    assert check(step="eps and momentum") is not first
    with torch.no_grad():
        w = torch.randn_like(ref64.gemm.weight) * 0.1
        ours.gemm.weight.data = w.to(ours.gemm.weight.dtype)  # new address, same object
        ref64.gemm.weight.data = w.clone()
    check(step="weight.data =")
    with torch.no_grad():
        b = nn.Parameter(torch.randn_like(ref64.gemm.bias))
        ours.gemm.bias = nn.Parameter(b.detach().float())  # a new object
        ref64.gemm.bias = b
    check(step="new bias parameter")
    fjt.clear_plan_cache()
    check(step="after clear_plan_cache")
    ours.train(not train)
    ref64.train(not train)
    check(step="mode switched")
    ours.to(torch.bfloat16)  # casts in place: same objects, new addresses and dtype
    check(step="bf16")
    assert ours._recorded.c.plan_count  # the bf16 call recorded again


@cuda_only
@pytest.mark.parametrize("backward", ["fused", "pytorch"])
@pytest.mark.parametrize("train", [True, False])
def test_recorded_calls_with_autograd_match_float64(train, backward):
    # Three training steps on fresh inputs: the first checked and recorded, the others
    # replayed through the autograd Functions; outputs, gradients and running stats against
    # float64 each step.
    fjt.set_backward(backward)
    M, K, N = 200, 96, 80
    ours, ref64 = fresh_pair(K, N, torch.float32, train=train)
    tol = GRAD_TOL[torch.float32]
    records = set()
    for step in range(3):
        x = make_x(M, K, "randn").requires_grad_()
        x64 = x.detach().double().requires_grad_()
        dy = torch.randn(M, N, device=DEVICE)
        for m in (ours, ref64):
            m.zero_grad()
        y = ours(x)
        y64 = ref64(x64)
        assert rel_err(y, y64) < TOL[torch.float32], step
        y.backward(dy)
        y64.backward(dy.double())
        assert rel_err(x.grad, x64.grad) < tol, step
        got, want = _grads(ours), _grads(ref64)
        for name in ("weight", "scale", "gamma", "beta"):
            if name == "scale" and train and backward == "fused":
                assert dscale_error(got[name], ref64, x64, dy) < tol, step
            else:
                assert rel_err(got[name], want[name]) < tol, (name, step)
        assert_stats_match(ours, ref64, TOL[torch.float32])
        records.add(id(ours._recorded))
    if train or backward == "fused":
        assert len(records) == 1 and ours._recorded.c.plan_count  # recorded once, then replayed


@pytest.mark.parametrize("train", [True, False])
def test_prepared_calls_reuse_checks_not_results(train):
    # A call whose metadata was seen goes straight to its plan (fjt._prepared); new pointers,
    # a new batch size or a strided x must still give the reference's results.
    ours, ref64 = fresh_pair(96, 80, torch.float32, train=train)
    for step, (M, strided) in enumerate([(200, False), (200, False), (200, True), (64, False)]):
        if strided:
            x = make_x(M, 96 + 32, "randn")[:, :96]
        else:
            x = make_x(M, 96, "randn")
        y = ours(x)
        with torch.no_grad():
            assert rel_err(y, ref64(x.double())) < TOL[torch.float32], step
        assert_stats_match(ours, ref64, TOL[torch.float32])
    if DEVICE == "cuda":
        assert len(fjt._prepared) >= 1
