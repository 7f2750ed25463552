// Variable batch sizes: one plan made for the largest M runs every smaller M (Plan::run with a
// row count) with the kernels it already has, for every dtype x mode and the M that change the
// schedule (2, 3, BM - 1, BM, BM + 1, 8 BM, 8 BM + 1); plans of other M in the same M class
// compile nothing; running statistics follow a loop whose M changes every step; a captured CUDA
// graph of a run with a row count replays correctly; and very large M (2^20 + 3, and M x N past
// 2^31) through one plan, checked column by column in float64.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/verify/verification.hpp"
#include "gpu_required.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;

namespace {

constexpr DType kDTypes[] = {DType::fp32, DType::tf32, DType::fp16, DType::bf16};
constexpr Mode kModes[] = {Mode::train, Mode::eval};

// The row counts that change what a run does for tiles of `bm` rows, up to `max_m`.
std::vector<std::int64_t> interesting_rows(std::int64_t bm, std::int64_t max_m, Mode mode) {
  std::set<std::int64_t> r{
      mode == Mode::train ? 2 : 1, 3, bm - 1, bm, bm + 1, 8 * bm, 8 * bm + 1, max_m - 1, max_m};
  std::vector<std::int64_t> out;
  for (const std::int64_t v : r)
    if (v >= (mode == Mode::train ? 2 : 1) && v <= max_m) out.push_back(v);
  return out;
}

SweepCase with_rows(SweepCase c, std::int64_t rows) {
  c.problem.M = rows;
  return c;
}

// Runs `rows` rows of a fresh case through `plan` (made for a larger M) and checks them.
void check_rows(const Plan& plan, const SweepCase& layer, std::int64_t rows, const Stream& s) {
  CAPTURE(rows);
  const SweepCase c = with_rows(layer, rows);
  const CaseInputs in = make_case_inputs(c);
  CAPTURE(in.seed);
  DeviceCase dev(in);
  plan.run(s, dev.tensors(), rows);
  s.synchronize();
  const ReferenceOutputs ref = reference_forward(
      reference_inputs(in), reference_settings(c.problem, in.num_batches_tracked));
  const CaseErrors e = compare(in, dev.download(), ref);
  std::string why;
  CHECK_MESSAGE(passes(e, sweep_threshold(c.problem.dtype), &why),
                fmt::format("{} rows of a plan for M = {}: {}", rows, plan.problem().M, why));
}

}  // namespace

TEST_CASE("one plan for the largest M runs every smaller M: every dtype x mode") {
  primary_context(0);
  const Stream s;
  for (const DType d : kDTypes)
    for (const Mode m : kModes)
      // Two families: one in the two-pass class (1500 rows: > 8 row tiles, so both apply paths
      // and the finalize run) and one in the single-pass class (M <= any tile height).
      for (const std::int64_t max_m : {std::int64_t{1500}, std::int64_t{60}}) {
        const SweepCase layer =
            parse_sweep_line(fmt::format("{}x200x136 {} {} momentum=0.3", max_m, name(d), name(m)));
        CAPTURE(layer.text());
        const Plan plan(layer.problem);
        for (const std::int64_t rows : interesting_rows(plan.config().bm, max_m, m))
          check_rows(plan, layer, rows, s);
      }
}

TEST_CASE("warpspec and split-K families run every smaller M too") {
  primary_context(0);
  const Stream s;
  std::vector<std::pair<std::string, std::string>> cases = {
      {"1500x192x512 bf16 train", "tiled.64x64x64.w2x2.s3.g8.k4"},
      {"1500x192x512 fp32 eval", "tiled.64x64x16.w2x1.s3.g8.k4"}};
  if (Device::current().cc() == 90) {
    cases.push_back({"1500x264x136 bf16 train", "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts"});
    cases.push_back({"1500x264x136 fp16 eval", "warpspec.128x128x64.c2.s6.g8.cl2.p1"});
    cases.push_back({"1500x264x136 bf16 train", "warpspec.128x128x64.c2.s5.g8.cl1.p1.pp"});
    cases.push_back({"1500x264x136 tf32 train", "warpspec.64x128x32.c1.s6.g8.cl1.p1"});
    // Unaligned rows: the copy takes the run's rows of x, the tensor maps follow them.
    cases.push_back({"1500x264x131 bf16 train ldy=265", "warpspec.128x128x64.c2.s6.g8.cl1.p1.pad"});
    cases.push_back({"1500x264x131 fp16 eval", "warpspec.128x128x64.c2.s6.g8.cl1.p1.pad"});
    cases.push_back({"1500x264x131 tf32 train", "warpspec.64x128x32.c1.s6.g8.cl1.p1.pad.rc"});
  }
  for (const auto& c : cases) {
    // Named, not structured bindings: doctest's CAPTURE is a lambda, which clang 14 (the
    // sanitizer builds) cannot give a structured binding.
    const std::string& line = c.first;
    const std::string& key = c.second;
    CAPTURE(line);
    CAPTURE(key);
    const SweepCase layer = parse_sweep_line(line);
    PlanOptions o;
    o.config = KernelConfig::parse(key);
    const Plan plan(layer.problem, o);
    for (const std::int64_t rows :
         interesting_rows(plan.config().bm, layer.problem.M, layer.problem.mode))
      check_rows(plan, layer, rows, s);
  }
}

TEST_CASE("plans for other M of the same M class load the kernel set already built") {
  primary_context(0);
  const SweepCase layer = parse_sweep_line("1000x136x200 bf16 train");
  Problem p = layer.problem;
  const Plan first(p);
  std::set<std::string> configs{first.config().key()};
  // 257..1024 is one M class (config/candidates.hpp): same config, so no compile.
  for (const std::int64_t m : {999, 1001, 1024, 512, 257, 300, 777}) {
    p.M = m;
    const Plan again(p);
    CAPTURE(m);
    CHECK(again.config().key() == first.config().key());
    CHECK(again.cache_hit());
    CHECK(again.compile_seconds() == 0.0);
  }
  // Exact-M kernels stay available and are compiled for their M.
  PlanOptions exact;
  exact.config = first.config();
  exact.config->exact_m = true;
  p.M = 1000;
  const Plan xm(p, exact);
  CHECK(xm.config().exact_m);
  const Stream s;
  check_rows(xm, layer, 1000, s);
  // ... and refuse another row count by name.
  const CaseInputs in = make_case_inputs(layer);
  DeviceCase dev(in);
  CHECK_THROWS_WITH_AS(xm.run(s, dev.tensors(), 999), doctest::Contains("rows"), InvalidArgument);
}

TEST_CASE("run(rows) rejects rows outside 1..M (train: 2..M) by name, writing nothing") {
  primary_context(0);
  const SweepCase layer = parse_sweep_line("300x64x64 fp32 train");
  const Plan plan(layer.problem);
  const CaseInputs in = make_case_inputs(layer);
  DeviceCase dev(in);
  const Stream s;
  for (const std::int64_t bad :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{-5}, std::int64_t{301}}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(plan.run(s, dev.tensors(), bad), doctest::Contains("rows"),
                         InvalidArgument);
  }
  s.synchronize();
  const CaseOutputs out = dev.download();
  CHECK(std::all_of(out.y.begin(), out.y.end(), [](double v) { return std::isnan(v); }));
}

TEST_CASE("running statistics follow a training loop whose M changes every step") {
  primary_context(0);
  for (const char* line : {"1200x96x80 bf16 train", "1200x96x80 fp32 train momentum=none",
                           "1200x96x80 fp16 train same"}) {
    CAPTURE(std::string(line));
    const SweepCase layer = parse_sweep_line(line);
    const Problem& p = layer.problem;
    const Plan plan(p);
    CaseInputs in = make_case_inputs(layer);
    in.num_batches_tracked = 0;
    DeviceCase dev(in);
    ReferenceInputs ref_in = reference_inputs(in);
    std::int64_t count = 0;
    const Stream s;
    const double thr = sweep_threshold(p.dtype);
    const std::int64_t steps[] = {1200, 7, 130, 1199, 64, 1025, 2, 600};
    for (std::size_t i = 0; i < std::size(steps); ++i) {
      const std::int64_t rows = steps[i];
      CAPTURE(rows);
      const SweepCase c = with_rows(layer, rows);
      const HostTensor x = make_x(c, in.seed + 77 + i);
      dev.upload_x_rows(x, rows);
      ref_in.M = rows;
      ref_in.x = x.packed(static_cast<std::size_t>(rows), static_cast<std::size_t>(p.K),
                          static_cast<std::size_t>(p.lda_x()));
      plan.run(s, dev.tensors(), rows);
      s.synchronize();
      const ReferenceOutputs ref = reference_forward(ref_in, reference_settings(p, count));
      const CaseOutputs got = dev.download(rows);
      CHECK(relative_error(got.y, ref.y) < thr);
      CHECK(relative_error(got.save_mean, ref.save_mean) < thr);
      CHECK(relative_error(got.running_mean, ref.running_mean) < thr);
      CHECK(relative_error(got.running_var, ref.running_var) < thr);
      CHECK(got.num_batches_tracked == static_cast<std::int64_t>(i) + 1);
      ref_in.running_mean = ref.running_mean;
      ref_in.running_var = ref.running_var;
      count = ref.num_batches_tracked;
    }
  }
}

TEST_CASE("a CUDA graph captured from run(rows) replays with the captured row count") {
  primary_context(0);
  const SweepCase layer = parse_sweep_line("900x128x96 bf16 train");
  const Plan plan(layer.problem);
  const std::int64_t rows = 333;
  const SweepCase c = with_rows(layer, rows);
  const CaseInputs in = make_case_inputs(c);
  // Buffers for the plan's 900 rows; the graph runs 333 of them.
  CaseInputs big = make_case_inputs(layer);
  big.w = in.w, big.bias = in.bias, big.scale = in.scale, big.gamma = in.gamma, big.beta = in.beta;
  big.running_mean = in.running_mean, big.running_var = in.running_var;
  big.num_batches_tracked = in.num_batches_tracked;
  DeviceCase dev(big);
  dev.upload_x_rows(in.x, rows);
  const Stream s;
  CUgraph graph = nullptr;
  FJ_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  plan.run(s, dev.tensors(), rows);
  FJ_CU(cuStreamEndCapture(s, &graph));
  CUgraphExec exec = nullptr;
  FJ_CU(cuGraphInstantiate(&exec, graph, 0));
  FJ_CU(cuGraphLaunch(exec, s));
  s.synchronize();
  const ReferenceOutputs ref = reference_forward(
      reference_inputs(in), reference_settings(c.problem, in.num_batches_tracked));
  const CaseErrors e = compare(in, dev.download(rows), ref);
  std::string why;
  CHECK_MESSAGE(passes(e, sweep_threshold(DType::bf16), &why), why);
  FJ_CU(cuGraphExecDestroy(exec));
  FJ_CU(cuGraphDestroy(graph));
}

namespace {

// float64 y, batch mean and running stats of a few columns over all M rows (bf16 x, W; fp32
// parameters): the full reference would take minutes at these sizes.
struct ColumnCheck {
  double y = 0, running_mean = 0, running_var = 0;
};

ColumnCheck check_columns(const Problem& p, std::int64_t rows, const HostTensor& x,
                          const HostTensor& w, const std::vector<float>& bias,
                          const std::vector<float>& scale, const std::vector<float>& rm0,
                          const std::vector<float>& rv0, const DeviceBuffer& y_dev,
                          const DeviceBuffer& rm_dev, const DeviceBuffer& rv_dev,
                          const std::vector<std::int64_t>& cols) {
  const auto K = static_cast<std::size_t>(p.K), N = static_cast<std::size_t>(p.N);
  std::vector<float> xf(static_cast<std::size_t>(rows) * K);
  for (std::size_t i = 0; i < xf.size(); ++i) xf[i] = x.get(i);
  double ey = 0, ry = 0, erm = 0, rrm = 0, erv = 0, rrv = 0;
  const std::vector<float> rm = rm_dev.download_as<float>(N), rv = rv_dev.download_as<float>(N);
  for (const std::int64_t col : cols) {
    const auto n = static_cast<std::size_t>(col);
    std::vector<double> z(static_cast<std::size_t>(rows));
    double mean = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      double a = 0;
      const float* xr = &xf[static_cast<std::size_t>(r) * K];
      for (std::size_t k = 0; k < K; ++k) a += double(xr[k]) * double(w.get(n * K + k));
      z[static_cast<std::size_t>(r)] = (a + bias[n]) * scale[n];
      mean += z[static_cast<std::size_t>(r)];
    }
    mean /= double(rows);
    double var = 0;
    for (const double v : z) var += (v - mean) * (v - mean);
    const double unbiased = var / double(rows - 1);
    var /= double(rows);
    const double invstd = 1.0 / std::sqrt(var + p.eps);
    // One y element per 4099 rows of this column (a strided device read each).
    for (std::int64_t r = 0; r < rows; r += 4099) {
      std::uint16_t bits = 0;
      y_dev.download(&bits, 2, static_cast<std::size_t>(r * p.lda_y() + col) * 2);
      HostTensor one(DType::bf16, 1);
      std::memcpy(one.data(), &bits, 2);
      const double want = (z[static_cast<std::size_t>(r)] - mean) * invstd;  // no affine
      ey += (one.get(0) - want) * (one.get(0) - want);
      ry += want * want;
    }
    const double m = *p.momentum;
    const double want_rm = (1 - m) * rm0[n] + m * mean, want_rv = (1 - m) * rv0[n] + m * unbiased;
    erm += (rm[n] - want_rm) * (rm[n] - want_rm), rrm += want_rm * want_rm;
    erv += (rv[n] - want_rv) * (rv[n] - want_rv), rrv += want_rv * want_rv;
  }
  return {std::sqrt(ey / ry), std::sqrt(erm / rrm), std::sqrt(erv / rrv)};
}

}  // namespace

TEST_CASE("one plan for M x N past 2^31 runs M = 2^21 + 5 and M = 2^20 + 3 (64-bit offsets)") {
  primary_context(0);
  Problem p;
  p.M = (std::int64_t{1} << 21) + 5;  // M x N = 2^31 + 5 x 1024
  p.N = 1024, p.K = 64;
  p.dtype = DType::bf16;
  p.mode = Mode::train;
  p.has_affine = false;
  const Plan plan(p);
  const auto N = static_cast<std::size_t>(p.N), K = static_cast<std::size_t>(p.K);
  std::mt19937_64 rng(0x5eed + static_cast<std::uint64_t>(std::random_device{}()));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uni(-0.125f, 0.125f);
  HostTensor x(DType::bf16, static_cast<std::size_t>(p.M) * K), w(DType::bf16, N * K);
  for (std::size_t i = 0; i < x.size(); ++i) x.set(i, normal(rng));
  for (std::size_t i = 0; i < w.size(); ++i) w.set(i, uni(rng));
  std::vector<float> bias(N), scale(N), rm(N), rv(N);
  for (std::size_t n = 0; n < N; ++n)
    bias[n] = uni(rng), scale[n] = 1 + normal(rng) * 0.25f, rm[n] = normal(rng) * 0.1f,
    rv[n] = 1 + uni(rng);
  DeviceBuffer xd(x.bytes()), wd(w.bytes()), yd(static_cast<std::size_t>(p.M) * N * 2), bd(N * 4),
      sd(N * 4), rmd(N * 4), rvd(N * 4);
  xd.upload(x.data(), x.bytes());
  wd.upload(w.data(), w.bytes());
  bd.upload(bias), sd.upload(scale);
  Tensors t;
  t.x = xd.get(), t.w = wd.get(), t.y = yd.get(), t.bias = bd.get(), t.scale = sd.get();
  t.running_mean = rmd.as<float>(), t.running_var = rvd.as<float>();
  const std::vector<std::int64_t> cols{0, 1, 511, 1000, 1023};
  const Stream s;
  for (const std::int64_t rows : {p.M, (std::int64_t{1} << 20) + 3}) {
    CAPTURE(rows);
    rmd.upload(rm), rvd.upload(rv);
    yd.fill_words(0x7fc07fc0u);  // bf16 NaNs
    plan.run(s, t, rows);
    s.synchronize();
    const ColumnCheck e = check_columns(p, rows, x, w, bias, scale, rm, rv, yd, rmd, rvd, cols);
    MESSAGE(fmt::format("rows {}: y {:.2e}, running mean {:.2e}, running var {:.2e}", rows, e.y,
                        e.running_mean, e.running_var));
    CHECK(e.y < 1e-2);
    CHECK(e.running_mean < 1e-2);
    CHECK(e.running_var < 1e-2);
    // The last row of this run was written; the first row after it (when any) was not.
    std::uint16_t last = 0;
    yd.download(&last, 2, static_cast<std::size_t>((rows - 1) * p.lda_y()) * 2);
    CHECK(last != 0x7fc0);
    if (rows < p.M) {
      std::uint16_t after = 0;
      yd.download(&after, 2, static_cast<std::size_t>(rows * p.lda_y()) * 2);
      CHECK(after == 0x7fc0);
    }
  }
}
