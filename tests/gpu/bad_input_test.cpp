// Bad input is rejected with InvalidArgument naming the argument, before anything is enqueued,
// and leaves every output byte as it was (outputs, running stats, saved stats and the batch
// counter hold a byte pattern that must survive a rejected run). Both fusejit::Plan and the
// ReferenceOp (same Tensors contract). NaN and Inf inputs are not bad input: they run and
// propagate as PyTorch propagates them.
//
// The catalogue ("bad input catalogue" below; one row per class, in the order of the table):
//
//    #  class                                          rejected as
//    1  null x / W / y                                 "x" / "w" / "y"
//    2  null parameter the problem has                 "bias" / "scale" / "gamma" / "beta"
//    3  parameter the problem says is absent           "bias" / "scale" / "gamma"
//    4  x / W / y offset by 2 bytes (misaligned)       "x" / "w" / "y"
//    5  misaligned stats or counter                    "running_mean" / "save_invstd" /
//                                                      "num_batches_tracked"
//    6  M = 0                                          "M"  (Problem::validate, Plan, ReferenceOp)
//    7  N < 0                                          "N"
//    8  K = 0                                          "K"
//    9  ldx < K                                        "ldx"
//   10  M = 1 in train                                 "M"
//   11  fp16 parameters with bf16 x                    "param_dtype"
//   12  eps <= 0, momentum outside [0, 1]              "eps", "momentum"
//   13  alignment that is no power of two in 2..16     "alignment"
//   14  caller workspace null / too small / misaligned "workspace" (two-pass train plan)
//   15  eval without running stats                     "running_mean" / "running_var"
//   16  momentum=None without num_batches_tracked      "num_batches_tracked"
//   17  only one of running_mean / running_var         the missing one
//   18  batch outputs passed in eval                   "save_mean" / "num_batches_tracked"
//   19  stream from another CUDA context               "stream" (cuStreamGetCtx in run();
//                                                      skipped when cuCtxCreate_v2 is missing)
//   20  compute capability < 8.0 (sm_75 simulated)    "arch" (parse_arch, Device::for_arch)
//   21  NaN / Inf in x or W                            runs; NaN/Inf where the float64
//                                                      reference has them, finite elsewhere
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusejit/backward.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "gpu_required.hpp"
#include "tools/sweep.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;

namespace {

constexpr unsigned char kPattern = 0xA5;
constexpr std::size_t kSpare = 16;  // so pointers offset by a few bytes stay inside

using RunFn = std::function<void(CUstream, const Tensors&)>;

RunFn make_op(const Problem& p, bool reference) {
  if (reference) {
    auto op = std::make_shared<ReferenceOp>(p);
    return [op](CUstream s, const Tensors& t) { op->run(s, t); };
  }
  auto plan = std::make_shared<Plan>(p);
  return [plan](CUstream s, const Tensors& t) { plan->run(s, t); };
}

// The argument an InvalidArgument names, "(accepted)", or the type of any other error (so a
// check for a name fails showing what came instead).
std::string rejected_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.argument();
  } catch (const std::exception& e) {
    return std::string("(other error: ") + e.what() + ")";
  }
  return "(accepted)";
}

// Every buffer a run of `p` can touch, whatever the problem's flags, with valid inputs.
struct Buffers {
  Problem p;
  CaseInputs in;
  DeviceBuffer x, w, y, bias, scale, gamma, beta, rm, rv, nbt, save_mean, save_invstd;

  explicit Buffers(const Problem& prob) : p(prob) {
    SweepCase c;
    c.problem = p;
    c.problem.has_bias = c.problem.has_scale = c.problem.has_affine = true;
    c.problem.mode = Mode::eval;  // eval inputs include the running stats
    in = make_case_inputs(c, 1);
    auto sized = [](const HostTensor& h) { return DeviceBuffer(h.bytes() + kSpare); };
    x = sized(in.x);
    w = sized(in.w);
    y = DeviceBuffer(static_cast<std::size_t>(p.M * p.lda_y()) * storage_bytes(p.dtype) + kSpare);
    bias = sized(in.bias);
    scale = sized(in.scale);
    gamma = sized(in.gamma);
    beta = sized(in.beta);
    rm = sized(in.running_mean);
    rv = sized(in.running_var);
    nbt = DeviceBuffer(sizeof(std::int64_t) + kSpare);
    save_mean = DeviceBuffer(static_cast<std::size_t>(p.N) * 4 + kSpare);
    save_invstd = DeviceBuffer(static_cast<std::size_t>(p.N) * 4 + kSpare);
    const std::vector<std::pair<DeviceBuffer*, const HostTensor*>> inputs = {
        {&x, &in.x},         {&w, &in.w},         {&bias, &in.bias},
        {&scale, &in.scale}, {&gamma, &in.gamma}, {&beta, &in.beta}};
    for (const auto& [buf, h] : inputs) buf->upload(h->data(), h->bytes());
    fill_outputs();
  }

  std::vector<DeviceBuffer*> written() { return {&y, &rm, &rv, &nbt, &save_mean, &save_invstd}; }

  void fill_outputs() {
    for (DeviceBuffer* b : written()) b->fill_bytes(kPattern);
  }

  bool untouched() {
    for (DeviceBuffer* b : written())
      for (unsigned char v : b->download_bytes())
        if (v != kPattern) return false;
    return true;
  }

  // Valid running stats and counter, for the runs that must succeed.
  void make_runnable() {
    rm.upload(in.running_mean.data(), in.running_mean.bytes());
    rv.upload(in.running_var.data(), in.running_var.bytes());
    const std::int64_t zero = 0;
    nbt.upload(&zero, sizeof zero);
  }

  // Exactly what the problem wants.
  Tensors full() const { return full(p); }
  // Exactly what `q` (same shapes and dtypes as p, other flags) wants.
  Tensors full(const Problem& q) const {
    Tensors t;
    t.x = x.get();
    t.w = w.get();
    t.y = y.get();
    if (q.has_bias) t.bias = bias.get();
    if (q.has_scale) t.scale = scale.get();
    if (q.has_affine) t.gamma = gamma.get(), t.beta = beta.get();
    t.running_mean = rm.get();
    t.running_var = rv.get();
    if (q.mode == Mode::train) {
      t.num_batches_tracked = nbt.as<std::int64_t>();
      t.save_mean = save_mean.as<float>();
      t.save_invstd = save_invstd.as<float>();
    }
    return t;
  }
};

// Runs `t`, expects InvalidArgument naming `arg` and every output byte unchanged.
void expect_rejected(const RunFn& op, Buffers& b, const Tensors& t, const std::string& arg) {
  CAPTURE(arg);
  b.fill_outputs();
  const Stream s;
  CHECK(rejected_argument([&] { op(s, t); }) == arg);
  s.synchronize();
  CHECK(b.untouched());
}

template <class T>
T* offset(T* p, std::uintptr_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) + bytes);
}

Problem base_problem(Mode mode) {
  Problem p;
  p.M = 256, p.N = 128, p.K = 64;
  p.dtype = DType::bf16;
  p.mode = mode;
  return p;
}

}  // namespace

TEST_CASE("null pointers are rejected by name and nothing is written") {
  primary_context(0);
  for (bool reference : {false, true})
    for (Mode mode : {Mode::train, Mode::eval}) {
      CAPTURE(reference);
      CAPTURE(name(mode));
      Problem p = base_problem(mode);
      p.momentum = std::nullopt;  // cumulative: the counter is required in train
      const RunFn op = make_op(p, reference);
      Buffers b(p);
      struct Field {
        const char* name;
        std::function<void(Tensors&)> clear;
      };
      std::vector<Field> fields = {
          {"x", [](Tensors& t) { t.x = nullptr; }},
          {"w", [](Tensors& t) { t.w = nullptr; }},
          {"y", [](Tensors& t) { t.y = nullptr; }},
          {"bias", [](Tensors& t) { t.bias = nullptr; }},
          {"scale", [](Tensors& t) { t.scale = nullptr; }},
          {"gamma", [](Tensors& t) { t.gamma = nullptr; }},
          {"beta", [](Tensors& t) { t.beta = nullptr; }},
      };
      if (mode == Mode::eval) {
        fields.push_back({"running_mean", [](Tensors& t) { t.running_mean = nullptr; }});
        fields.push_back({"running_var", [](Tensors& t) { t.running_var = nullptr; }});
      } else {
        fields.push_back(
            {"num_batches_tracked", [](Tensors& t) { t.num_batches_tracked = nullptr; }});
        // Running stats go in pairs: the missing one is named.
        fields.push_back({"running_var", [](Tensors& t) { t.running_var = nullptr; }});
        fields.push_back({"running_mean", [](Tensors& t) { t.running_mean = nullptr; }});
      }
      for (const auto& f : fields) {
        Tensors t = b.full();
        f.clear(t);
        expect_rejected(op, b, t, f.name);
      }
      // The complete tensors run and write: the byte check above can see a write.
      b.fill_outputs();
      b.make_runnable();
      const Stream s;
      op(s, b.full());
      s.synchronize();
      const auto y = b.y.download_bytes();
      CHECK(std::count(y.begin(), y.end(), kPattern) < static_cast<std::ptrdiff_t>(y.size() / 2));
    }
}

TEST_CASE("M = 1 in train mode is rejected naming M; eval accepts it") {
  primary_context(0);
  Problem p = base_problem(Mode::train);
  p.M = 1;
  CHECK(rejected_argument([&] { p.validate(); }) == "M");
  CHECK(rejected_argument([&] { Plan plan(p); }) == "M");
  CHECK(rejected_argument([&] { ReferenceOp op(p); }) == "M");
  p.mode = Mode::eval;
  CHECK(rejected_argument([&] { p.validate(); }) == "(accepted)");
  CHECK(rejected_argument([&] { Plan plan(p); }) == "(accepted)");
  CHECK(rejected_argument([&] { ReferenceOp op(p); }) == "(accepted)");
}

TEST_CASE("pointers offset by 2 bytes break the promised alignment: rejected by name") {
  primary_context(0);
  for (bool reference : {false, true}) {
    CAPTURE(reference);
    const Problem p = base_problem(Mode::train);  // bf16 data (16-byte promise), fp32 params
    const RunFn op = make_op(p, reference);
    Buffers b(p);
    struct Field {
      const char* name;
      std::function<void(Tensors&)> shift;
    };
    const std::vector<Field> fields = {
        {"x", [](Tensors& t) { t.x = offset(t.x, 2); }},
        {"w", [](Tensors& t) { t.w = offset(t.w, 2); }},
        {"y", [](Tensors& t) { t.y = offset(t.y, 2); }},
        {"bias", [](Tensors& t) { t.bias = offset(t.bias, 2); }},
        {"scale", [](Tensors& t) { t.scale = offset(t.scale, 2); }},
        {"gamma", [](Tensors& t) { t.gamma = offset(t.gamma, 2); }},
        {"beta", [](Tensors& t) { t.beta = offset(t.beta, 2); }},
        {"running_mean", [](Tensors& t) { t.running_mean = offset(t.running_mean, 2); }},
        {"running_var", [](Tensors& t) { t.running_var = offset(t.running_var, 2); }},
        {"num_batches_tracked",
         [](Tensors& t) { t.num_batches_tracked = offset(t.num_batches_tracked, 4); }},
        {"save_mean", [](Tensors& t) { t.save_mean = offset(t.save_mean, 2); }},
        {"save_invstd", [](Tensors& t) { t.save_invstd = offset(t.save_invstd, 2); }},
    };
    for (const auto& f : fields) {
      Tensors t = b.full();
      f.shift(t);
      expect_rejected(op, b, t, f.name);
    }
    // x offset by 8 bytes still breaks a 16-byte promise.
    Tensors t = b.full();
    t.x = offset(t.x, 8);
    expect_rejected(op, b, t, "x");
  }
}

TEST_CASE("leading dimensions that break the promised alignment are rejected by name") {
  primary_context(0);
  struct Case {
    std::int64_t ldx, ldw, ldy;
    const char* arg;
  };
  // bf16, K = N = 64: a stride of 65 elements is 130 bytes, not a multiple of 16.
  for (const Case c : {Case{65, 0, 0, "ldx"}, Case{0, 65, 0, "ldw"}, Case{0, 0, 65, "ldy"},
                       Case{63, 0, 0, "ldx"}, Case{0, 0, 63, "ldy"}}) {
    CAPTURE(c.arg);
    Problem p = base_problem(Mode::train);
    p.N = 64;
    p.alignment = 16;  // an explicit promise (automatic alignment would just narrow itself)
    p.ldx = c.ldx, p.ldw = c.ldw, p.ldy = c.ldy;
    CHECK(rejected_argument([&] { p.validate(); }) == c.arg);
    CHECK(rejected_argument([&] { Plan plan(p); }) == c.arg);
    CHECK(rejected_argument([&] { ReferenceOp op(p); }) == c.arg);
    CHECK(rejected_argument([&] { BareGemm g(p); }) == c.arg);
  }
  // The same strides are fine with a 2-byte promise, and automatic alignment picks 2 for them.
  Problem p = base_problem(Mode::train);
  p.ldx = 65, p.ldy = 129, p.alignment = 2;
  CHECK(rejected_argument([&] { p.validate(); }) == "(accepted)");
  p.alignment = 0;
  CHECK(rejected_argument([&] { p.validate(); }) == "(accepted)");
  CHECK(p.effective_alignment() == 2);
}

TEST_CASE("parameters must be fp32 or the input's storage type") {
  primary_context(0);
  struct Case {
    DType dtype, param;
  };
  for (const Case c : {Case{DType::fp16, DType::bf16}, Case{DType::bf16, DType::fp16},
                       Case{DType::fp32, DType::bf16}, Case{DType::tf32, DType::fp16}}) {
    CAPTURE(name(c.dtype));
    CAPTURE(name(c.param));
    Problem p = base_problem(Mode::train);
    p.dtype = c.dtype;
    p.param_dtype = c.param;
    CHECK(rejected_argument([&] { p.validate(); }) == "param_dtype");
    CHECK(rejected_argument([&] { Plan plan(p); }) == "param_dtype");
    CHECK(rejected_argument([&] { ReferenceOp op(p); }) == "param_dtype");
  }
}

TEST_CASE("pointers the problem does not want are rejected by name") {
  primary_context(0);
  for (bool reference : {false, true}) {
    CAPTURE(reference);
    Problem p = base_problem(Mode::eval);
    p.has_bias = false;
    p.has_affine = false;
    const RunFn op = make_op(p, reference);
    Buffers b(p);
    Tensors t = b.full();
    t.bias = b.bias.get();
    expect_rejected(op, b, t, "bias");
    t = b.full();
    t.gamma = b.gamma.get();
    expect_rejected(op, b, t, "gamma");
    t = b.full();
    t.save_mean = b.save_mean.as<float>();
    expect_rejected(op, b, t, "save_mean");
    t = b.full();
    t.num_batches_tracked = b.nbt.as<std::int64_t>();
    expect_rejected(op, b, t, "num_batches_tracked");
  }
}

TEST_CASE("a device ordinal past the machine's GPUs is rejected naming device") {
  int count = 0;
  REQUIRE(driver().cuDeviceGetCount(&count) == CUDA_SUCCESS);
  PlanOptions o;
  o.device = count;
  CHECK(rejected_argument([&] { const Plan plan(base_problem(Mode::eval), o); }) == "device");
  BackwardOptions b;
  b.device = count;
  CHECK(rejected_argument([&] { const BackwardPlan plan(base_problem(Mode::eval), b); }) ==
        "device");
}

TEST_CASE("the bare GEMM checks its pointers too") {
  primary_context(0);
  const Problem p = base_problem(Mode::eval);
  const BareGemm g(p);
  Buffers b(p);
  const Stream s;
  CHECK(rejected_argument([&] { g.run(s, nullptr, b.w.get(), b.y.get()); }) == "x");
  CHECK(rejected_argument([&] { g.run(s, b.x.get(), offset(b.w.get(), 2), b.y.get()); }) == "w");
  CHECK(rejected_argument([&] { g.run(s, b.x.get(), b.w.get(), offset(b.y.get(), 4)); }) == "y");
  s.synchronize();
  CHECK(b.untouched());
}

// ---------------------------------------------------------------------------------------------
// The bad input catalogue (the table at the top of this file).

namespace {

// A second context on device 0, as a host application with a context of its own would have.
// fusejit never creates contexts, so the driver table has no cuCtxCreate: it is resolved here
// from the libcuda.so.1 that driver() loaded, under the versioned name whose signature we use.
class ForeignContext {
 public:
  ForeignContext() {
    driver();
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
      why_ = "libcuda.so.1 is not loaded";
      return;
    }
    create_ = reinterpret_cast<CtxCreate>(::dlsym(lib, "cuCtxCreate_v2"));
    destroy_ = reinterpret_cast<CtxDestroy>(::dlsym(lib, "cuCtxDestroy_v2"));
    ::dlclose(lib);  // RTLD_NOLOAD took a reference; driver()'s own handle keeps it loaded
    if (!create_ || !destroy_) {
      why_ = "libcuda.so.1 lacks cuCtxCreate_v2 / cuCtxDestroy_v2";
      return;
    }
    CUdevice dev = 0;
    FJ_CU(cuDeviceGet(&dev, 0));
    if (const CUresult r = create_(&ctx_, 0, dev); r != CUDA_SUCCESS) {
      why_ = "cuCtxCreate_v2 failed with CUresult " + std::to_string(static_cast<int>(r));
      ctx_ = nullptr;
    } else {
      stream_.emplace();  // cuCtxCreate made ctx_ current: the stream belongs to it
    }
    primary_context(0);
  }
  ~ForeignContext() {
    stream_.reset();
    if (ctx_) destroy_(ctx_);
    try {
      primary_context(0);
    } catch (...) {
    }
  }
  ForeignContext(const ForeignContext&) = delete;
  ForeignContext& operator=(const ForeignContext&) = delete;

  bool ok() const { return ctx_ != nullptr; }
  CUcontext context() const { return ctx_; }
  const std::string& why_not() const { return why_; }
  CUstream stream() const { return stream_->get(); }

 private:
  using CtxCreate = CUresult (*)(CUcontext*, unsigned, CUdevice);
  using CtxDestroy = CUresult (*)(CUcontext);
  CtxCreate create_ = nullptr;
  CtxDestroy destroy_ = nullptr;
  CUcontext ctx_ = nullptr;
  std::optional<Stream> stream_;
  std::string why_;
};

// Two-pass in train (M above any row tile), so a run needs workspace.
Problem train_problem() {
  Problem p = base_problem(Mode::train);
  p.M = 1000;
  return p;
}
Problem eval_problem() {
  Problem p = train_problem();
  p.mode = Mode::eval;
  return p;
}

struct Fixture {
  Buffers b{train_problem()};  // eval_problem() has the same shapes and dtypes
  Stream s;
  ForeignContext foreign;
};

// One row: a class of bad input (its number in the table), the argument it must be rejected
// as, and the attempt (for the Plan, or with reference = true for the ReferenceOp).
struct BadInput {
  int cls = 0;
  std::string what;
  std::string expect;
  std::function<void(Fixture&, bool reference)> attempt;
  std::optional<Problem> problem;  // construction-time classes: Problem::validate is checked too
  bool both = true;                // also through the ReferenceOp
  bool foreign_stream = false;     // needs the second context
};

using Edit = std::function<void(Tensors&, Fixture&)>;

// A run of problem `q` with its full tensors changed by `edit`.
BadInput run_row(int cls, std::string what, std::string expect, const Problem& q, Edit edit) {
  BadInput r;
  r.cls = cls;
  r.what = std::move(what);
  r.expect = std::move(expect);
  r.attempt = [q, edit](Fixture& f, bool reference) {
    const RunFn op = make_op(q, reference);
    Tensors t = f.b.full(q);
    edit(t, f);
    op(f.s, t);
  };
  return r;
}

// Making a plan (or ReferenceOp) for problem `q`.
BadInput problem_row(int cls, std::string what, std::string expect, const Problem& q) {
  BadInput r;
  r.cls = cls;
  r.what = std::move(what);
  r.expect = std::move(expect);
  r.problem = q;
  r.attempt = [q](Fixture&, bool reference) { make_op(q, reference); };
  return r;
}

// A run of the two-pass train problem with a caller workspace (the Plan's contract only).
BadInput workspace_row(std::string what, std::ptrdiff_t size_delta, std::size_t shift, bool null) {
  BadInput r;
  r.cls = 14;
  r.what = std::move(what);
  r.expect = "workspace";
  r.both = false;
  r.attempt = [=](Fixture& f, bool) {
    PlanOptions o;
    o.variant = Variant::tiled;  // the fused kernels (a tuning entry could pick the reference op)
    const Plan plan(train_problem(), o);
    if (plan.workspace_size() == 0)
      throw std::runtime_error("the two-pass plan needs no workspace");
    const DeviceBuffer ws(plan.workspace_size() + 512);
    void* ptr = null ? nullptr : offset(ws.get(), shift);
    const auto bytes =
        static_cast<std::size_t>(static_cast<std::ptrdiff_t>(plan.workspace_size()) + size_delta);
    plan.run(f.s, f.b.full(), ptr, bytes);
  };
  return r;
}

BadInput arch_row(std::string what, std::function<void()> f) {
  BadInput r;
  r.cls = 20;
  r.what = std::move(what);
  r.expect = "arch";
  r.both = false;
  r.attempt = [f](Fixture&, bool) { f(); };
  return r;
}

std::vector<BadInput> catalogue() {
  const Problem T = train_problem(), E = eval_problem();
  auto with = [](Problem q, const std::function<void(Problem&)>& f) {
    f(q);
    return q;
  };
  std::vector<BadInput> rows = {
      run_row(1, "null x", "x", T, [](Tensors& t, Fixture&) { t.x = nullptr; }),
      run_row(1, "null W", "w", T, [](Tensors& t, Fixture&) { t.w = nullptr; }),
      run_row(1, "null y", "y", E, [](Tensors& t, Fixture&) { t.y = nullptr; }),
      run_row(2, "null bias", "bias", T, [](Tensors& t, Fixture&) { t.bias = nullptr; }),
      run_row(2, "null scale", "scale", T, [](Tensors& t, Fixture&) { t.scale = nullptr; }),
      run_row(2, "null gamma", "gamma", E, [](Tensors& t, Fixture&) { t.gamma = nullptr; }),
      run_row(2, "null beta", "beta", T, [](Tensors& t, Fixture&) { t.beta = nullptr; }),
      run_row(3, "bias given, has_bias = false", "bias",
              with(T, [](Problem& q) { q.has_bias = false; }),
              [](Tensors& t, Fixture& f) { t.bias = f.b.bias.get(); }),
      run_row(3, "scale given, has_scale = false", "scale",
              with(E, [](Problem& q) { q.has_scale = false; }),
              [](Tensors& t, Fixture& f) { t.scale = f.b.scale.get(); }),
      run_row(3, "gamma and beta given, has_affine = false", "gamma",
              with(T, [](Problem& q) { q.has_affine = false; }),
              [](Tensors& t, Fixture& f) { t.gamma = f.b.gamma.get(), t.beta = f.b.beta.get(); }),
      run_row(4, "x + 2 bytes", "x", T, [](Tensors& t, Fixture&) { t.x = offset(t.x, 2); }),
      run_row(4, "W + 2 bytes", "w", E, [](Tensors& t, Fixture&) { t.w = offset(t.w, 2); }),
      run_row(4, "y + 2 bytes", "y", T, [](Tensors& t, Fixture&) { t.y = offset(t.y, 2); }),
      run_row(5, "running_mean + 2 bytes", "running_mean", T,
              [](Tensors& t, Fixture&) { t.running_mean = offset(t.running_mean, 2); }),
      run_row(5, "save_invstd + 2 bytes", "save_invstd", T,
              [](Tensors& t, Fixture&) { t.save_invstd = offset(t.save_invstd, 2); }),
      run_row(
          5, "num_batches_tracked + 4 bytes", "num_batches_tracked", T,
          [](Tensors& t, Fixture&) { t.num_batches_tracked = offset(t.num_batches_tracked, 4); }),
      problem_row(6, "M = 0", "M", with(T, [](Problem& q) { q.M = 0; })),
      problem_row(6, "M = 0 (eval)", "M", with(E, [](Problem& q) { q.M = 0; })),
      problem_row(7, "N = -1", "N", with(T, [](Problem& q) { q.N = -1; })),
      problem_row(8, "K = 0", "K", with(E, [](Problem& q) { q.K = 0; })),
      problem_row(9, "ldx = K - 8", "ldx", with(T, [](Problem& q) { q.ldx = q.K - 8; })),
      problem_row(10, "M = 1 in train", "M", with(T, [](Problem& q) { q.M = 1; })),
      problem_row(11, "fp16 parameters, bf16 x", "param_dtype",
                  with(T, [](Problem& q) { q.param_dtype = DType::fp16; })),
      problem_row(12, "eps = 0", "eps", with(T, [](Problem& q) { q.eps = 0; })),
      problem_row(12, "momentum = 1.5", "momentum", with(T, [](Problem& q) { q.momentum = 1.5; })),
      problem_row(13, "alignment = 3", "alignment", with(T, [](Problem& q) { q.alignment = 3; })),
      workspace_row("null workspace", 0, 0, true),
      workspace_row("workspace 256 bytes short", -256, 0, false),
      workspace_row("workspace + 16 bytes (not 256-byte aligned)", 0, 16, false),
      run_row(15, "eval without running_mean", "running_mean", E,
              [](Tensors& t, Fixture&) { t.running_mean = nullptr; }),
      run_row(15, "eval without running_var", "running_var", E,
              [](Tensors& t, Fixture&) { t.running_var = nullptr; }),
      run_row(16, "momentum=None without num_batches_tracked", "num_batches_tracked",
              with(T, [](Problem& q) { q.momentum = std::nullopt; }),
              [](Tensors& t, Fixture&) { t.num_batches_tracked = nullptr; }),
      run_row(17, "running_mean without running_var", "running_var", T,
              [](Tensors& t, Fixture&) { t.running_var = nullptr; }),
      run_row(17, "running_var without running_mean", "running_mean", T,
              [](Tensors& t, Fixture&) { t.running_mean = nullptr; }),
      run_row(18, "save_mean in eval", "save_mean", E,
              [](Tensors& t, Fixture& f) { t.save_mean = f.b.save_mean.as<float>(); }),
      run_row(18, "num_batches_tracked in eval", "num_batches_tracked", E,
              [](Tensors& t, Fixture& f) { t.num_batches_tracked = f.b.nbt.as<std::int64_t>(); }),
      arch_row("parse_arch(\"sm_75\")", [] { parse_arch("sm_75"); }),
      arch_row("parse_arch(\"7.0\")", [] { parse_arch("7.0"); }),
      arch_row("Device::for_arch(\"sm_75\")", [] { Device::for_arch("sm_75"); }),
  };
  for (const Problem& q : {T, E}) {
    BadInput r;
    r.cls = 19;
    r.what = std::string("stream from another context (") + std::string(name(q.mode)) + ")";
    r.expect = "stream";
    r.foreign_stream = true;
    r.attempt = [q](Fixture& f, bool reference) {
      make_op(q, reference)(f.foreign.stream(), f.b.full(q));
    };
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

TEST_CASE("bad input catalogue: each class rejected by name, no output byte changed") {
  primary_context(0);
  Fixture f;
  if (!f.foreign.ok())
    MESSAGE("class 19 (stream from another context) skipped: " << f.foreign.why_not());
  const std::vector<BadInput> rows = catalogue();
  std::set<int> classes;
  int attempts = 0, skipped = 0;
  for (const BadInput& row : rows) {
    for (bool reference : {false, true}) {
      if (reference && !row.both) continue;
      if (row.foreign_stream && !f.foreign.ok()) {
        ++skipped;
        continue;
      }
      CAPTURE(row.cls);
      CAPTURE(row.what);
      CAPTURE(reference);
      f.b.fill_outputs();
      CHECK(rejected_argument([&] { row.attempt(f, reference); }) == row.expect);
      f.s.synchronize();
      if (row.foreign_stream) driver().cuStreamSynchronize(f.foreign.stream());
      CHECK(f.b.untouched());
      ++attempts;
      classes.insert(row.cls);
    }
    if (row.problem) {
      CAPTURE(row.what);
      CHECK(rejected_argument([&] { row.problem->validate(); }) == row.expect);
    }
  }
  // The byte check can see a write: the same buffers, complete, run and change y.
  f.b.fill_outputs();
  f.b.make_runnable();
  make_op(train_problem(), false)(f.s, f.b.full());
  f.s.synchronize();
  const auto y = f.b.y.download_bytes();
  CHECK(std::count(y.begin(), y.end(), kPattern) < static_cast<std::ptrdiff_t>(y.size() / 2));
  // Class 21 (NaN / Inf) is the next test case.
  MESSAGE("bad input catalogue: " << classes.size() + 1 << " classes (21 = NaN/Inf below), "
                                  << rows.size() << " rows, " << attempts << " rejected attempts, "
                                  << skipped << " skipped");
  CHECK(classes.size() + 1 >= 15);
}

// A host application with a context of its own runs a plan made in the primary context (on a
// stream of the plan's): the run goes to the plan's context and the thread's current context is
// the application's again when run returns (a run used to leave the plan's current, so the
// application's next CUDA call went to the wrong context, or another device).
TEST_CASE("a run leaves the calling thread's current context as it was") {
  const CUcontext primary = primary_context(0);
  Fixture f;
  if (!f.foreign.ok()) {
    MESSAGE("skipped: " << f.foreign.why_not());
    return;
  }
  for (bool reference : {false, true}) {
    CAPTURE(reference);
    const RunFn op = make_op(train_problem(), reference);  // made in the primary context
    f.b.fill_outputs();
    f.b.make_runnable();
    FJ_CU(cuCtxSetCurrent(f.foreign.context()));
    op(f.s, f.b.full());
    CUcontext now = nullptr;
    FJ_CU(cuCtxGetCurrent(&now));
    CHECK(now == f.foreign.context());
    FJ_CU(cuCtxSetCurrent(primary));
    f.s.synchronize();
    const auto y = f.b.y.download_bytes();  // it ran: y is no longer the fill pattern
    CHECK(std::count(y.begin(), y.end(), kPattern) < static_cast<std::ptrdiff_t>(y.size() / 2));
  }
}

TEST_CASE("NaN and Inf inputs run and propagate as PyTorch does (the float64 reference)") {
  primary_context(0);
  enum class Spread { row, column, all };
  struct Case {
    const char* line;
    bool in_w;  // the bad value goes into W (else x)
    std::int64_t row, k;
    float value;
    Spread spread;  // where y must be non-finite
  };
  // eval: a bad x row spoils that row of y only (the running stats are fixed); a bad W row n
  // spoils column n. train: a bad W row spoils column n's batch stats, so that column; a bad x
  // row enters every column's batch stats, so all of y.
  const Case cases[] = {
      {"256x96x64 bf16 eval", false, 5, 3, NAN, Spread::row},
      {"256x96x64 bf16 eval", false, 7, 10, INFINITY, Spread::row},
      {"256x96x64 fp32 eval", true, 9, 0, -INFINITY, Spread::column},
      {"256x96x64 bf16 train", true, 11, 4, NAN, Spread::column},
      {"256x96x64 fp16 train", true, 2, 1, INFINITY, Spread::column},
      {"256x96x64 fp32 train", false, 0, 0, NAN, Spread::all},
  };
  auto category = [](double v) { return std::isnan(v) ? 0 : std::isinf(v) ? (v > 0 ? 1 : 2) : 3; };
  for (const Case& cs : cases)
    for (bool reference : {false, true}) {
      CAPTURE(cs.line);
      CAPTURE(cs.in_w);
      CAPTURE(cs.value);
      CAPTURE(reference);
      const SweepCase c = parse_sweep_line(cs.line);
      const Problem& p = c.problem;
      CaseInputs in = make_case_inputs(c, 21);
      HostTensor& h = cs.in_w ? in.w : in.x;
      h.set(static_cast<std::size_t>(cs.row * (cs.in_w ? p.lda_w() : p.lda_x()) + cs.k), cs.value);
      DeviceCase dev(in);
      const Stream s;
      make_op(p, reference)(s, dev.tensors());
      s.synchronize();
      const CaseOutputs got = dev.download();
      const ReferenceOutputs ref =
          reference_forward(reference_inputs(in), reference_settings(p, in.num_batches_tracked));

      // Same class (NaN, +Inf, -Inf, finite) as the reference, element by element.
      auto same_classes = [&](const std::vector<double>& g, const std::vector<double>& r) {
        if (g.size() != r.size()) return false;
        for (std::size_t i = 0; i < g.size(); ++i)
          if (category(g[i]) != category(r[i])) return false;
        return true;
      };
      CHECK(same_classes(got.y, ref.y));
      CHECK(same_classes(got.running_mean, ref.running_mean));
      CHECK(same_classes(got.running_var, ref.running_var));
      if (p.mode == Mode::train) {
        CHECK(same_classes(got.save_mean, ref.save_mean));
        CHECK(same_classes(got.save_invstd, ref.save_invstd));
      }
      // Exactly the expected spread is non-finite, and the rest agrees with the reference.
      std::vector<double> g_fin, r_fin;
      bool spread_ok = true;
      for (std::int64_t m = 0; m < p.M; ++m)
        for (std::int64_t n = 0; n < p.N; ++n) {
          const auto i = static_cast<std::size_t>(m * p.N + n);
          const bool bad = cs.spread == Spread::all || (cs.spread == Spread::row && m == cs.row) ||
                           (cs.spread == Spread::column && n == cs.row);
          if (bad == std::isfinite(got.y[i])) spread_ok = false;
          if (std::isfinite(got.y[i]) && std::isfinite(ref.y[i])) {
            g_fin.push_back(got.y[i]);
            r_fin.push_back(ref.y[i]);
          }
        }
      CHECK(spread_ok);
      if (!r_fin.empty()) CHECK(relative_error(g_fin, r_fin) < sweep_threshold(p.dtype));
    }
}
