"""PyTorch face of fusejit: y = BatchNorm1d(scale * (x W^T + b)) as one fused op.

Public API
----------
LinearScaleBatchNorm1d(in_features, out_features, ...)
    Drop-in for the seeds' `Model` (nn.Linear -> * scale -> nn.BatchNorm1d): same state_dict
    keys, same train/eval semantics. `LinearScaleBatchNorm1d.from_module(model)` converts one.
linear_scale_batch_norm(x, weight, bias, scale, gamma, beta, running_mean, running_var,
                        num_batches_tracked, training, momentum, eps)
    The differentiable functional form (like F.batch_norm, but it also bumps
    num_batches_tracked when given in training, as nn.BatchNorm1d does before calling it).
torch.ops.fusejit.linear_scale_bn_train / linear_scale_bn_eval
    The custom ops (torch.compile and CUDA graphs see them as single opaque calls).
set_backward("pytorch" | "fused"), kernel_available(device), clear_plan_cache()

Where no kernel can run (CPU tensors, float64, no fusejit._C, a GPU older than sm_80) the same
math runs as PyTorch ops and a warning says why, once per reason.
"""
import collections
import copy
import functools
import threading
import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import fusejit as _fusejit

_C = _fusejit._C

__all__ = [
    "LinearScaleBatchNorm1d",
    "linear_scale_batch_norm",
    "set_backward",
    "get_backward",
    "kernel_available",
    "clear_plan_cache",
    "plan_cache_size",
]

# The device type the kernels run on; a module variable so a harness can point it elsewhere.
_KERNEL_DEVICE_TYPE = "cuda"
_STORAGE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

# ---------------------------------------------------------------------------------------------
# One-time warnings
# ---------------------------------------------------------------------------------------------
_warned = set()
_warned_lock = threading.Lock()


def _warn_once(key, message, category=RuntimeWarning):
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, category, stacklevel=3)


def _reset_warnings():
    """Forget which warnings were given (tests)."""
    with _warned_lock:
        _warned.clear()


# ---------------------------------------------------------------------------------------------
# Plans: one per argument tuple, LRU-bounded. A plan for a layer already seen costs microseconds;
# the first plan of a layer compiles (or loads from fusejit's disk cache) its kernels.
# ---------------------------------------------------------------------------------------------
_PLAN_CACHE_MAX = 256
_plan_cache = collections.OrderedDict()
_plan_lock = threading.Lock()


def _get_plan(key, kind=None):
    """The plan for `key` (the _C.Plan arguments; kind=_C.BackwardPlan: ("backward", its
    arguments...))."""
    with _plan_lock:
        plan = _plan_cache.get(key)
        if plan is not None:
            _plan_cache.move_to_end(key)
            return plan
    # Outside the lock: a first compile takes seconds.
    plan = _C.Plan(*key) if kind is None else kind(*key[1:])
    with _plan_lock:
        _plan_cache[key] = plan
        _plan_cache.move_to_end(key)
        while len(_plan_cache) > _PLAN_CACHE_MAX:
            _plan_cache.popitem(last=False)
    return plan


def clear_plan_cache():
    """Drop every cached plan (kernels stay loaded in fusejit's own bounded cache)."""
    with _plan_lock:
        _plan_cache.clear()
        _prepared.clear()
        if _C is not None:
            _C.forget_recorded_calls()  # modules' recorded calls (_RecordedCall) lapse


# Prepared calls: the checks and decisions of a call (argument checks, dtypes, strides,
# alignment, the plan) depend only on the arguments' metadata, so a call whose metadata was seen
# before, and that needed no copy or conversion, goes straight to the plan with the new
# pointers. A training loop pays the checks once per layer and batch shape.
_PREPARED_MAX = 1024
_prepared = {}


def _signature(mode, x, weight, vectors, nbt, eps, momentum):
    """Everything _impl and _run_kernel decide from, as a hashable tuple."""
    sig = [mode, float(eps), momentum, x.dtype == torch.float32 and _tf32_enabled(), x.shape,
           x.stride(), x.dtype, x.device, x.data_ptr() & 15, weight.shape, weight.stride(),
           weight.dtype, weight.device, weight.data_ptr() & 15]
    for t in vectors:
        sig.append(None if t is None else (t.shape, t.stride(), t.dtype, t.device))
    sig.append(None if nbt is None else (nbt.shape, nbt.stride(), nbt.dtype, nbt.device))
    return tuple(sig)


def _launch(plan, ws_bytes, stream, x, x_ptr, ptrs, N, train, save, stats):
    """Allocates y, the saved stats (train and `stats`), `saved` (what the fused backward reads,
    laid out like y) and the workspace (ws_bytes: plan.workspace_size), and runs `plan` on x
    (at x_ptr) and `ptrs` (the addresses of weight, bias, scale, gamma, beta, running_mean,
    running_var and num_batches_tracked, 0 for absent): the one launch of the checked path,
    prepared calls and a module's recorded call. new_empty: y like x, with less argument
    parsing than torch.empty."""
    size = (x.shape[0], N)
    y = x.new_empty(size)
    saved = x.new_empty(size) if save else None
    save_mean = save_invstd = None
    if train and stats:
        save_mean = x.new_empty((N,), dtype=torch.float32)
        save_invstd = x.new_empty((N,), dtype=torch.float32)
    ws, ws_ptr = _workspace(ws_bytes, x.device)
    w, bias, scale, gamma, beta, rm, rv, nbt = ptrs
    plan.run(
        stream, x_ptr, w, y.data_ptr(), bias, scale, gamma, beta, rm, rv, nbt, _ptr(save_mean),
        _ptr(save_invstd), ws_ptr, ws_bytes, _ptr(saved),
    )
    return y, save_mean, save_invstd, saved


def _launch_prepared(plan, train, x, weight, vectors, nbt, save=False, stats=True):
    """_launch on tensors: (y, save_mean, save_invstd, saved), the stats None unless train and
    `stats`, saved None unless `save`."""
    ptrs = (weight.data_ptr(),) + tuple(_ptr(t) for t in vectors) + (_ptr(nbt),)
    return _launch(plan, plan.workspace_size, _stream(x.device), x, x.data_ptr(), ptrs,
                   weight.shape[0], train, save, stats)


def plan_cache_size():
    with _plan_lock:
        return len(_plan_cache)


# ---------------------------------------------------------------------------------------------
# Where the kernels can run
# ---------------------------------------------------------------------------------------------
_device_support = {}


def _device_index(device):
    if device.index is not None:
        return device.index
    # torch.cuda.current_device() raises where PyTorch sees no GPU (no driver, a CPU build);
    # device 0 then lets fusejit's own check say why the kernels cannot run.
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def kernel_available(device=None):
    """(True, "") if fusejit's kernels can run on `device` (default: the current CUDA device),
    else (False, why)."""
    if _C is None:
        return False, f"fusejit._C could not be imported ({_fusejit._C_import_error})"
    if device is None:
        device = torch.device(_KERNEL_DEVICE_TYPE)
    device = torch.device(device)
    if device.type != _KERNEL_DEVICE_TYPE:
        return False, f"tensors on {device.type}; fusejit's kernels run on CUDA devices"
    index = _device_index(device)
    got = _device_support.get(index)
    if got is None:
        ok, why = _C.device_supported(index)
        got = _device_support[index] = (bool(ok), str(why))
    return got


def _static_fallback_reason(x):
    """Why the kernels cannot run, from facts fixed at trace time (device type, dtype, shape);
    None if they may. Whether the GPU itself qualifies is asked at run time, in the op."""
    if _C is None:
        return f"fusejit._C could not be imported ({_fusejit._C_import_error})"
    if x.device.type != _KERNEL_DEVICE_TYPE:
        return f"tensors on {x.device.type}; fusejit's kernels run on CUDA devices"
    if x.dtype not in _STORAGE:
        return f"dtype {x.dtype}; fusejit's kernels take float32, float16 and bfloat16"
    return None


def _tf32_enabled():
    # PyTorch >= 2.9 has fp32_precision ("tf32", "ieee" or "none" = inherit); reading the legacy
    # allow_tf32 raises there once the new API has been used, so ask the new one first.
    matmul = torch.backends.cuda.matmul
    try:
        precision = getattr(matmul, "fp32_precision", None)
    except RuntimeError:
        precision = None
    if precision == "tf32":
        return True
    if precision == "ieee":
        return False
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        return False


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the real and fake implementations
# ---------------------------------------------------------------------------------------------
_VECTOR_NAMES = ("bias", "scale", "gamma", "beta", "running_mean", "running_var")


def _check_args(x, weight, params, running):
    # params / running: (bias, scale, gamma, beta) and (running_mean, running_var), None where
    # absent. Plain tuples and one pass: this runs on every call of a training loop.
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D [M, K] tensor, got shape {tuple(x.shape)}")
    xs, device = x.shape, x.device
    ws = weight.shape
    if len(ws) != 2 or ws[1] != xs[1]:
        raise ValueError(f"weight: expected [N, {xs[1]}] (nn.Linear layout), got {tuple(ws)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight: dtype {weight.dtype} differs from x's {x.dtype}")
    if weight.device != device:
        raise ValueError(f"weight: on {weight.device}, x on {device}")
    N = ws[0]
    for name, t in zip(_VECTOR_NAMES, params + running):
        if t is None:
            continue
        if t.shape != (N,):
            raise ValueError(f"{name}: expected shape [{N}], got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point tensor, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, x on {device}")


def _check_nbt(nbt, x):
    if nbt is None:
        return
    if nbt.dtype != torch.int64 or nbt.numel() != 1:
        raise ValueError(
            f"num_batches_tracked: expected one int64, got {nbt.dtype} of shape {tuple(nbt.shape)}"
        )
    if nbt.device != x.device:
        raise ValueError(f"num_batches_tracked: on {nbt.device}, x on {x.device}")


def _check_train_rows(M):
    if M == 1:
        # nn.BatchNorm1d's own check and message.
        raise ValueError(
            "Expected more than 1 value per channel when training, got input size [1, N]"
        )


# ---------------------------------------------------------------------------------------------
# The kernel path
# ---------------------------------------------------------------------------------------------
def _natural_alignment(address, row_stride_bytes):
    for a in (16, 8, 4, 2):
        if address % a == 0 and row_stride_bytes % a == 0:
            return a
    return 1


def _rows(t, name):
    """(tensor, row stride in elements or 0 for packed) with unit column stride."""
    rows, cols = t.shape
    if (t.stride(1) == 1 or cols == 1) and (rows == 1 or t.stride(0) >= cols):
        ld = 0 if rows == 1 or t.stride(0) == cols else t.stride(0)
        if ld == 0:
            return t, 0
        if t.data_ptr() % 16 == 0 and (ld * t.element_size()) % 16 == 0:
            return t, ld
        _warn_once(
            ("strided-copy", name),
            f"fusejit: {name} has rows {ld} elements apart that are not 16-byte aligned; it is "
            "copied to packed rows on every call (pass a contiguous or 16-byte aligned tensor)",
            UserWarning,
        )
    else:
        _warn_once(
            ("copy", name),
            f"fusejit: {name} with strides {tuple(t.stride())} is not row-major; it is copied to "
            "packed rows on every call",
            UserWarning,
        )
    return t.clone(memory_format=torch.contiguous_format), 0


def _vector(t, dtype):
    """A [N] parameter as a unit-stride tensor of `dtype` (the same tensor where it already is)."""
    if t is None:
        return None
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.shape[0] > 1 and t.stride(0) != 1:
        t = t.contiguous()
    return t


def _ptr(t):
    return 0 if t is None else t.data_ptr()


# The raw handle of the current stream: torch.cuda.current_stream() builds a Python Stream
# object per call (~8 us); the C hook behind it returns the handle alone.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device):
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(_device_index(device))
    return torch.cuda.current_stream(device).cuda_stream


_WORKSPACE_ALIGN = 256


def _workspace(nbytes, device):
    """(tensor, address rounded up to _WORKSPACE_ALIGN) of a plan's workspace from torch's
    allocator, stream-ordered like the run; (None, 0) for none. CUDA's caching allocator hands
    out 512-byte aligned blocks; the slack covers others."""
    if not nbytes:
        return None, 0
    ws = torch.empty((nbytes + _WORKSPACE_ALIGN,), dtype=torch.uint8, device=device)
    return ws, -(-ws.data_ptr() // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN


def _kernel_dtype(x):
    """The kernels' dtype for x's storage: fp32 runs as tf32 where PyTorch allows tf32."""
    storage = _STORAGE[x.dtype]
    return "tf32" if storage == "fp32" and _tf32_enabled() else storage


def _param_dtype(x, params):
    """The dtype the kernels take the per-feature tensors in: the storage dtype when every one
    present has it, else fp32 (a mix runs them all in fp32)."""
    present = {t.dtype for t in params if t is not None}
    return x.dtype if present and present == {x.dtype} else torch.float32


def _run_kernel(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum, save,
                stats):
    M, K = x.shape
    N = weight.shape[0]
    dtype = _kernel_dtype(x)
    pdt = _param_dtype(x, (bias, scale, gamma, beta, rm, rv))
    if (gamma is None) != (beta is None):
        ref = gamma if gamma is not None else beta
        gamma = gamma if gamma is not None else torch.ones_like(ref)
        beta = beta if beta is not None else torch.zeros_like(ref)
    bias_, scale_, gamma_, beta_ = (_vector(t, pdt) for t in (bias, scale, gamma, beta))
    # Running stats are updated in place: where they cannot be handed over as they are, the
    # kernel updates a copy that is written back after it (stream-ordered).
    rm_, rv_ = _vector(rm, pdt), _vector(rv, pdt)
    nbt_ = None
    if nbt is not None:
        nbt_ = nbt if nbt.is_contiguous() else nbt.contiguous()

    x_, ldx = _rows(x, "x")
    w_, ldw = _rows(weight, "weight")
    eb = x.element_size()
    for _ in range(2):
        # The kernels assume every row pointer is as aligned as the widest width the row strides
        # allow (fusejit::Problem::effective_alignment); copy an operand that is not.
        align = min(
            _natural_alignment(0, (ldx or K) * eb),
            _natural_alignment(0, (ldw or K) * eb),
            _natural_alignment(0, N * eb),
        )
        if x_.data_ptr() % align == 0 and w_.data_ptr() % align == 0:
            break
        if x_.data_ptr() % align:
            x_, ldx = x_.clone(memory_format=torch.contiguous_format), 0
        if w_.data_ptr() % align:
            w_, ldw = w_.clone(memory_format=torch.contiguous_format), 0

    device = x.device
    key = (
        M, N, K, dtype, mode, _STORAGE[pdt] if pdt != torch.float32 else "fp32", float(eps),
        None if momentum is None else float(momentum), bias is not None, scale is not None,
        gamma is not None, ldx, ldw, 0, _device_index(device),
    )
    plan = _get_plan(key)
    out = _launch_prepared(
        plan, mode == "train", x_, w_, (bias_, scale_, gamma_, beta_, rm_, rv_), nbt_, save, stats
    )
    if mode == "train":
        for dst, src in ((rm, rm_), (rv, rv_), (nbt, nbt_)):
            if dst is not None and src is not dst:
                dst.copy_(src)
    # Every tensor went to the kernel as it was (no copy, conversion or stand-in): a call with
    # the same metadata may skip straight to this plan (_prepared).
    direct = (x_ is x and w_ is weight and bias_ is bias and scale_ is scale and gamma_ is gamma
              and beta_ is beta and rm_ is rm and rv_ is rv and nbt_ is nbt)
    return out, plan if direct else None


# ---------------------------------------------------------------------------------------------
# The same math as PyTorch ops: fallback inside the ops (CPU tensors, float64, unsupported GPU)
# ---------------------------------------------------------------------------------------------
def _reference_op(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum,
                  save=False):
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(x.device.type, enabled=False):
        a = F.linear(x.to(ct), weight.to(ct))
    z = a if bias is None else a + bias.to(ct)
    saved = None
    if save:
        # What the kernels save (fusejit::Tensors::saved): train a - mean(a), eval a + b.
        saved = (a - a.mean(0) if mode == "train" else z).to(x.dtype)
    if scale is not None:
        z = z * scale.to(ct)
    M = z.shape[0]
    if mode == "train":
        mean = z.mean(0)
        var = z.var(0, unbiased=False)
        if nbt is not None:
            nbt.add_(1)
        if rm is not None:
            if momentum is None:
                m = 1.0 / float(nbt.item()) if nbt is not None else 0.0
            else:
                m = float(momentum)
            rm.copy_((1 - m) * rm.to(ct) + m * mean)
            rv.copy_((1 - m) * rv.to(ct) + m * var * (M / max(M - 1, 1)))
    else:
        mean, var = rm.to(ct), rv.to(ct)
    invstd = torch.rsqrt(var + eps)
    y = (z - mean) * invstd
    if gamma is not None:
        y = y * gamma.to(ct)
    if beta is not None:
        y = y + beta.to(ct)
    return y.to(x.dtype), mean.float(), invstd.float(), saved


def _impl(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum, save=False,
          stats=True):
    """(y, save_mean, save_invstd, saved): the stats None in eval or unless `stats` (where the
    kernels run), saved None unless `save`."""
    vectors = (bias, scale, gamma, beta, rm, rv)
    sig = _signature(mode, x, weight, vectors, nbt, eps, momentum)
    plan = _prepared.get(sig)
    if plan is not None:
        return _launch_prepared(plan, mode == "train", x, weight, vectors, nbt, save, stats)
    out, direct = _impl_checked(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps,
                                momentum, save, stats)
    if direct is not None:
        with _plan_lock:
            if len(_prepared) >= _PREPARED_MAX:
                _prepared.clear()
            _prepared[sig] = direct
    return out


def _impl_checked(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum, save,
                  stats):
    """(result, the plan when every tensor went to it unchanged, else None)."""
    _check_args(x, weight, (bias, scale, gamma, beta), (rm, rv))
    _check_nbt(nbt, x)
    M, K = x.shape
    N = weight.shape[0]
    if mode == "train":
        _check_train_rows(M)
        if (rm is None) != (rv is None):
            raise ValueError("running_mean and running_var go together (both or neither)")
    elif rm is None or rv is None:
        raise ValueError("eval normalizes with running_mean and running_var; both are required")
    reason = _static_fallback_reason(x)
    if reason is None:
        ok, why = kernel_available(x.device)
        reason = None if ok else why
    if reason is None and (M == 0 or N == 0 or K == 0):
        reason = "empty"  # PyTorch's semantics for empty shapes, silently
    if reason is not None:
        if reason != "empty":
            _warn_once(("fallback", reason), f"fusejit: running PyTorch ops instead ({reason})")
        return (
            _reference_op(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum,
                          save),
            None,
        )
    if mode == "train" and momentum is None and nbt is None:
        momentum = 0.0  # nn.BatchNorm1d's factor when it counts no batches
    return _run_kernel(mode, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum,
                       save, stats)


# ---------------------------------------------------------------------------------------------
# Custom ops
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op(
    "fusejit::linear_scale_bn_train",
    mutates_args=("running_mean", "running_var", "num_batches_tracked"),
)
def linear_scale_bn_train(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    gamma: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    eps: float,
    momentum: Optional[float],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch statistics: returns (y, save_mean, save_invstd) with the stats fp32 [N]; updates
    running_mean/var (when given) and bumps num_batches_tracked (when given) in place.
    momentum=None: cumulative average, which reads num_batches_tracked.
    Not differentiable itself (PyTorch registers no autograd formula for an op that mutates
    its inputs): use linear_scale_batch_norm() or LinearScaleBatchNorm1d for gradients."""
    return _impl(
        "train", x, weight, bias, scale, gamma, beta, running_mean, running_var,
        num_batches_tracked, eps, momentum,
    )[:3]


@linear_scale_bn_train.register_fake
def _(x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, eps,
      momentum):
    _check_args(x, weight, (bias, scale, gamma, beta), (running_mean, running_var))
    N = weight.shape[0]
    y = x.new_empty((x.shape[0], N))
    return (
        y,
        x.new_empty((N,), dtype=torch.float32),
        x.new_empty((N,), dtype=torch.float32),
    )


@torch.library.custom_op("fusejit::linear_scale_bn_eval", mutates_args=())
def linear_scale_bn_eval(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    gamma: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Running statistics: y = gamma * (z - running_mean) / sqrt(running_var + eps) + beta."""
    return _impl(
        "eval", x, weight, bias, scale, gamma, beta, running_mean, running_var, None, eps, None,
    )[0]


@linear_scale_bn_eval.register_fake
def _(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps):
    _check_args(x, weight, (bias, scale, gamma, beta), (running_mean, running_var))
    return x.new_empty((x.shape[0], weight.shape[0]))


# The forward as the fused backward needs it: y and `saved` (train: x W^T less its batch column
# mean; eval: x W^T + b; laid out like y), which the backward reads instead of recomputing the
# GEMM. Separate ops rather than a flag on the two above, whose schemas users may hold.
@torch.library.custom_op(
    "fusejit::linear_scale_bn_train_saving",
    mutates_args=("running_mean", "running_var", "num_batches_tracked"),
)
def linear_scale_bn_train_saving(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    gamma: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    eps: float,
    momentum: Optional[float],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """linear_scale_bn_train, also returning `saved` [M, N] for the fused backward."""
    return _impl(
        "train", x, weight, bias, scale, gamma, beta, running_mean, running_var,
        num_batches_tracked, eps, momentum, True,
    )


@linear_scale_bn_train_saving.register_fake
def _(x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked, eps,
      momentum):
    _check_args(x, weight, (bias, scale, gamma, beta), (running_mean, running_var))
    M, N = x.shape[0], weight.shape[0]
    return (
        x.new_empty((M, N)),
        x.new_empty((N,), dtype=torch.float32),
        x.new_empty((N,), dtype=torch.float32),
        x.new_empty((M, N)),
    )


@torch.library.custom_op("fusejit::linear_scale_bn_eval_saving", mutates_args=())
def linear_scale_bn_eval_saving(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    gamma: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """linear_scale_bn_eval, also returning `saved` [M, N] for the fused backward."""
    y, _, _, saved = _impl(
        "eval", x, weight, bias, scale, gamma, beta, running_mean, running_var, None, eps, None,
        True,
    )
    return y, saved


@linear_scale_bn_eval_saving.register_fake
def _(x, weight, bias, scale, gamma, beta, running_mean, running_var, eps):
    _check_args(x, weight, (bias, scale, gamma, beta), (running_mean, running_var))
    M, N = x.shape[0], weight.shape[0]
    return x.new_empty((M, N)), x.new_empty((M, N))


# ---------------------------------------------------------------------------------------------
# Backward (PyTorch ops, fp32 statistics; gradients in the inputs' dtypes)
# ---------------------------------------------------------------------------------------------
_BACKWARDS = ("pytorch", "fused")
_backward = "fused"
_HAS_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")


def set_backward(kind):
    """"fused" (the default): the forward also saves x W^T (centred by its batch mean in train)
    and fusejit's backward kernels compute every gradient from it (BackwardPlan); where no
    kernel can run, the same math as PyTorch ops. "pytorch": PyTorch ops recomputing x W^T + b
    from x (no saved tensor; the forward is a little cheaper, the backward much dearer).
    Read when a forward runs: its backward follows the choice made then."""
    global _backward
    if kind not in _BACKWARDS:
        raise ValueError(f"backward: expected one of {_BACKWARDS}, got {kind!r}")
    _backward = kind


def get_backward():
    return _backward


def _linear_fp32(x, weight, bias):
    # The GEMM again, with an fp32 result: z-hat is (z - mean) * invstd, so an error in z of a
    # column whose mean is large against its spread (uniform inputs) would be amplified if z
    # were rounded to bf16 first.
    if x.dtype == torch.float32:
        u = x @ weight.t()
    elif _HAS_MM_OUT_DTYPE and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
        u = torch.mm(x, weight.t(), out_dtype=torch.float32)
    else:
        u = x.float() @ weight.float().t()
    if bias is not None:
        u = u + bias.float()
    return u



def _backward_math(dy, x, weight, bias, scale, gamma, beta_dtype, mean, invstd, batch_stats,
                   needs):
    """Gradients (x, weight, bias, scale, gamma, beta) of
    y = gamma * (s * (x W^T + b) - mean) * invstd + beta.
    batch_stats: mean and invstd are the batch's own (train), so they depend on z as well.
    z-hat comes from recomputing x W^T + b, never from y: a gamma = 0 column keeps its dgamma."""
    nx, nw, nb, ns, ng, nbeta = needs
    with torch.autocast(dy.device.type, enabled=False):
        dyf = dy.float()
        u = _linear_fp32(x, weight, bias)
        z = u * scale.float() if scale is not None else u
        zhat = (z - mean) * invstd
        dbeta = dyf.sum(0)
        dgamma = (dyf * zhat).sum(0)
        g_invstd = invstd * gamma.float() if gamma is not None else invstd
        if batch_stats:
            M = x.shape[0]
            dz = g_invstd * (dyf - dbeta / M - zhat * (dgamma / M))
        else:
            dz = dyf * g_invstd
        dscale = (dz * u).sum(0) if (scale is not None and ns) else None
        du = dz * scale.float() if scale is not None else dz
        # Train: y does not depend on the bias (the batch mean absorbs it), so its gradient is 0
        # exactly, as the fused backward writes it; the sum of du would be its rounding noise.
        dbias = (torch.zeros_like(dbeta) if batch_stats else du.sum(0)) if (
            bias is not None and nb) else None
        # The GEMMs of the backward in the storage dtype, as nn.Linear's own backward does.
        gemm_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.float32
        dug = du.to(gemm_dtype)
        dx = (dug @ weight.to(gemm_dtype)).to(x.dtype) if nx else None
        dw = (dug.t() @ x.to(gemm_dtype)).to(weight.dtype) if nw else None
    return (
        dx,
        dw,
        dbias.to(bias.dtype) if dbias is not None else None,
        dscale.to(scale.dtype) if dscale is not None else None,
        dgamma.to(gamma.dtype) if (gamma is not None and ng) else None,
        dbeta.to(beta_dtype) if (beta_dtype is not None and nbeta) else None,
    )


# ---------------------------------------------------------------------------------------------
# The fused backward (fusejit::BackwardPlan)
# ---------------------------------------------------------------------------------------------
def _get_backward_plan(key):
    # Same cache as the forward's plans, told apart by the first element.
    return _get_plan(key, _C.BackwardPlan)


def _packed(t, align):
    """t as packed rows whose base is `align`-byte aligned (the same tensor where it is)."""
    if not t.is_contiguous() or t.data_ptr() % align:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _backward_outputs(x, grads):
    """The backward op's six outputs: parameter gradients in fp32, a fresh empty tensor for each
    one not computed (a custom op's outputs may not alias each other)."""
    return tuple(
        x.new_empty((0,)) if t is None else (t if i < 2 else t.float())
        for i, t in enumerate(grads)
    )


def _fused_backward_impl(dy, x, weight, saved, bias, scale, gamma, stat_a, stat_b, training,
                         has_beta, eps, needs):
    """Gradients (dx, dW, dbias, dscale, dgamma, dbeta) from the kernels, None for each one not
    in `needs` (or whose parameter is absent); the parameter gradients in the dtype the kernels
    took the parameters in. stat_a, stat_b: train save_mean, save_invstd; eval running_mean,
    running_var."""
    M, K = x.shape
    N = weight.shape[0]
    nx, nw, nb, ns, ng, nbeta = needs
    reason = _static_fallback_reason(x)
    if reason is None:
        ok, why = kernel_available(x.device)
        reason = None if ok else why
    if reason is not None or M == 0 or N == 0 or K == 0:
        # The forward fell back as well (it warned): the same gradients as PyTorch ops.
        if training:
            mean, invstd = stat_a, stat_b
        else:
            mean, invstd = stat_a.float(), torch.rsqrt(stat_b.float() + eps)
        return _backward_math(dy, x, weight, bias, scale, gamma,
                              torch.float32 if has_beta else None, mean, invstd, training, needs)

    dtype = _kernel_dtype(x)
    pdt = _param_dtype(x, (bias, scale, gamma) + (() if training else (stat_a, stat_b)))
    has_affine = gamma is not None or has_beta
    if has_affine and gamma is None:
        gamma = torch.ones((N,), dtype=pdt, device=x.device)
    scale_, gamma_ = _vector(scale, pdt), _vector(gamma, pdt)
    rm_ = rv_ = mean_ = invstd_ = None
    if training:
        mean_, invstd_ = stat_a, stat_b
    else:
        rm_, rv_ = _vector(stat_a, pdt), _vector(stat_b, pdt)
    # Packed rows everywhere (dx and dW are laid out like x and W); bases as aligned as the
    # rows' widths allow, which is what the plan assumes.
    eb = x.element_size()
    align = min(_natural_alignment(0, K * eb), _natural_alignment(0, N * eb))
    x_, w_ = _packed(x, align), _packed(weight, align)
    dy_, saved_ = _packed(dy.to(x.dtype), align), _packed(saved, align)
    key = (
        "backward", M, N, K, dtype, "train" if training else "eval",
        _STORAGE[pdt] if pdt != torch.float32 else "fp32", float(eps), None, bias is not None,
        scale is not None, has_affine, 0, 0, 0, _device_index(x.device),
    )
    plan = _get_backward_plan(key)
    device = x.device
    dx = torch.empty((M, K), dtype=x.dtype, device=device) if nx else None
    dw = torch.empty((N, K), dtype=x.dtype, device=device) if nw else None

    def grad(want):
        return torch.empty((N,), dtype=pdt, device=device) if want else None

    dbias = grad(nb and bias is not None)
    dscale = grad(ns and scale is not None)
    dgamma = grad(ng and gamma is not None)
    dbeta = grad(nbeta and has_beta)
    ws_bytes = plan.workspace_size
    ws, ws_ptr = _workspace(ws_bytes, device)
    plan.run(
        _stream(device), dy_.data_ptr(), x_.data_ptr(), w_.data_ptr(), saved_.data_ptr(),
        _ptr(scale_), _ptr(gamma_), _ptr(rm_), _ptr(rv_), _ptr(mean_), _ptr(invstd_), _ptr(dx),
        _ptr(dw), _ptr(dbias), _ptr(dscale), _ptr(dgamma), _ptr(dbeta), ws_ptr, ws_bytes,
    )
    return dx, dw, dbias, dscale, dgamma, dbeta


@torch.library.custom_op("fusejit::linear_scale_bn_backward", mutates_args=())
def linear_scale_bn_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    saved: torch.Tensor,
    bias: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    gamma: Optional[torch.Tensor],
    stat_a: torch.Tensor,
    stat_b: torch.Tensor,
    training: bool,
    has_beta: bool,
    eps: float,
    needs: List[bool],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused backward: (dx, dW, dbias, dscale, dgamma, dbeta) of the layer whose forward
    (linear_scale_bn_*_saving) returned `saved`; stat_a/stat_b are save_mean/save_invstd
    (training) or running_mean/running_var (eval). Parameter gradients in fp32, and an empty
    tensor for each gradient `needs` (six flags, that order) leaves out."""
    return _backward_outputs(x, _fused_backward_impl(
        dy, x, weight, saved, bias, scale, gamma, stat_a, stat_b, training, has_beta, eps,
        tuple(needs)))


@linear_scale_bn_backward.register_fake
def _(dy, x, weight, saved, bias, scale, gamma, stat_a, stat_b, training, has_beta, eps, needs):
    nx, nw, nb, ns, ng, nbeta = needs
    N = weight.shape[0]
    has = (True, True, bias is not None, scale is not None, gamma is not None, has_beta)
    shapes = (tuple(x.shape), tuple(weight.shape), (N,), (N,), (N,), (N,))
    out = []
    for i, (want, present, shape) in enumerate(zip(needs, has, shapes)):
        if not (want and present):
            out.append(x.new_empty((0,)))
        else:
            out.append(x.new_empty(shape, dtype=x.dtype if i < 2 else torch.float32))
    return tuple(out)


def _fused_backward(ctx, dy, stat_a, stat_b, training):
    """The autograd formula of both saving forwards: the backward op (called directly outside
    torch.compile: the dispatcher's custom-op checks cost more host time than the kernels of a
    small layer), its parameter gradients cast back to the parameters' dtypes."""
    x, weight, bias, scale, gamma, saved = ctx.saved_tensors[:6]
    needs = tuple(bool(v) for v in ctx.needs_input_grad[:6])
    has_beta = ctx.beta_dtype is not None
    if _eager_call((dy, x, weight, saved, bias, scale, gamma, stat_a, stat_b)):
        g = _fused_backward_impl(dy, x, weight, saved, bias, scale, gamma, stat_a, stat_b,
                                 training, has_beta, float(ctx.eps), needs)
    else:
        g = torch.ops.fusejit.linear_scale_bn_backward(
            dy, x, weight, saved, bias, scale, gamma, stat_a, stat_b, training, has_beta,
            float(ctx.eps), list(needs),
        )
    dtypes = (x.dtype, weight.dtype, *(None if t is None else t.dtype for t in (bias, scale, gamma)),
              ctx.beta_dtype)
    out = []
    for want, t, dt in zip(needs, g, dtypes):
        if not want or dt is None or t is None:
            out.append(None)
        else:
            out.append(t if t.dtype == dt else t.to(dt))
    return tuple(out)


def _eval_setup_context(ctx, inputs, output):
    x, weight, bias, scale, gamma, beta, running_mean, running_var, eps = inputs
    ctx.save_for_backward(x, weight, bias, scale, gamma, running_mean, running_var)
    ctx.eps = eps
    ctx.beta_dtype = None if beta is None else beta.dtype


def _eval_backward(ctx, dy):
    x, weight, bias, scale, gamma, rm, rv = ctx.saved_tensors
    needs = tuple(ctx.needs_input_grad[:6])
    mean = rm.float()
    invstd = torch.rsqrt(rv.float() + ctx.eps)
    grads = _backward_math(
        dy, x, weight, bias, scale, gamma, ctx.beta_dtype, mean, invstd, False, needs
    )
    return grads + (None, None, None)


torch.library.register_autograd(
    "fusejit::linear_scale_bn_eval", _eval_backward, setup_context=_eval_setup_context
)


def _eager_call(tensors):
    # Outside torch.compile and with real tensors, the op's implementation is called directly:
    # the dispatcher round trip costs more than the launch for small layers.
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if t is not None and type(t) not in (torch.Tensor, nn.Parameter):
            return False
    return True


class _TrainFunction(torch.autograd.Function):
    # The train op mutates the running stats, and PyTorch registers autograd formulas only for
    # functional ops, so its gradient lives in this Function (torch.compile traces both).
    # fused: the forward saves what the fused backward reads (the *_saving op) and the backward
    # is fusejit's; else the backward is PyTorch ops recomputing x W^T.
    @staticmethod
    def forward(ctx, x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum, fused,
                replay=None):
        # replay: from a module's recorded call (_RecordedCall.replay), which has checked
        # everything: _launch's arguments up to `save`.
        args = (x, weight, bias, scale, gamma, beta, rm, rv, nbt, eps, momentum)
        if replay is not None:
            y, save_mean, save_invstd, saved = _launch(*replay, fused, True)
        elif _eager_call((x, weight, bias, scale, gamma, beta, rm, rv, nbt)):
            y, save_mean, save_invstd, saved = _impl("train", *args, fused)
        elif fused:
            y, save_mean, save_invstd, saved = torch.ops.fusejit.linear_scale_bn_train_saving(*args)
        else:
            y, save_mean, save_invstd = torch.ops.fusejit.linear_scale_bn_train(*args)
        if fused:
            ctx.save_for_backward(x, weight, bias, scale, gamma, saved, save_mean, save_invstd)
        else:
            ctx.save_for_backward(x, weight, bias, scale, gamma, save_mean, save_invstd)
        ctx.fused = fused
        ctx.eps = eps
        ctx.beta_dtype = None if beta is None else beta.dtype
        ctx.mark_non_differentiable(save_mean, save_invstd)
        # The statistics take no gradient: without this autograd allocates and zero-fills one
        # [N] tensor for each every step (two aten::fill_ launches per step in a torch.profiler
        # trace of 128x512x1024 on H100).
        ctx.set_materialize_grads(False)
        return y, save_mean, save_invstd

    @staticmethod
    def backward(ctx, dy, _dmean, _dinvstd):
        if dy is None:  # y took no gradient (unmaterialized): nothing flows back
            return (None,) * 13
        if ctx.fused:
            mean, invstd = ctx.saved_tensors[6:8]
            return _fused_backward(ctx, dy, mean, invstd, True) + (None,) * 7
        x, weight, bias, scale, gamma, mean, invstd = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[:6])
        grads = _backward_math(
            dy, x, weight, bias, scale, gamma, ctx.beta_dtype, mean, invstd, True, needs
        )
        return grads + (None,) * 7


class _EvalFunction(torch.autograd.Function):
    # Eval with the fused backward: the forward saves x W^T + b for it. (The eval op's own
    # autograd formula, registered above, is the PyTorch-ops backward.)
    @staticmethod
    def forward(ctx, x, weight, bias, scale, gamma, beta, rm, rv, eps, replay=None):
        if replay is not None:  # see _TrainFunction
            y, _, _, saved = _launch(*replay, True, False)
        elif _eager_call((x, weight, bias, scale, gamma, beta, rm, rv)):
            y, _, _, saved = _impl(
                "eval", x, weight, bias, scale, gamma, beta, rm, rv, None, eps, None, True
            )
        else:
            y, saved = torch.ops.fusejit.linear_scale_bn_eval_saving(
                x, weight, bias, scale, gamma, beta, rm, rv, eps
            )
        ctx.save_for_backward(x, weight, bias, scale, gamma, saved, rm, rv)
        ctx.eps = eps
        ctx.beta_dtype = None if beta is None else beta.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        rm, rv = ctx.saved_tensors[6:8]
        return _fused_backward(ctx, dy, rm, rv, False) + (None,) * 4


def _needs_grad(tensors):
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def _reference_functional(x, weight, bias, scale, gamma, beta, rm, rv, nbt, training, momentum,
                          eps):
    # The seeds' Model math (nn.Linear, * scale, F.batch_norm as nn.BatchNorm1d calls it).
    z = F.linear(x, weight, bias)
    if scale is not None:
        z = z * scale
    factor = 0.0 if momentum is None else momentum
    if training and nbt is not None:
        nbt.add_(1)
        factor = 1.0 / float(nbt) if momentum is None else momentum
    return F.batch_norm(z, rm, rv, gamma, beta, training, factor, eps)


def linear_scale_batch_norm(
    x,
    weight,
    bias=None,
    scale=None,
    gamma=None,
    beta=None,
    running_mean=None,
    running_var=None,
    num_batches_tracked=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
):
    """y = batch_norm(scale * (x @ weight.T + bias)), differentiable, fused where it can be.

    training=True normalizes with the batch's statistics and updates running_mean/var (when
    given) with `momentum` (None: cumulative average over num_batches_tracked, which is then
    required); num_batches_tracked, when given, is bumped by one. training=False normalizes with
    running_mean/var (required). x [M, K], weight [N, K], the rest [N] or None."""
    tensors = (x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked)
    reason = _static_fallback_reason(x)
    if reason is not None:
        if not torch.compiler.is_compiling():
            _warn_once(("fallback", reason), f"fusejit: running PyTorch ops instead ({reason})")
        return _reference_functional(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked,
            training, momentum, eps,
        )
    if training:
        if momentum is None and num_batches_tracked is None:
            momentum = 0.0  # nn.BatchNorm1d's factor when it counts no batches
        if _needs_grad(tensors) or torch.compiler.is_compiling():
            return _TrainFunction.apply(
                x, weight, bias, scale, gamma, beta, running_mean, running_var,
                num_batches_tracked, eps, momentum, _backward == "fused" and _needs_grad(tensors),
            )[0]
        if _eager_call(tensors):
            # Nothing reads the batch statistics: the kernels skip writing them.
            return _impl(
                "train", x, weight, bias, scale, gamma, beta, running_mean, running_var,
                num_batches_tracked, eps, momentum, stats=False,
            )[0]
        return torch.ops.fusejit.linear_scale_bn_train(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked,
            eps, momentum,
        )[0]
    if running_mean is None or running_var is None:
        raise ValueError("training=False normalizes with running_mean and running_var")
    if _backward == "fused" and _needs_grad(tensors):
        return _EvalFunction.apply(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, eps
        )
    if not _needs_grad(tensors) and _eager_call(tensors):
        return _impl(
            "eval", x, weight, bias, scale, gamma, beta, running_mean, running_var, None, eps,
            None,
        )[0]
    return torch.ops.fusejit.linear_scale_bn_eval(
        x, weight, bias, scale, gamma, beta, running_mean, running_var, eps
    )


# ---------------------------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------------------------
# Whether autocast is on for any device (one C call; an unknown PyTorch: ask the public API).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


class _RecordedCall:
    """A module's forward as its checked call decided it, replayed while nothing the decision
    read has changed: the checks run in the extension (`_C.RecordedCall`, which lists what it
    re-reads), where they cost a fraction of the same checks in Python. Without autograd the
    extension also allocates y and launches; where x or a used tensor requires grad it hands
    back the launch and with_autograd() runs it inside linear_scale_batch_norm's autograd
    Functions. Autocast, torch.compile and every record made before clear_plan_cache() take the
    checked path."""

    __slots__ = ("c", "args", "launch_ptrs", "N", "train", "eps", "momentum")

    @classmethod
    def make(cls, module, train, args, eps, momentum):
        """A record of `module`'s call, or None where the extension cannot read the layer
        (then every call takes the checked path). args: the eight tensors as the call gave them
        to the kernels (None for each the BatchNorm's decisions left out, e.g.
        num_batches_tracked in eval); eps, momentum: as it gave them."""
        w = args[0]
        if w.device.type == "cuda" and _raw_stream is not None:
            stream = functools.partial(_raw_stream, _device_index(w.device))
        else:
            device = w.device
            stream = functools.partial(_stream, device)
        autocast = _any_autocast or functools.partial(torch.is_autocast_enabled, w.device.type)
        c = _C.RecordedCall.make(
            module, args, stream=stream,
            tf32=_tf32_enabled if w.dtype == torch.float32 else None, autocast=autocast,
            grad_enabled=torch.is_grad_enabled, tensor_type=torch.Tensor,
            byte_dtype=torch.uint8, workspace_align=_WORKSPACE_ALIGN,
        )
        return None if c is None else cls(c, train, args, eps, momentum)

    def __init__(self, c, train, args, eps, momentum):
        self.c = c
        self.args = args
        self.launch_ptrs = tuple(_ptr(t) for t in args)
        self.N = args[0].shape[0]
        self.train = train
        self.eps, self.momentum = eps, momentum

    def matches(self, module):
        return self.c.matches(module)

    def add(self, x, plan):
        self.c.add(x, plan, plan.workspace_size)

    def with_autograd(self, x, plan, ws_bytes, stream, x_ptr):
        """y through linear_scale_batch_norm's autograd routes, the checks done (the launch
        from the extension's replay); None where the checked path must decide."""
        launch = (plan, ws_bytes, stream, x, x_ptr, self.launch_ptrs, self.N, self.train)
        fused = _backward == "fused"
        if self.train:
            return _TrainFunction.apply(x, *self.args, self.eps, self.momentum, fused,
                                        launch)[0]
        if not fused:
            return None  # the eval op's own autograd formula: the checked path
        return _EvalFunction.apply(x, *self.args[:7], self.eps, launch)


class LinearScaleBatchNorm1d(nn.Module):
    """y = BatchNorm1d(scale * Linear(x)) in one fused kernel: the seeds' `Model`, same
    parameters, buffers and state_dict keys (gemm.weight, gemm.bias, scale, bn.weight, bn.bias,
    bn.running_mean, bn.running_var, bn.num_batches_tracked) and the same train/eval semantics
    as nn.BatchNorm1d. x: [M, in_features]."""

    def __init__(
        self,
        in_features,
        out_features,
        eps=1e-5,
        momentum=0.1,
        bias=True,
        affine=True,
        track_running_stats=True,
        device=None,
        dtype=None,
        scale_shape=None,
    ):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        # Created in the seeds' order, so one seed gives both modules the same initial values.
        self.gemm = nn.Linear(in_features, out_features, bias=bias, **factory)
        self.scale = nn.Parameter(torch.randn(scale_shape or (out_features,), **factory))
        self.bn = nn.BatchNorm1d(
            out_features, eps=eps, momentum=momentum, affine=affine,
            track_running_stats=track_running_stats, **factory,
        )
        self._recorded = None  # _RecordedCall: the no-grad forward's checks, done once

    def __getstate__(self):
        # Copies and pickles re-check their first call (the record holds plans, which do not
        # pickle, and the original's tensors).
        state = self.__dict__.copy()
        state["_recorded"] = None
        return state

    @property
    def in_features(self):
        return self.gemm.in_features

    @property
    def out_features(self):
        return self.gemm.out_features

    @classmethod
    def from_module(cls, model, share=False):
        """A LinearScaleBatchNorm1d computing what `model` (anything with .gemm: nn.Linear,
        .scale and .bn: nn.BatchNorm1d, like the seeds' Model) computes, on the same devices
        with the same dtypes. share=False copies the parameters and buffers; share=True uses
        `model`'s own (training either one then trains both)."""
        gemm, bn = model.gemm, model.bn
        m = cls(
            gemm.in_features, gemm.out_features, eps=bn.eps, momentum=bn.momentum,
            bias=gemm.bias is not None, affine=bn.affine,
            track_running_stats=bn.track_running_stats, device="meta",
            scale_shape=tuple(model.scale.shape),
        )
        if share:
            m.gemm, m.bn, m.scale = gemm, bn, model.scale
        else:
            m.gemm = copy.deepcopy(gemm)
            m.bn = copy.deepcopy(bn)
            m.scale = nn.Parameter(
                model.scale.detach().clone(), requires_grad=model.scale.requires_grad
            )
        m.train(model.training)
        return m

    def _scale_vector(self):
        s, N = self.scale, self.out_features
        if s.dim() == 1 and s.shape[0] == N:
            return s
        if s.numel() == N and s.shape[-1] == N:
            return s.reshape(N)
        if s.numel() == 1:
            return s.reshape(1).expand(N)
        return None

    def forward(self, x):
        recorded = self.__dict__.get("_recorded")  # absent in modules pickled before it
        if recorded is not None and not torch.compiler.is_compiling():
            y = recorded.c.replay(self, x)
            if type(y) is tuple:
                y = recorded.with_autograd(x, *y)
            if y is not None:
                return y
        if x.dim() != 2:
            raise ValueError(
                f"LinearScaleBatchNorm1d expects a 2-D [M, in_features] input (BatchNorm1d over "
                f"features), got shape {tuple(x.shape)}"
            )
        bn, gemm = self.bn, self.gemm
        scale = self._scale_vector()
        reason = _static_fallback_reason(x)
        if reason is None and scale is None:
            reason = f"scale of shape {tuple(self.scale.shape)} is not one value per feature"
        if reason is not None:
            if not torch.compiler.is_compiling():
                _warn_once(("fallback", reason), f"fusejit: running PyTorch ops instead ({reason})")
            return bn(gemm(x) * self.scale)

        weight = gemm.weight
        if torch.is_autocast_enabled(x.device.type):
            # Autocast runs nn.Linear in the low-precision dtype; so does the fused op, with the
            # per-feature parameters and running stats left as they are (fp32).
            low = torch.get_autocast_dtype(x.device.type)
            if low in (torch.float16, torch.bfloat16):
                x = x.to(low)
                weight = weight.to(low)
        if weight.dtype != x.dtype:
            raise ValueError(
                f"x: dtype {x.dtype} differs from the layer's {weight.dtype} (cast the input, "
                "the module, or use torch.autocast)"
            )

        # nn.BatchNorm1d.forward, decision for decision.
        momentum = bn.momentum
        nbt = None
        if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
            nbt = bn.num_batches_tracked
        elif momentum is None:
            momentum = 0.0
        batch_stats = bn.training or (bn.running_mean is None and bn.running_var is None)
        use_running = not bn.training or bn.track_running_stats
        rm = bn.running_mean if use_running else None
        rv = bn.running_var if use_running else None
        if batch_stats and x.shape[0] == 1:
            _check_train_rows(1)
        y = linear_scale_batch_norm(
            x, weight, gemm.bias, scale, bn.weight, bn.bias, rm, rv, nbt, batch_stats, momentum,
            bn.eps,
        )
        if weight is gemm.weight and scale is self.scale:
            self._record(x, batch_stats, momentum, nbt, rm, rv)
        return y

    def _record(self, x, train, momentum, nbt, rm, rv):
        """After a checked call: remember its plan where the call went to the kernels with
        every tensor as it is (the same condition as a prepared call, _impl)."""
        if torch.compiler.is_compiling():
            return
        if not train and _backward != "fused" and torch.is_grad_enabled():
            return  # the eval op's autograd formula: replay() leaves it to the checked path
        gemm, bn = self.gemm, self.bn
        vectors = (gemm.bias, self.scale, bn.weight, bn.bias, rm, rv)
        if not _eager_call((x, gemm.weight) + vectors + (nbt,)):
            return
        mode = "train" if train else "eval"
        plan = _prepared.get(_signature(mode, x, gemm.weight, vectors, nbt, bn.eps,
                                        momentum if train else None))
        if plan is None:
            return
        recorded = self.__dict__.get("_recorded")
        if recorded is None or recorded.train != train or not recorded.matches(self):
            momentum = momentum if train else None
            recorded = _RecordedCall.make(self, train, (gemm.weight,) + vectors + (nbt,), bn.eps,
                                          momentum)
            self._recorded = recorded
            if recorded is None:
                return
        recorded.add(x, plan)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"
