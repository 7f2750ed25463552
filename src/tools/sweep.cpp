#include "tools/sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <thread>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/util/durable_file.hpp"

namespace fusejit {

namespace {

// The case generator's flags for the i-th case: every choice cycles with a different period,
// so the cross covers the combinations without taking their product.
SweepCase builtin_case(Shape s, DType dtype, Mode mode, int i) {
  SweepCase c;
  Problem& p = c.problem;
  p.M = s.M, p.N = s.N, p.K = s.K;
  p.dtype = dtype;
  p.mode = mode;
  const auto eb = static_cast<std::int64_t>(storage_bytes(dtype));
  p.param_dtype = eb == 2 && i % 4 == 1 ? storage_type(dtype) : DType::fp32;
  p.has_bias = i % 3 != 1;
  p.has_scale = i % 4 != 2;
  p.has_affine = i % 5 != 3;
  if (i % 6 == 5)
    p.momentum = std::nullopt;
  else if (i % 6 == 2)
    p.momentum = 0.3;
  else if (i % 11 == 10)
    p.momentum = 1.0;
  if (i % 7 == 6) p.eps = 1e-3;
  const std::int64_t per16 = 16 / eb;  // elements per 16 bytes
  auto round_up = [&](std::int64_t v) { return (v + per16 - 1) / per16 * per16; };
  auto odd_above = [](std::int64_t v) { return v + (v % 2 ? 2 : 1); };
  if (i % 5 == 4) {
    // Odd strides: rows are only element-aligned.
    p.ldx = odd_above(p.K);
    p.ldw = odd_above(p.K) + 2;
    p.ldy = odd_above(p.N);
  } else if (i % 8 == 3) {
    // Padded but still 16-byte aligned rows.
    p.ldx = round_up(p.K) + per16;
    p.ldw = round_up(p.K) + 2 * per16;
    p.ldy = round_up(p.N) + per16;
  }
  p.alignment = stride_alignment(p);
  if (i % 13 == 12) p.alignment = static_cast<int>(eb);  // promise no more than the element size
  c.distribution = i % 2 ? Distribution::non_centred : Distribution::centred;
  c.track_running_stats = !(mode == Mode::train && i % 9 == 7);
  p.validate();
  return c;
}

class SweepOp {
 public:
  virtual ~SweepOp() = default;
  virtual void run(CUstream stream, const Tensors& t) const = 0;
  virtual std::string describe() const = 0;
  // The ways its tf32 math may read x and W (Tf32Operands): a case passes against any of them.
  virtual std::span<const Tf32Operands> tf32_operands() const { return kFusedTf32Readings; }
};

class PlanOp final : public SweepOp {
 public:
  PlanOp(const Problem& p, const PlanOptions& o) : plan_(p, o) {}
  void run(CUstream stream, const Tensors& t) const override { plan_.run(stream, t); }
  std::string describe() const override { return plan_.config().key(); }
  // A plan whose dispatch chose the reference op reads tf32 as cuBLASLt does (ReferenceSweepOp).
  std::span<const Tf32Operands> tf32_operands() const override {
    if (plan_.uses_reference()) return kCublasLtTf32Readings;
    return kFusedTf32Readings;
  }

 private:
  Plan plan_;
};

class ReferenceSweepOp final : public SweepOp {
 public:
  ReferenceSweepOp(const Problem& p, const ReferenceOpOptions& o) : op_(p, o) {}
  void run(CUstream stream, const Tensors& t) const override { op_.run(stream, t); }
  std::string describe() const override { return op_.description(); }
  std::span<const Tf32Operands> tf32_operands() const override { return kCublasLtTf32Readings; }

 private:
  ReferenceOp op_;
};

struct Built {
  std::unique_ptr<SweepOp> op;
  std::string skip;   // the forced variant cannot run this case
  std::string error;  // building failed
};

Built build(const SweepCase& c, const SweepOptions& o) {
  Built b;
  try {
    if (o.implementation == Implementation::plan) {
      PlanOptions po;
      po.device = o.device;
      po.variant = o.variant;
      po.config = o.config;
      po.cache_dir = o.cache_dir;
      b.op = std::make_unique<PlanOp>(c.problem, po);
    } else {
      ReferenceOpOptions ro;
      ro.device = o.device;
      ro.cache_dir = o.cache_dir;
      b.op = std::make_unique<ReferenceSweepOp>(c.problem, ro);
    }
  } catch (const InvalidArgument& e) {
    const bool forced =
        (o.variant && e.argument() == "variant") || (o.config && e.argument() == "config");
    (forced ? b.skip : b.error) = e.what();
  } catch (const std::exception& e) {
    b.error = e.what();
  }
  return b;
}

CaseResult run_built(const SweepCase& c, const Built& b, std::uint64_t seed) {
  CaseResult r;
  r.c = c;
  r.seed = seed;
  r.threshold = sweep_threshold(c.problem.dtype);
  if (!b.skip.empty()) {
    r.status = CaseResult::Status::skipped;
    r.message = b.skip;
    return r;
  }
  if (!b.op) {
    r.status = CaseResult::Status::failed;
    r.message = b.error;
    return r;
  }
  r.config = b.op->describe();
  try {
    const CaseInputs in = make_case_inputs(c, seed);
    DeviceCase dev(in);
    const Stream stream;
    b.op->run(stream, dev.tensors());
    stream.synchronize();
    const CaseOutputs got = dev.download();
    const ReadingErrors judged =
        compare_readings(in, got, reference_settings(c.problem, in.num_batches_tracked),
                         b.op->tf32_operands(), r.threshold, &r.message);
    r.errors = judged.errors;
    r.measured = true;
    r.status = judged.passed ? CaseResult::Status::passed : CaseResult::Status::failed;
  } catch (const std::exception& e) {
    r.status = CaseResult::Status::failed;
    r.message = e.what();
  }
  return r;
}

}  // namespace

std::vector<SweepCase> read_sweep_file(const std::string& path) {
  std::istringstream f(read_text_input(path, "sweep"));
  std::vector<SweepCase> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (is_blank_sweep_line(line)) continue;
    try {
      out.push_back(parse_sweep_line(line));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("sweep", fmt::format("{}:{}: {}", path, n, e.what()));
    }
  }
  if (out.empty()) throw InvalidArgument("sweep", fmt::format("'{}' holds no cases", path));
  return out;
}

std::vector<SweepCase> builtin_sweep(bool full, DType dtype, Mode mode) {
  static constexpr std::int64_t kM[] = {2, 3, 17, 64, 127, 128, 129, 1000};
  static constexpr std::int64_t kN[] = {1, 7, 8, 64, 200, 512};
  static constexpr std::int64_t kK[] = {1, 5, 8, 64, 1000};
  std::vector<Shape> shapes;
  // Every M, N and K value at least once...
  for (int i = 0; i < 8; ++i) shapes.push_back({kM[i], kN[(5 * i + 1) % 6], kK[(3 * i + 2) % 5]});
  // ...then a fixed pseudo-random cross. mt19937's output is fixed by the standard, so the list
  // is the same on every platform; it differs per (dtype, mode) to cover more pairs overall.
  std::mt19937 pick(0x5EED0u + 16u * static_cast<unsigned>(dtype) + static_cast<unsigned>(mode));
  for (int i = 0; i < 36; ++i) shapes.push_back({kM[pick() % 8], kN[pick() % 6], kK[pick() % 5]});
  shapes.push_back({128, 512, 1024});  // KernelBench's small shape
  // Train's second pass both ways for every row-tile height (64..256): at most 8 row tiles
  // (fj_apply merges the partials itself) and at least 9 (a separate fj_finalize).
  shapes.push_back({300, 200, 64});
  shapes.push_back({3000, 72, 64});
  if (mode == Mode::eval) {
    shapes.push_back({1, 64, 64});  // one row is fine without batch statistics
    shapes.push_back({1, 7, 1000});
  }
  if (full) {
    for (std::int64_t m : {1024, 4096})
      for (auto [n, k] :
           {std::pair<std::int64_t, std::int64_t>{4096, 4096}, {512, 4096}, {4096, 1000}})
        shapes.push_back({m, n, k});
    shapes.push_back({1024, 8192, 8192});  // KernelBench's first shape
    static constexpr std::int64_t kMx[] = {2, 3, 17, 64, 127, 128, 129, 1000, 1024, 4096};
    static constexpr std::int64_t kNx[] = {1, 7, 8, 64, 200, 512, 4096};
    static constexpr std::int64_t kKx[] = {1, 5, 8, 64, 1000, 4096};
    // Bounded so the float64 reference stays within seconds.
    for (int added = 0; added < 24;) {
      const Shape s{kMx[pick() % 10], kNx[pick() % 7], kKx[pick() % 6]};
      if (s.M * s.N * s.K > (std::int64_t{1} << 32)) continue;
      shapes.push_back(s);
      ++added;
    }
  }
  std::vector<SweepCase> out;
  out.reserve(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i)
    out.push_back(builtin_case(shapes[i], dtype, mode, static_cast<int>(i)));
  return out;
}

std::vector<SweepCase> sweep_cases(const std::string& which, const std::vector<DType>& dtypes,
                                   const std::vector<Mode>& modes) {
  std::vector<SweepCase> out;
  if (which == "quick" || which == "full") {
    for (DType d : dtypes)
      for (Mode m : modes) {
        auto cs = builtin_sweep(which == "full", d, m);
        out.insert(out.end(), cs.begin(), cs.end());
      }
    return out;
  }
  for (auto& c : read_sweep_file(which)) {
    const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), c.problem.dtype) != dtypes.end();
    const bool mode_ok = std::find(modes.begin(), modes.end(), c.problem.mode) != modes.end();
    if (dtype_ok && mode_ok) out.push_back(std::move(c));
  }
  return out;
}
// ---------------------------------------------------------------------------------------------
// Running

std::string_view name(Implementation i) {
  return i == Implementation::plan ? "fused" : "reference";
}

std::string format_result(const CaseResult& r) {
  const char* status = r.status == CaseResult::Status::passed    ? "PASS"
                       : r.status == CaseResult::Status::skipped ? "SKIP"
                                                                 : "FAIL";
  std::string s = fmt::format("{} {}", status, r.c.text());
  if (r.status == CaseResult::Status::skipped) return s + " -- " + r.message;
  if (!r.config.empty()) s += fmt::format(" [{}]", r.config);
  const CaseErrors& e = r.errors;
  if (r.measured) {
    const bool train = r.c.problem.mode == Mode::train;
    s += fmt::format(" y={:.2e}", e.y);
    if (!train || r.c.track_running_stats)
      s += fmt::format(" rm={:.2e} rv={:.2e}", e.running_mean, e.running_var);
    if (train) s += fmt::format(" save_mean={:.2e} save_invstd={:.2e}", e.save_mean, e.save_invstd);
    s += fmt::format(" (threshold {:.0e})", r.threshold);
  }
  s += fmt::format(" seed={:#x}", r.seed);
  if (!r.message.empty()) s += " -- " + r.message;
  return s;
}

CaseResult run_case(const SweepCase& c, const SweepOptions& options) {
  const std::uint64_t seed = options.seed ? *options.seed : fresh_seed();
  primary_context(options.device);
  return run_built(c, build(c, options), seed);
}

SweepReport run_sweep(const std::vector<SweepCase>& cases, const SweepOptions& o) {
  SweepReport report;
  primary_context(o.device);
  const unsigned workers =
      o.build_threads ? o.build_threads : std::max(1u, std::thread::hardware_concurrency());
  // Codegen and NVRTC dominate a sweep's time and are thread-safe: build ops ahead on worker
  // threads while the GPU runs and the float64 references of earlier cases proceed here.
  std::vector<std::future<Built>> pending(cases.size());
  std::size_t next = 0;
  auto start = [&](std::size_t i) {
    pending[i] = std::async(std::launch::async, [&c = cases[i], &o] { return build(c, o); });
  };
  for (; next < cases.size() && next < workers; ++next) start(next);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Built b = pending[i].get();
    if (next < cases.size()) start(next++);
    const std::uint64_t seed = o.seed ? *o.seed + i : fresh_seed();
    CaseResult r = run_built(cases[i], b, seed);
    SweepSummary& s = report.summary;
    ++s.cases;
    if (r.status == CaseResult::Status::passed) ++s.passed;
    if (r.status == CaseResult::Status::failed) ++s.failed;
    if (r.status == CaseResult::Status::skipped) ++s.skipped;
    if (r.status != CaseResult::Status::skipped) {
      // A case that failed without figures (an exception) counts as infinitely wrong.
      double& w = s.worst[cases[i].problem.dtype];
      w = std::max(w, r.measured && !r.errors.non_finite ? r.errors.worst() : INFINITY);
    }
    if (o.on_result) o.on_result(r);
    report.results.push_back(std::move(r));
  }
  return report;
}

}  // namespace fusejit
