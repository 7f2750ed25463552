// Bad input is rejected with InvalidArgument naming the argument, before anything is enqueued:
// null, misaligned and unwanted pointers, M = 1 in train mode, leading dimensions that break the
// promised alignment, mismatched parameter dtypes. Both fusejit::Plan and the ReferenceOp (same
// Tensors contract). Outputs and running stats hold a byte pattern that must survive a rejected
// run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusejit/check/device_buffer.hpp"
#include "fusejit/check/sweep.hpp"
#include "fusejit/device/device.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/plan.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "gpu_required.hpp"

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

std::string rejected_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.argument();
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
  Tensors full() const {
    Tensors t;
    t.x = x.get();
    t.w = w.get();
    t.y = y.get();
    if (p.has_bias) t.bias = bias.get();
    if (p.has_scale) t.scale = scale.get();
    if (p.has_affine) t.gamma = gamma.get(), t.beta = beta.get();
    t.running_mean = rm.get();
    t.running_var = rv.get();
    if (p.mode == Mode::train) {
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
