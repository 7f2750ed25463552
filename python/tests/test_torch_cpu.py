"""fusejit.torch without a GPU, against nn.BatchNorm1d and the seeds' Model in float64.

What runs here: the package as `pip install .` leaves it; the custom ops' registration, fake
(meta) implementations and torch.library.opcheck; state_dict compatibility with the seeds'
Model; the CPU fallback's train/eval semantics and gradients; how errors surface in Python.
Every tensor is on the CPU, so the file runs (and must pass) on a GPU machine too.
scripts/python_cpu_tests.sh builds the environment (ctest cpu_python_package).

The fallback is reached two ways. "plain": CPU tensors, where the module and the functional
form run PyTorch's own ops. "op path" (fixture `op_path`): the kernel device type pointed at
the CPU, with kernels reported unavailable, so CPU tensors take every step a CUDA tensor takes
(the module's nn.BatchNorm1d decisions, the autograd Function, the custom ops, their fake
implementations under torch.compile) until the launch, where fusejit.torch's own PyTorch-op
restatement (_reference_op) and its backward (_backward_math) stand in for the kernels.
"""
import copy
import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.nn as nn  # noqa: E402

import fusejit  # noqa: E402
import fusejit.torch as fjt  # noqa: E402
import layer_reference  # noqa: E402
from layer_reference import RefModel, assert_stats_match, make_ref, rel_err  # noqa: E402,F401
from layer_reference import grads as _grads  # noqa: E402

# Relative error (max |a - b| / max |b|) against float64. The CPU fallback computes in fp32
# (PyTorch's GEMM and reductions); bf16 storage rounds inputs and outputs.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
GRAD_TOL = {k: 2 * v for k, v in TOL.items()}
NO_KERNELS = "fusejit CPU tests: no kernels on the CPU"
# The fallback's one-time warning is expected here; the tests that count it record it.
pytestmark = pytest.mark.filterwarnings("ignore:fusejit. running PyTorch ops instead")

needs_C = pytest.mark.skipif(
    fusejit._C is None, reason=f"fusejit._C does not load: {fusejit._C_import_error}"
)


def _seeds_model_class():
    """The seeds' own Model class, from FUSEJIT_SPEC_DIR or the shared/ folder beside the
    repository; None where neither is there."""
    dirs = [os.environ.get("FUSEJIT_SPEC_DIR"),
            pathlib.Path(__file__).resolve().parents[3] / "shared" / "spec"]
    for d in dirs:
        if d and (pathlib.Path(d) / "reference_model.py").is_file():
            spec = importlib.util.spec_from_file_location(
                "fusejit_seeds_reference_model", pathlib.Path(d) / "reference_model.py"
            )
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module.Model
    return None


@pytest.fixture(autouse=True)
def _fresh_state():
    backward = fjt.get_backward()
    fjt._reset_warnings()
    yield
    fjt.set_backward(backward)


@pytest.fixture
def op_path(monkeypatch):
    """CPU tensors take the CUDA tensors' path up to the launch (see the module docstring).
    kernel_available is pinned to False so that no launch is tried with CPU pointers, also on
    a machine with a GPU."""
    monkeypatch.setattr(fjt, "_KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(fjt, "kernel_available", lambda device=None: (False, NO_KERNELS))
    fjt.clear_plan_cache()
    yield
    fjt.clear_plan_cache()


@pytest.fixture(params=["pytorch", "fused"])
def backward(request, op_path):
    """Each backward set_backward offers, on the op path (where the fused one's CPU fallback is
    the PyTorch-op math again, reached through its own ops)."""
    fjt.set_backward(request.param)
    if request.param == "fused":
        probe = fjt.LinearScaleBatchNorm1d(8, 4)
        try:
            probe(make_x(6, 8).requires_grad_()).sum().backward()
        except NotImplementedError as e:
            pytest.skip(f"this fusejit.torch has no fused backward: {e}")
        fjt._reset_warnings()
    return request.param


make_x = layer_reference.make_x
pair = layer_reference.pair


def op_args(M, K, N, dtype=torch.float32, requires_grad=False):
    """Random arguments of both ops: x, weight, (bias, scale, gamma, beta), running mean, var."""
    x = make_x(M, K, "randn", dtype)
    w = (torch.randn(N, K) * K ** -0.5).to(dtype)
    vec = [(torch.rand(N) + 0.5).to(dtype) for _ in range(4)]
    if requires_grad:
        for t in [x, w] + vec:
            t.requires_grad_()
    rm, rv = (torch.randn(N) * 0.1).to(dtype), (torch.rand(N) + 0.5).to(dtype)
    return x, w, vec, rm, rv


# ------------------------------------------------------------------------------------------------
# The package as pip installed it
# ------------------------------------------------------------------------------------------------
def test_package_imports_with_its_extension():
    assert fusejit._C is not None, fusejit._C_import_error
    pkg = pathlib.Path(fusejit.__file__).resolve().parent
    # The extension and the library it links sit in the installed package, not a build tree.
    assert pathlib.Path(fusejit._C.__file__).resolve().parent == pkg
    assert (pkg / "libfusejit.so.0").is_file()
    assert fusejit.__version__ == fusejit._C.version() == importlib.metadata.version("fusejit")
    assert fusejit.torch is fjt


def test_import_fusejit_leaves_torch_alone():
    code = "import sys, fusejit; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_kernel_available_says_why_not():
    ok, why = fjt.kernel_available("cpu")
    assert not ok and "cpu" in why
    ok, why = fjt.kernel_available()  # the current CUDA device, where there is none: no raise
    assert isinstance(ok, bool) and isinstance(why, str)
    if not torch.cuda.is_available():
        assert not ok and why


# ------------------------------------------------------------------------------------------------
# Op registration, fake tensors, opcheck
# ------------------------------------------------------------------------------------------------
def test_ops_registered_with_their_mutations():
    train = torch.ops.fusejit.linear_scale_bn_train.default._schema
    evl = torch.ops.fusejit.linear_scale_bn_eval.default._schema
    written = {a.name for a in train.arguments
               if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"running_mean", "running_var", "num_batches_tracked"}
    assert all(a.alias_info is None for a in evl.arguments)
    assert [a.name for a in train.arguments] == [
        "x", "weight", "bias", "scale", "gamma", "beta", "running_mean", "running_var",
        "num_batches_tracked", "eps", "momentum",
    ]
    assert len(train.returns) == 3 and len(evl.returns) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_fake_tensor_shapes_and_dtypes(dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode

    M, K, N = 37, 19, 23
    with FakeTensorMode():
        x, w = torch.empty(M, K, dtype=dtype), torch.empty(N, K, dtype=dtype)
        vec = [torch.empty(N, dtype=dtype) for _ in range(4)]
        rm, rv = torch.empty(N), torch.empty(N)  # fp32 stats beside low-precision storage
        nbt = torch.zeros((), dtype=torch.long)
        y, mean, invstd = torch.ops.fusejit.linear_scale_bn_train(
            x, w, *vec, rm, rv, nbt, 1e-5, None
        )
        ye = torch.ops.fusejit.linear_scale_bn_eval(x, w, None, None, None, None, rm, rv, 1e-5)
    assert y.shape == ye.shape == (M, N)
    assert y.dtype == ye.dtype == dtype
    assert mean.shape == invstd.shape == (N,)
    assert mean.dtype == invstd.dtype == torch.float32
    # Meta tensors reach the same implementations.
    xm, wm = torch.empty(M, K, device="meta", dtype=dtype), torch.empty(N, K, device="meta",
                                                                       dtype=dtype)
    vm = torch.empty(N, device="meta")
    ym = torch.ops.fusejit.linear_scale_bn_eval(xm, wm, vm, vm, vm, vm, vm, vm, 1e-5)
    assert ym.shape == (M, N) and ym.device.type == "meta" and ym.dtype == dtype


def test_fake_tensor_rejects_bad_shapes_naming_the_argument():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w, vec, rm, rv = op_args(8, 6, 5)
        with pytest.raises(ValueError, match="weight"):
            torch.ops.fusejit.linear_scale_bn_eval(x, w[:, :5], *vec, rm, rv, 1e-5)
        with pytest.raises(ValueError, match="gamma"):
            torch.ops.fusejit.linear_scale_bn_eval(x, w, vec[0], vec[1], rm[:4], vec[3], rm, rv,
                                                   1e-5)
        with pytest.raises(ValueError, match="x"):
            torch.ops.fusejit.linear_scale_bn_train(x[None], w, *vec, rm, rv, None, 1e-5, 0.1)


def test_symbolic_shapes_trace_without_specializing():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b, s, g, be, rm, rv):
        return torch.ops.fusejit.linear_scale_bn_eval(x, w, b, s, g, be, rm, rv, 1e-5)

    x, w, vec, rm, rv = op_args(12, 8, 6)
    gm = make_fx(f, tracing_mode="symbolic")(x, w, *vec, rm, rv)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    M, K = placeholders[0].meta["val"].shape
    N = placeholders[1].meta["val"].shape[0]
    assert tuple(str(d) for d in out.meta["val"].shape) == (str(M), str(N))
    assert not str(M).isdigit() and not str(N).isdigit()
    # The traced graph serves other sizes.
    x2, w2, vec2, rm2, rv2 = op_args(20, 11, 9)
    assert torch.equal(gm(x2, w2, *vec2, rm2, rv2), f(x2, w2, *vec2, rm2, rv2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_opcheck_cpu_fallback(dtype, momentum):
    M, K, N = 16, 24, 12
    x, w, vec, rm, rv = op_args(M, K, N, dtype)
    nbt = torch.full((), 3, dtype=torch.long)
    torch.library.opcheck(
        torch.ops.fusejit.linear_scale_bn_train.default,
        (x, w, *vec, rm, rv, nbt, 1e-5, momentum),
    )
    # Without the optional arguments, and without running stats.
    torch.library.opcheck(
        torch.ops.fusejit.linear_scale_bn_train.default,
        (x, w, None, None, None, None, None, None, None, 1e-3, momentum),
    )
    x, w, vec, rm, rv = op_args(M, K, N, dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.fusejit.linear_scale_bn_eval.default,
                          (x, w, *vec, rm, rv, 1e-5))
    torch.library.opcheck(torch.ops.fusejit.linear_scale_bn_eval.default,
                          (x, w, None, vec[1], None, vec[3], rm, rv, 1e-5))


# ------------------------------------------------------------------------------------------------
# The ops' CPU fallback against nn.BatchNorm1d
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, 0.7, None])
def test_train_op_matches_batchnorm_over_steps(momentum):
    K, N = 64, 40
    ref = make_ref(K, N, momentum=momentum).double()
    rm, rv = ref.bn.running_mean.float(), ref.bn.running_var.float()
    nbt = torch.zeros((), dtype=torch.long)
    w, b, s = ref.gemm.weight.float(), ref.gemm.bias.float(), ref.scale.float()
    g, be = ref.bn.weight.float(), ref.bn.bias.float()
    for M in (50, 2, 129):
        x = make_x(M, K)
        y, mean, invstd = torch.ops.fusejit.linear_scale_bn_train(
            x, w, b, s, g, be, rm, rv, nbt, 1e-5, momentum
        )
        with torch.no_grad():
            z = ref.scale * ref.gemm(x.double())
            want = ref.bn(z)
        assert rel_err(y, want) < TOL[torch.float32], M
        assert rel_err(mean, z.mean(0)) < TOL[torch.float32]
        assert rel_err(invstd, (z.var(0, unbiased=False) + 1e-5).rsqrt()) < TOL[torch.float32]
        assert rel_err(rm, ref.bn.running_mean) < TOL[torch.float32]
        assert rel_err(rv, ref.bn.running_var) < TOL[torch.float32]
        assert int(nbt) == int(ref.bn.num_batches_tracked)
    assert int(nbt) == 3


def test_eval_op_leaves_its_inputs_alone():
    x, w, vec, rm, rv = op_args(30, 20, 10)
    before = [t.clone() for t in (x, w, *vec, rm, rv)]
    y = torch.ops.fusejit.linear_scale_bn_eval(x, w, *vec, rm, rv, 1e-5)
    for t, b in zip((x, w, *vec, rm, rv), before):
        assert torch.equal(t, b)
    b, s, g, be = (t.double() for t in vec)
    z = (x.double() @ w.double().t() + b) * s
    want = (z - rm.double()) / (rv.double() + 1e-5).sqrt() * g + be
    assert rel_err(y, want) < TOL[torch.float32]


# ------------------------------------------------------------------------------------------------
# The module on the CPU: train/eval semantics against the float64 reference
# ------------------------------------------------------------------------------------------------
def _steps(ours, ref64, K, dtype, schedule):
    for train, M, kind in schedule:
        ours.train(train)
        ref64.train(train)
        x = make_x(M, K, kind, dtype)
        if M == 1 and not ours.bn.track_running_stats:
            # Batch statistics in eval too: one row is refused, as nn.BatchNorm1d refuses it.
            for m, arg in ((ref64, x.double()), (ours, x)):
                with pytest.raises(ValueError, match="more than 1 value"):
                    m(arg)
            continue
        y = ours(x)
        assert y.dtype == dtype and y.shape == (M, ours.out_features)
        with torch.no_grad():
            want = ref64(x.double())
        assert rel_err(y, want) < TOL[dtype], (train, M, kind)
        assert_stats_match(ours, ref64, TOL[dtype])


SCHEDULE = [(True, 64, "rand"), (True, 2, "randn"), (False, 33, "rand"), (True, 200, "rand"),
            (False, 1, "randn")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("options", [{}, {"bias": False}, {"affine": False},
                                     {"track_running_stats": False}, {"eps": 0.05}])
def test_module_op_path_matches_reference(op_path, dtype, momentum, options):
    K, N = 48, 40
    ours, ref64 = pair(K, N, dtype, momentum=momentum, **options)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _steps(ours, ref64, K, dtype, SCHEDULE)
    # The op path ran (its fallback warned once, with the reason it was given).
    msgs = [str(m.message) for m in w if "fusejit" in str(m.message)]
    assert len(msgs) == 1 and NO_KERNELS in msgs[0], msgs
    if ours.bn.track_running_stats:
        assert int(ours.bn.num_batches_tracked) == 3


def test_module_op_path_scalar_scale(op_path):
    K, N = 32, 24
    ours, ref64 = pair(K, N, scale_shape=(1,))
    _steps(ours, ref64, K, torch.float32, SCHEDULE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_module_plain_fallback_is_the_reference_with_one_warning(dtype):
    ref = make_ref(32, 24, momentum=None).to(dtype)
    ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for train, M, kind in SCHEDULE:
            ours.train(train)
            ref.train(train)
            x = make_x(M, 32, kind, dtype)
            assert torch.equal(ours(x), ref(x))
    msgs = [str(m.message) for m in w if "fusejit" in str(m.message)]
    assert len(msgs) == 1 and "running PyTorch ops instead" in msgs[0], msgs
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k


@pytest.mark.parametrize("path", ["plain", "op"])
def test_functional_form_matches_module(request, path):
    if path == "op":
        request.getfixturevalue("op_path")
    K, N = 48, 40
    ours, ref64 = pair(K, N, momentum=None)
    bn = ours.bn
    for M in (64, 9):
        x = make_x(M, K)
        y = fjt.linear_scale_batch_norm(
            x, ours.gemm.weight, ours.gemm.bias, ours.scale, bn.weight, bn.bias, bn.running_mean,
            bn.running_var, bn.num_batches_tracked, training=True, momentum=None, eps=1e-5,
        )
        with torch.no_grad():
            assert rel_err(y, ref64(x.double())) < TOL[torch.float32]
        assert_stats_match(ours, ref64, TOL[torch.float32])
    ref64.eval()
    x = make_x(17, K)
    y = fjt.linear_scale_batch_norm(
        x, ours.gemm.weight, ours.gemm.bias, ours.scale, bn.weight, bn.bias, bn.running_mean,
        bn.running_var, training=False,
    )
    with torch.no_grad():
        assert rel_err(y, ref64(x.double())) < TOL[torch.float32]


# ------------------------------------------------------------------------------------------------
# The module's recorded no-grad call (fjt._RecordedCall), down to plan.run
# ------------------------------------------------------------------------------------------------
class _PlanSpy:
    """Stands in for fusejit._C.Plan on CPU tensors: no kernel runs (y keeps what torch.empty
    gave); each run's arguments are kept, so a test sees which addresses reached the kernels."""

    workspace_size = 0
    made = 0

    def __init__(self, *key):
        type(self).made += 1
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


@pytest.fixture
def plan_spy(monkeypatch):
    """The kernel path on CPU tensors, with _PlanSpy for plans and a count of the checked
    path's signatures (a replayed call computes none)."""
    import types

    _PlanSpy.made = 0
    monkeypatch.setattr(fjt, "_KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(fjt, "kernel_available", lambda device=None: (True, ""))
    real = fjt._C
    monkeypatch.setattr(fjt, "_C", types.SimpleNamespace(
        Plan=_PlanSpy, RecordedCall=real.RecordedCall,
        forget_recorded_calls=real.forget_recorded_calls))
    checked = []
    signature = fjt._signature

    def counted(*args):
        checked.append(args[0])
        return signature(*args)

    monkeypatch.setattr(fjt, "_signature", counted)
    fjt.clear_plan_cache()
    yield checked
    fjt.clear_plan_cache()


@pytest.mark.parametrize("train", [True, False])
def test_recorded_call_passes_current_addresses_and_rechecks_changes(plan_spy, train):
    checked = plan_spy
    m = fjt.LinearScaleBatchNorm1d(16, 8).train(train)
    gemm, bn = m.gemm, m.bn

    def call(M=6, grad=False):
        """Runs the module on a fresh x; asserts that the run got the current addresses;
        returns whether the checked path decided the call."""
        x = make_x(M, 16, "randn")
        n = len(checked)
        with torch.set_grad_enabled(grad):
            y = m(x)
        assert y.requires_grad == grad
        plan = m._recorded.c.plan_for(x)
        # run(stream, x, w, y, bias, scale, gamma, beta, running_mean, running_var, nbt, ...)
        args = plan.runs[-1]
        got = dict(zip(("x", "w", "bias", "scale", "gamma", "beta", "rm", "rv", "nbt"),
                       args[1:3] + args[4:11]))
        assert got == {
            "x": x.data_ptr(), "w": gemm.weight.data_ptr(), "bias": gemm.bias.data_ptr(),
            "scale": m.scale.data_ptr(), "gamma": bn.weight.data_ptr(),
            "beta": bn.bias.data_ptr(), "rm": bn.running_mean.data_ptr(),
            "rv": bn.running_var.data_ptr(),
            "nbt": bn.num_batches_tracked.data_ptr() if bn.training else 0,
        }
        # With autograd, the backward's inputs are saved: in train the batch statistics, and
        # for the fused backward `saved`; without, neither is written.
        assert (args[15] != 0) == (grad and fjt.get_backward() == "fused")
        assert (args[11] != 0 and args[12] != 0) == (grad and bn.training)
        return len(checked) > n

    assert call()  # first call: checked, recorded
    assert not call() and not call()  # replayed, each with the new x's address
    assert call(M=10) and not call(M=10)  # a new batch size: checked once
    gemm.weight.data = torch.randn(8, 16)  # same parameter object, new address
    assert call() and not call()
    gemm.bias = nn.Parameter(torch.randn(8))  # a new parameter object
    assert call() and not call()
    made = _PlanSpy.made
    bn.eps = 1e-3
    assert call() and not call()
    assert _PlanSpy.made > made  # eps is in the plan's key: a new plan
    m.to(torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        call()  # x is fp32, the layer now bf16: the checked path says so
    m.float()
    assert call() and not call()
    fjt.clear_plan_cache()
    assert call() and not call()
    assert not call(grad=True) and not call()  # autograd replays too
    m.train(not train)
    assert call() and not call() and not call(grad=True)
    fjt.set_backward("pytorch")
    assert call(grad=True) == (not m.training)  # eval: the PyTorch-ops backward is its own op
    fjt.set_backward("fused")
    copied = copy.deepcopy(m)  # copies re-check: the record is not copied
    assert copied._recorded is None


def test_recorded_call_rechecks_what_the_extension_reads(plan_spy):
    # The replay's checks run in the extension (_C.RecordedCall), which reads the modules'
    # dictionaries itself: each change below must send the next call to the checked path
    # (a new signature) once, and the call after it must replay again.
    checked = plan_spy
    m = fjt.LinearScaleBatchNorm1d(16, 8).train()

    def checked_call(x=None, M=6):
        x = make_x(M, 16, "randn") if x is None else x
        n = len(checked)
        with torch.no_grad():
            y = m(x)
        assert y.shape == (x.shape[0], 8)
        return len(checked) > n

    assert checked_call() and not checked_call()
    m.bn.momentum = None  # a flag: cumulative averaging
    assert checked_call() and not checked_call()
    m.bn.track_running_stats = False
    assert checked_call() and not checked_call()
    m.bn.track_running_stats = True
    m.gemm = nn.Linear(16, 8)  # a new submodule
    assert checked_call() and not checked_call()
    m.scale = nn.Parameter(torch.randn(8))  # a new parameter object on the module itself
    assert checked_call() and not checked_call()
    m.bn.register_buffer("running_var", torch.ones(8))  # a new buffer object
    assert checked_call() and not checked_call()
    assert checked_call(make_x(6, 32, "randn")[:, :16])  # row stride 32: a layout of its own
    assert not checked_call(make_x(6, 32, "randn")[:, 16:])
    assert not checked_call()  # the contiguous layout is still recorded

    class Marked(torch.Tensor):  # a subclass may change what ops do: never replayed
        pass

    x = make_x(6, 16, "randn").as_subclass(Marked)
    assert checked_call(x) and checked_call(x)
    m.bn.momentum = 0.1
    del m.bn.__dict__["eps"]  # read through the class: the extension reads instances only
    type(m.bn).eps = 1e-5
    try:
        assert checked_call() and checked_call()
    finally:
        del type(m.bn).eps


# ------------------------------------------------------------------------------------------------
# state_dict
# ------------------------------------------------------------------------------------------------
def _round_trip(model_class):
    K, N, M = 48, 40, 32
    torch.manual_seed(3)
    ref = model_class(K, N)
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
    # A trained Model's state loads into ours and computes the same; ours loads back.
    torch.manual_seed(4)
    ref = model_class(K, N)
    for _ in range(2):
        ref(make_x(M, K))
    ours = fjt.LinearScaleBatchNorm1d(K, N)
    ours.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    for train in (False, True):
        ours.train(train)
        ref64.train(train)
        x = make_x(M, K)
        with torch.no_grad():
            assert rel_err(ours(x), ref64(x.double())) < TOL[torch.float32]
    assert int(ours.bn.num_batches_tracked) == 3
    back = model_class(K, N)
    back.load_state_dict(ours.state_dict())
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


@pytest.mark.parametrize("path", ["plain", "op"])
def test_state_dict_round_trip_with_seeds_model(request, path):
    model_class = _seeds_model_class()
    if model_class is None:
        pytest.skip("shared/spec/reference_model.py not found (set FUSEJIT_SPEC_DIR)")
    if path == "op":
        request.getfixturevalue("op_path")
    _round_trip(model_class)


def test_state_dict_round_trip_with_options(op_path):
    for kw in ({"bias": False}, {"affine": False}, {"track_running_stats": False}):
        ref = make_ref(16, 8, **kw)
        ours = fjt.LinearScaleBatchNorm1d(16, 8, **kw)
        assert list(ours.state_dict().keys()) == list(ref.state_dict().keys()), kw
        ours.load_state_dict(ref.state_dict())
        x = make_x(10, 16)
        ref64 = copy.deepcopy(ref).double()
        with torch.no_grad():
            assert rel_err(ours(x), ref64(x.double())) < TOL[torch.float32], kw


def test_from_module_copies_or_shares(op_path):
    K, N, M = 48, 40, 32
    ref = make_ref(K, N)
    copied = fjt.LinearScaleBatchNorm1d.from_module(ref)
    shared = fjt.LinearScaleBatchNorm1d.from_module(ref, share=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(copied.state_dict()[k], v)
        assert copied.state_dict()[k].data_ptr() != v.data_ptr()
        assert shared.state_dict()[k].data_ptr() == v.data_ptr()
    x = make_x(M, K)
    copied(x)
    assert int(ref.bn.num_batches_tracked) == 0  # the copy's step left the original alone
    shared(x)
    assert int(ref.bn.num_batches_tracked) == 1
    ref.eval()
    assert not fjt.LinearScaleBatchNorm1d.from_module(ref).training


# ------------------------------------------------------------------------------------------------
# Autograd
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kind", ["rand", "randn"])
def test_backward_matches_float64_autograd(backward, dtype, train, kind):
    M, K, N = 120, 64, 48
    ref = make_ref(K, N).to(dtype)
    with torch.no_grad():
        ref.bn.weight[5] = 0  # a gamma = 0 column still has a gradient for gamma
    ours = fjt.LinearScaleBatchNorm1d.from_module(ref)
    ref64 = copy.deepcopy(ref).double()
    ours.train(train)
    ref64.train(train)
    x = make_x(M, K, kind, dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    dy = torch.randn(M, N).to(dtype)
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
    assert_stats_match(ours, ref64, TOL[dtype])


@pytest.mark.parametrize("train", [True, False])
def test_backward_without_bias_and_affine(backward, train):
    M, K, N = 64, 32, 24
    ours, ref64 = pair(K, N, bias=False, affine=False, eps=0.05)  # an eps that shows
    ours.train(train)
    ref64.train(train)
    x = make_x(M, K, "randn").requires_grad_()
    x64 = x.detach().double().requires_grad_()
    dy = torch.randn(M, N)
    ours(x).backward(dy)
    ref64(x64).backward(dy.double())
    assert rel_err(x.grad, x64.grad) < GRAD_TOL[torch.float32]
    assert rel_err(ours.scale.grad, ref64.scale.grad) < GRAD_TOL[torch.float32]
    assert rel_err(ours.gemm.weight.grad, ref64.gemm.weight.grad) < GRAD_TOL[torch.float32]


def test_backward_of_input_only(backward):
    # Frozen parameters: only x asks for a gradient (the Function's needs_input_grad mask).
    ours, ref64 = pair(32, 24)
    for p in ours.parameters():
        p.requires_grad_(False)
    x = make_x(40, 32, "randn").requires_grad_()
    x64 = x.detach().double().requires_grad_()
    dy = torch.randn(40, 24)
    ours(x).backward(dy)
    ref64(x64).backward(dy.double())
    assert rel_err(x.grad, x64.grad) < GRAD_TOL[torch.float32]
    assert all(p.grad is None for p in ours.parameters())


def test_set_backward():
    for kind in ("pytorch", "fused"):
        fjt.set_backward(kind)
        assert fjt.get_backward() == kind
    with pytest.raises(ValueError, match="backward"):
        fjt.set_backward("cudnn")
    assert fjt.get_backward() == "fused"  # a refused choice changes nothing


@pytest.mark.parametrize("train", [True, False])
def test_torch_compile_traces_the_ops(backward, train):
    # aot_eager: dynamo, functionalization of the mutating op and the fake implementations, with
    # no C++ compile; a second batch size recompiles with a symbolic M.
    torch._dynamo.reset()
    K, N = 48, 32
    ours, _ = pair(K, N)
    ours.train(train)
    eager = copy.deepcopy(ours)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    for M in (64, 40, 24):
        x = make_x(M, K)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        dy = torch.randn(M, N)
        ye, yc = eager(xe), compiled(xc)
        assert rel_err(yc, ye) < TOL[torch.float32], M
        ye.backward(dy)
        yc.backward(dy)
        assert rel_err(xc.grad, xe.grad) < GRAD_TOL[torch.float32]
        assert rel_err(ours.gemm.weight.grad, eager.gemm.weight.grad) < GRAD_TOL[torch.float32]
    assert int(ours.bn.num_batches_tracked) == (3 if train else 0)
    assert rel_err(ours.bn.running_mean, eager.bn.running_mean) < TOL[torch.float32]
    assert rel_err(ours.bn.running_var, eager.bn.running_var) < TOL[torch.float32]
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# Errors: ValueError for invalid arguments (naming them), RuntimeError for the rest
# ------------------------------------------------------------------------------------------------
def _plan_args(**kw):
    args = dict(M=64, N=32, K=16, dtype="fp32", mode="train", param_dtype="fp32", eps=1e-5,
                momentum=0.1, has_bias=True, has_scale=True, has_affine=True, ldx=0, ldw=0, ldy=0,
                device=0)
    args.update(kw)
    return args


@needs_C
@pytest.mark.parametrize("bad", [{"dtype": "fp64"}, {"mode": "inference"}, {"M": 0}, {"N": -1},
                                 {"eps": -1.0}, {"momentum": 1.5}, {"ldx": 3}])
def test_library_invalid_argument_is_value_error(bad):
    (name,) = bad
    with pytest.raises(ValueError, match=f"invalid argument '{name}'"):
        fusejit._C.Plan(**_plan_args(**bad))


@needs_C
def test_library_other_errors_are_runtime_error():
    ok, why = fusejit._C.device_supported(0)
    if ok:
        pytest.skip("a usable GPU is here: the GPU tests cover plans that succeed")
    with pytest.raises(RuntimeError) as info:
        fusejit._C.Plan(**_plan_args())
    assert not isinstance(info.value, ValueError)
    assert str(info.value) == why  # fusejit's own message, not a generic one


@pytest.mark.parametrize("path", ["plain", "op"])
def test_module_errors(request, path):
    if path == "op":
        request.getfixturevalue("op_path")
    ours, _ = pair(16, 8)
    with pytest.raises(ValueError, match="2-D"):
        ours(torch.rand(2, 3, 16))
    with pytest.raises(ValueError, match="more than 1 value"):
        ours(make_x(1, 16))
    ours.eval()
    assert ours(make_x(1, 16)).shape == (1, 8)  # one row is fine with running stats


def test_module_dtype_mismatch_op_path(op_path):
    ours, _ = pair(16, 8)
    with pytest.raises(ValueError, match="dtype"):
        ours(make_x(4, 16, dtype=torch.bfloat16))


def test_op_errors_name_the_argument():
    x, w, vec, rm, rv = op_args(8, 6, 5)
    nbt = torch.zeros((), dtype=torch.long)
    train = torch.ops.fusejit.linear_scale_bn_train
    evl = torch.ops.fusejit.linear_scale_bn_eval
    cases = [
        ("x", lambda: evl(x[0], w, *vec, rm, rv, 1e-5)),
        ("weight", lambda: evl(x, w.t(), *vec, rm, rv, 1e-5)),
        ("weight", lambda: evl(x, w.double(), *vec, rm, rv, 1e-5)),
        ("bias", lambda: evl(x, w, rm[:3], *vec[1:], rm, rv, 1e-5)),
        ("scale", lambda: evl(x, w, vec[0], nbt.expand(5), *vec[2:], rm, rv, 1e-5)),
        ("running_var", lambda: evl(x, w, *vec, rm, rv[:4], 1e-5)),
        ("num_batches_tracked", lambda: train(x, w, *vec, rm, rv, nbt.int(), 1e-5, 0.1)),
        ("num_batches_tracked", lambda: train(x, w, *vec, rm, rv, nbt.expand(2), 1e-5, 0.1)),
        ("running_mean and running_var", lambda: train(x, w, *vec, rm, None, nbt, 1e-5, 0.1)),
        ("more than 1 value", lambda: train(x[:1], w, *vec, rm, rv, nbt, 1e-5, 0.1)),
    ]
    for what, call in cases:
        with pytest.raises(ValueError, match=what):
            call()
    assert int(nbt) == 0  # no failed call counted a batch


def test_functional_errors(op_path):
    x, w, vec, rm, rv = op_args(8, 6, 5)
    with pytest.raises(ValueError, match="running_mean and running_var"):
        fjt.linear_scale_batch_norm(x, w, *vec, training=False)
    with pytest.raises(ValueError, match="weight"):
        fjt.linear_scale_batch_norm(x, w[:, :4], *vec, rm, rv, training=False)
