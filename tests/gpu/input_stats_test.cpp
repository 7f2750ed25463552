// KernelConfig::input_stats (train): the column statistics from x's mean and covariance before
// the GEMM (kernels/input_stats.cuh). What must hold:
//  - y, saved, the running and saved stats pass float64 by the sweep's rule, on every dtype and
//    variant, with tails in M and K, K = 1, momentum=None, no bias / no affine, strided x,
//    columns whose mean is ~1000 times their spread and columns of near-zero variance; and the
//    statistics GEMM really was skipped (the partials region, which only it writes, keeps its
//    poison);
//  - a column whose quadratic form cancels (two nearly equal features and a weight row that
//    takes their difference) is flagged, and its statistics then come from a itself, inside
//    the kernel (the statistics GEMM still does not run): float64's results, with one flagged
//    column and with 130 (three of the fallback's rounds);
//  - in tf32 the statistics are those of the values the GEMM multiplies (rounded to tf32 as its
//    kernel takes them, ties included): recompute's twin agrees on large means, on operands
//    that all sit on tf32 ties, and on unrounded cancelling columns; and each GEMM rounds as
//    its kTf32Rounding says;
//  - a refused cooperative launch gives recompute's bits (its statistics GEMM ran);
//  - runs of fewer rows than the plan's, and a captured run replayed with momentum=None.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/input_stats.h"
#include "fusejit/device.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/util/fault.hpp"
#include "fusejit/verify/verification.hpp"
#include "gpu_required.hpp"
#include "test_graph.hpp"
#include "test_hopper.hpp"
#include "test_inputs.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;
using fusejit::test::first_different_output;
using fusejit::test::make_x_large_mean;
using fusejit::test::on_hopper;
using fusejit::test::replay_captured;

namespace {

KernelConfig recompute_twin(KernelConfig c) {
  c.input_stats = false;
  return c;
}

struct Outcome {
  CaseOutputs out;
  bool gemm_statistics = false;  // the statistics GEMM wrote partials (their poison is gone)
  unsigned flag = 0;             // fj_input_stats' flag (input_stats plans)
  unsigned flagged = 0;          // how many columns it flagged
  // Its 16-row slabs multiplied exactly in x's 16-bit type, and in three bf16 parts.
  unsigned exact_slabs = 0, split_slabs = 0;
};

// Which of fj_input_stats' products a run took (its slab counts).
enum class Products { any, exact, split, both };

// `rows` rows of `in` through `plan` on a poisoned caller workspace.
Outcome run_rows(const Plan& plan, const CaseInputs& in, std::int64_t rows) {
  const fusejit::test::PoisonedRun r = fusejit::test::run_poisoned(plan, in, rows, true);
  const WorkspaceLayout layout = workspace_layout(plan.problem(), plan.config());
  REQUIRE(layout.partials_bytes > 0);
  Outcome o;
  o.out = r.out;
  o.gemm_statistics = r.written(layout.partials_offset, layout.partials_bytes);
  if (layout.xstats_bytes > 0) {
    const auto words = r.region<unsigned>(layout.xstats_offset, 4 * sizeof(unsigned));
    o.flag = words[0];
    o.exact_slabs = words[1];
    o.split_slabs = words[2];
    o.flagged = words[3];
  }
  return o;
}

void check_against_float64(const CaseInputs& in, const CaseOutputs& got, std::int64_t rows) {
  std::string why;
  CHECK_MESSAGE(fusejit::test::rows_pass_float64(in, got, rows, &why), why);
}

// A run whose statistics came from x: no statistics GEMM, no flag, float64's results, every
// slab counted once, on the products `expect` names.
void check_from_input(const Plan& plan, const CaseInputs& in, std::int64_t rows,
                      Products expect = Products::any) {
  const Outcome o = run_rows(plan, in, rows);
  CHECK(o.flag == 0u);
  CHECK(o.flagged == 0u);
  CHECK_MESSAGE(!o.gemm_statistics, "the statistics GEMM ran");
  check_against_float64(in, o.out, rows);
  CAPTURE(o.exact_slabs);
  CAPTURE(o.split_slabs);
  CHECK(o.exact_slabs + o.split_slabs == static_cast<unsigned>((rows + 15) / 16));
  if (expect == Products::exact) CHECK(o.split_slabs == 0u);
  if (expect == Products::split) CHECK(o.exact_slabs == 0u);
  if (expect == Products::both) CHECK((o.exact_slabs > 0u && o.split_slabs > 0u));
}

struct Keyed {
  const char* dtype;
  const char* key;
  bool hopper;  // warpspec: runs on sm_90 only
};
// Two consumers with TMA stores, a cluster of two, tf32, 3xTF32, and the tiled variant in
// strict fp32 and bf16.
constexpr Keyed kConfigs[] = {
    {"bf16", "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv", true},
    {"fp16", "warpspec.128x128x64.c2.s5.g8.cl2.p1.rc.cv", true},
    {"tf32", "warpspec.128x128x32.c2.s6.g8.cl1.p1.rc.cv", true},
    {"tf32x3", "warpspec.128x128x32.c2.s3.g8.cl1.p1.rc.cv", true},
    {"fp32", "tiled.128x128x32.w2x4.s3.g8.rc.cv", false},
    {"bf16", "tiled.128x128x32.w2x4.s3.g8.rc.cv", false},
};

// The bf16 config of the cases that take one: warpspec on Hopper, tiled elsewhere.
KernelConfig this_gpus_config() {
  return KernelConfig::parse(on_hopper() ? "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv"
                                         : "tiled.128x128x32.w2x4.s3.g8.rc.cv");
}

bool runs_here(const Keyed& k) {
  return !k.hopper || on_hopper();
}

// Every finite element of `t` (fp32 storage) moved onto the tie between its two nearest tf32
// values: its tf32 rounding plus half a tf32 step, where the tie rules part.
void place_on_tf32_ties(HostTensor& t) {
  for (std::size_t i = 0; i < t.size(); ++i) {
    const float v = t.get(i);
    if (!std::isfinite(v)) continue;
    std::uint32_t bits;
    const float r = round_to_tf32(v);
    std::memcpy(&bits, &r, 4);
    bits |= 0x1000u;
    float tie;
    std::memcpy(&tie, &bits, 4);
    t.set(i, tie);
  }
}

// Feature 1 = feature 0 + `noise` N(0, 1), and W's rows 7, 8, ... (`count` of them) =
// (1 + n / 128) (e0 - e1): those columns of a have almost none of the variance their weights
// and features suggest (a cancellation factor above 1e5 at noise 5e-3, past every dtype's
// limit), and fj_input_stats flags them. Their scale is 1, so that z's variance is a's (a
// random scale made some of them far smaller than eps). `tf32_values`: both features rounded
// to tf32.
void make_cancelling_columns(CaseInputs& in, int count, bool tf32_values, double noise) {
  const Problem& p = in.c.problem;
  std::mt19937_64 rng(in.seed + 1);
  std::normal_distribution<double> normal;
  const auto value = [&](float v) { return tf32_values ? round_to_tf32(v) : v; };
  const std::int64_t ldx = p.lda_x(), ldw = p.lda_w();
  for (std::int64_t m = 0; m < p.M; ++m) {
    const float x0 = value(in.x.get(static_cast<std::size_t>(m * ldx)));
    in.x.set(static_cast<std::size_t>(m * ldx), x0);
    in.x.set(static_cast<std::size_t>(m * ldx + 1),
             value(x0 + static_cast<float>(noise * normal(rng))));
  }
  for (std::int64_t n = 7; n < 7 + count; ++n) {
    if (in.scale.size() > 0) in.scale.set(static_cast<std::size_t>(n), 1.f);
    const float f = 1.f + static_cast<float>(n) / 128.f;
    for (std::int64_t kk = 0; kk < p.K; ++kk)
      in.w.set(static_cast<std::size_t>(n * ldw + kk), kk == 0 ? f : (kk == 1 ? -f : 0.f));
  }
}

}  // namespace

TEST_CASE("input_stats: statistics from x pass float64 and skip the statistics GEMM") {
  const Device dev = Device::current();
  for (const Keyed& k : kConfigs) {
    if (!runs_here(k)) continue;
    const bool four_byte =
        std::string(k.dtype).starts_with("tf32") || k.dtype == std::string("fp32");
    // K = 64 and a K tail (K = 40: whole 16-byte rows in every dtype); momentum=None; no bias
    // and no affine.
    for (const char* tail : {"", " momentum=none nobias noaffine"}) {
      for (const int kdim : {64, four_byte ? 36 : 40}) {
        // 40000 rows: 2500 slabs of 16 rows, so at one CTA of 8 warps per SM every warp adds
        // two or more.
        const std::string line = fmt::format("40000x328x{} {} train{}", kdim, k.dtype, tail);
        CAPTURE(line);
        const std::string key = k.key;
        CAPTURE(key);
        const SweepCase c = parse_sweep_line(line);
        const KernelConfig cv = KernelConfig::parse(k.key);
        REQUIRE_MESSAGE(cv.valid_for(c.problem, dev), cv.why_invalid(c.problem, dev));
        const CaseInputs in = make_case_inputs(c);
        CAPTURE(in.seed);
        // x ~ N(0, 1): no shift, so every 16-bit slab is exact; fp32 x is always split.
        check_from_input(fusejit::test::forced_plan(c.problem, cv, false), in, c.problem.M,
                         four_byte ? Products::split : Products::exact);
      }
    }
  }
}

TEST_CASE("input_stats: adversarial inputs: large means, K = 1, near-zero variance, strided x") {
  const Device dev = Device::current();
  const KernelConfig cv = this_gpus_config();
  // x ~ 1000 + N(0, 1): every column's mean ~1000 times its spread. The statistics centre x on
  // its first rows' means before squaring, so nothing cancels; y is compared with float64 like
  // the others.
  {
    const SweepCase c = parse_sweep_line("5000x256x64 bf16 train ldx=72");
    REQUIRE(cv.valid_for(c.problem, dev));
    CaseInputs in = make_case_inputs(c);
    make_x_large_mean(in);
    // Shifted by ~1000, whose bf16 neighbours lie 4 apart: every d is a small bf16 value.
    check_from_input(fusejit::test::forced_plan(c.problem, cv, false), in, c.problem.M,
                     Products::exact);
  }
  // The same with an entry near zero in every seventh column, past the first 64 rows and each in
  // its own row (in shared rows they would correlate the columns, whose quadratic forms then
  // cancel and rightly raise the flag): the shift (~1000, from the first rows) leaves each a d
  // that needs more bits than a 16-bit value has, so the slabs holding them take the three-part
  // products and the others the single exact one, into the same sums.
  {
    const SweepCase c = parse_sweep_line("5000x256x64 bf16 train");
    CaseInputs in = make_case_inputs(c);
    make_x_large_mean(in);
    for (std::int64_t kk = 0; kk < c.problem.K; kk += 7)
      in.x.set(static_cast<std::size_t>((100 + 37 * kk) * c.problem.lda_x() + kk),
               1e-3f * static_cast<float>(kk + 1));
    check_from_input(fusejit::test::forced_plan(c.problem, cv, false), in, c.problem.M,
                     Products::both);
  }
  // Columns of near-zero variance: W's first rows scaled down by 1e-4 (var_a by 1e-8): eps
  // then dominates their normalization, and their statistics must still be right.
  {
    const SweepCase c = parse_sweep_line("2000x256x64 bf16 train");
    CaseInputs in = make_case_inputs(c);
    for (std::int64_t n = 0; n < 16; ++n)
      for (std::int64_t kk = 0; kk < c.problem.K; ++kk) {
        const auto i = static_cast<std::size_t>(n * c.problem.lda_w() + kk);
        in.w.set(i, in.w.get(i) * 1e-4f);
      }
    check_from_input(fusejit::test::forced_plan(c.problem, cv, false), in, c.problem.M);
  }
  // K = 1 (a 16-bit row of 2 bytes: the tiled variant, or fp32 whose 4-byte rows TMA refuses
  // too): S is one number.
  {
    const SweepCase c = parse_sweep_line("2000x130x1 fp32 train");
    const KernelConfig tiled = KernelConfig::parse("tiled.128x128x32.w2x4.s3.g8.rc.cv");
    REQUIRE_MESSAGE(tiled.valid_for(c.problem, dev), tiled.why_invalid(c.problem, dev));
    check_from_input(fusejit::test::forced_plan(c.problem, tiled, false), make_case_inputs(c),
                     c.problem.M);
  }
}

TEST_CASE("input_stats: columns that cancel take their statistics from a itself") {
  const Device dev = Device::current();
  for (const Keyed& k : kConfigs) {
    if (!runs_here(k)) continue;
    // One flagged column, and 130: three rounds of the fallback's 64 columns (a grid barrier
    // between rounds, the last one partly empty).
    for (const int cancelling : {1, 130}) {
      const std::string line = fmt::format("3000x200x64 {} train", k.dtype);
      CAPTURE(line);
      const std::string key = k.key;
      CAPTURE(key);
      CAPTURE(cancelling);
      const SweepCase c = parse_sweep_line(line);
      const KernelConfig cv = KernelConfig::parse(k.key);
      REQUIRE(cv.valid_for(c.problem, dev));
      // For fp32 storage both features are values of tf32, so that every dtype's GEMM forms
      // those columns of a exactly (each product exact, one rounding of their difference) and
      // float64's reference multiplies the same values however the GEMM breaks ties. The tf32
      // case below runs unrounded features against the GEMM's own statistics.
      // The noise 5e-3: at 1e-3 16-bit storage rounded most of it away, and in every dtype the
      // columns' variance was below eps, which then set their normalization.
      CaseInputs in = make_case_inputs(c);
      make_cancelling_columns(in, cancelling, storage_bytes(c.problem.dtype) == 4, 5e-3);
      const Outcome o = run_rows(fusejit::test::forced_plan(c.problem, cv, false), in, c.problem.M);
      CHECK(o.flag != 0u);
      CHECK(o.flagged == static_cast<unsigned>(cancelling));
      CHECK_MESSAGE(!o.gemm_statistics, "the statistics GEMM ran");
      check_against_float64(in, o.out, c.problem.M);
      // The case's premise: the flagged columns' variance is above eps, so that their
      // normalization tests the fallback's variances and not only its means.
      const double eps = c.problem.eps;
      double least_var = INFINITY;
      for (int n = 7; n < 7 + cancelling; ++n) {
        const double s = o.out.save_invstd[static_cast<std::size_t>(n)];
        least_var = std::min(least_var, 1.0 / (s * s) - eps);
      }
      CAPTURE(least_var);
      CHECK(least_var > eps);
    }
  }
}

TEST_CASE("input_stats: each tf32 GEMM rounds x and W as its kTf32Rounding says") {
  // fj_input_stats rounds x and W as Gemm::kTf32Rounding names (common/mma.cuh): the tiled
  // kernel to nearest with ties away (to_tf32), warpspec's TFLOAT32 tensor maps to nearest with
  // ties to even. An eval run shows what the GEMM does: x[r][0] = 1 + r 2^-17 against w[0][0] =
  // 1, and x[r][1] = 1 against w[n][1] = 1 + n 2^-17, so y[r][0] / y[0][0] and y[0][n] /
  // y[0][0] are x's and W's values as multiplied (r, n < 128 span one tf32 step, 2^-10, with
  // its tie at 64).
  const Device dev = Device::current();
  const SweepCase c = parse_sweep_line("128x128x32 tf32 eval");
  struct Rounds {
    const char* key;
    bool hopper;
    bool ties_even;
  };
  constexpr Rounds kRounds[] = {{"warpspec.128x128x32.c2.s6.g8.cl1.p1", true, true},
                                {"tiled.128x128x32.w2x4.s3.g8", false, false}};
  for (const Rounds& k : kRounds) {
    if (k.hopper && !on_hopper()) continue;
    const std::string key = k.key;
    CAPTURE(key);
    const KernelConfig cfg = KernelConfig::parse(k.key);
    REQUIRE_MESSAGE(cfg.valid_for(c.problem, dev), cfg.why_invalid(c.problem, dev));
    CaseInputs in = make_case_inputs(c);
    const std::int64_t M = c.problem.M, N = c.problem.N, K = c.problem.K;
    const std::int64_t ldx = c.problem.lda_x(), ldw = c.problem.lda_w();
    const float step = std::ldexp(1.f, -17);
    for (std::int64_t r = 0; r < M; ++r)
      for (std::int64_t kk = 0; kk < K; ++kk)
        in.x.set(static_cast<std::size_t>(r * ldx + kk),
                 kk == 0 ? 1.f + static_cast<float>(r) * step : (kk == 1 ? 1.f : 0.f));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t kk = 0; kk < K; ++kk) {
        float v = 0.f;
        if (kk == 0 && n == 0) v = 1.f;
        if (kk == 1 && n > 0) v = 1.f + static_cast<float>(n) * step;
        in.w.set(static_cast<std::size_t>(n * ldw + kk), v);
      }
    for (std::int64_t n = 0; n < N; ++n) {
      const auto i = static_cast<std::size_t>(n);
      in.bias.set(i, 0.f), in.scale.set(i, 1.f), in.gamma.set(i, 1.f), in.beta.set(i, 0.f);
      in.running_mean.set(i, 0.f), in.running_var.set(i, 1.f);
    }
    const fusejit::test::PoisonedRun run = fusejit::test::run_poisoned(
        fusejit::test::forced_plan(c.problem, cfg, false), in, M, false);
    const std::vector<double>& y = run.out.y;
    // The value of 1 + i 2^-17 as multiplied, in tf32 steps above 1.
    const auto expected = [&](std::int64_t i) {
      return i > 64 || (i == 64 && !k.ties_even) ? 1.0 : 0.0;
    };
    for (std::int64_t i = 1; i < 128; ++i) {
      CAPTURE(i);
      CHECK(std::round((y[static_cast<std::size_t>(i * N)] / y[0] - 1.0) * 1024.0) == expected(i));
      CHECK(std::round((y[static_cast<std::size_t>(i)] / y[0] - 1.0) * 1024.0) == expected(i));
    }
  }
}

TEST_CASE("input_stats: in tf32 the statistics are those of the GEMM's own products") {
  // A tf32 GEMM multiplies x and W rounded to tf32: the tiled kernel rounds them to nearest with
  // ties away, warpspec's copy engine to nearest with ties to even. Statistics from the operands
  // at full precision miss the a the affine GEMM normalizes wherever tf32's rounding is large
  // against a column's spread (before the kernel rounded them: y 17% off at x ~ 1000 + N(0, 1),
  // H200). Recompute's twin takes its statistics from the same GEMM's products, so the two runs
  // must agree, on data where tf32's rounding is large against the spread: x ~ 1000 + N(0, 1)
  // (x's tf32 steps are 0.5 there); the same with every element of x and W on a tie between
  // two tf32 values, where ties away and ties to even differ by a step in half of them; and
  // unrounded cancelling columns (flagged: the fallback's statistics).
  const Device dev = Device::current();
  constexpr Keyed kTf32[] = {
      {"tf32", "warpspec.128x128x32.c2.s6.g8.cl1.p1.rc.cv", true},
      {"tf32", "tiled.128x128x32.w2x4.s3.g8.rc.cv", false},
  };
  // Both runs' a are the same bits (the same GEMM kernel); their statistics differ by the order
  // of their fp32 sums: ~1e-7-1e-6 of the means and invstds, the same of y in the cancelling
  // case, but ~2e-4 of y at the large means, where a column's mean is ~1000 of its deviations
  // and its rounding moves y by as many times more (H200). With the operands at full precision
  // (the kernel before this case) the large means gave 0.17 in y, 1.8e-4 in the means and
  // 9e-3 in invstd, the cancelling columns (random scales then) 8.6e-3, 2e-4 and 1e-2; with
  // warpspec's tie rule declared as ties away, the ties gave 0.63, 7e-4 and 1.4e-2. The bounds:
  // 2e-5 on the statistics; on y 1e-5 in the cancelling case, 2e-3 (tf32's tolerance, ten times
  // the measured) at the large means.
  constexpr double kStats = 2e-5;
  enum class Data { large_mean, ties, cancelling };
  for (const Keyed& k : kTf32) {
    if (!runs_here(k)) continue;
    for (const Data data : {Data::large_mean, Data::ties, Data::cancelling}) {
      const SweepCase c = parse_sweep_line("3000x200x64 tf32 train");
      const std::string key = k.key;
      CAPTURE(key);
      const bool cancelling = data == Data::cancelling;
      const int kind = static_cast<int>(data);
      CAPTURE(kind);
      const KernelConfig cv = KernelConfig::parse(k.key);
      REQUIRE_MESSAGE(cv.valid_for(c.problem, dev), cv.why_invalid(c.problem, dev));
      CaseInputs in = make_case_inputs(c);
      if (cancelling) {
        make_cancelling_columns(in, 130, false, 1e-3);
      } else {
        make_x_large_mean(in);
        if (data == Data::ties) {
          place_on_tf32_ties(in.x);
          place_on_tf32_ties(in.w);
        }
      }
      CAPTURE(in.seed);
      const Outcome o = run_rows(fusejit::test::forced_plan(c.problem, cv, false), in, c.problem.M);
      const Outcome rc = run_rows(fusejit::test::forced_plan(c.problem, recompute_twin(cv), false),
                                  in, c.problem.M);
      CHECK_MESSAGE(!o.gemm_statistics, "the statistics GEMM ran");
      CHECK(o.flagged == (cancelling ? 130u : 0u));
      const double ey = relative_error(o.out.y, rc.out.y);
      const double em = relative_error(o.out.save_mean, rc.out.save_mean);
      const double es = relative_error(o.out.save_invstd, rc.out.save_invstd);
      CAPTURE(ey);
      CAPTURE(em);
      CAPTURE(es);
      CHECK(ey < (cancelling ? 1e-5 : 2e-3));
      CHECK(em < kStats);
      CHECK(es < kStats);
    }
  }
}

TEST_CASE("input_stats: fewer rows than the plan's, a refused launch, a replayed graph") {
  const Device dev = Device::current();
  const KernelConfig cv = this_gpus_config();
  const SweepCase c = parse_sweep_line("20000x256x64 bf16 train momentum=none");
  REQUIRE(cv.valid_for(c.problem, dev));
  const CaseInputs in = make_case_inputs(c);
  const Plan plan = fusejit::test::forced_plan(c.problem, cv, false);
  // 40 rows: one partial tile (one CTA); 130: three tiles of 64, fewer than the grid's CTAs.
  for (const std::int64_t rows :
       {std::int64_t{40}, std::int64_t{130}, std::int64_t{2000}, c.problem.M}) {
    CAPTURE(rows);
    check_from_input(plan, in, rows);
  }
  // The driver refusing the cooperative launch: recompute's run, bit for bit, and says nothing.
  fault::disarm_all();
  const int before = fault::fired(Fault::cooperative_too_large);
  fault::arm(Fault::cooperative_too_large, 1);
  const Outcome refused = run_rows(plan, in, 2000);
  fault::disarm_all();
  CHECK(fault::fired(Fault::cooperative_too_large) == before + 1);
  CHECK(refused.gemm_statistics);
  const Outcome rc =
      run_rows(fusejit::test::forced_plan(c.problem, recompute_twin(cv), false), in, 2000);
  CHECK(rc.gemm_statistics);
  CHECK(first_different_output(refused.out, rc.out) == "");
  // Captured and replayed: each replay reads the counter the last one bumped.
  constexpr int kReplays = 3;
  DeviceCase dc(in, true);
  DeviceBuffer ws(plan.workspace_size());
  const Stream st;
  replay_captured(
      st, [&] { plan.run(st, dc.tensors(), ws.get(), plan.workspace_size()); }, kReplays);
  const CaseOutputs replayed = dc.download();
  CHECK(replayed.num_batches_tracked == in.num_batches_tracked + kReplays);
  // The same three runs eagerly give the same bits.
  DeviceCase eager(in, true);
  for (int i = 0; i < kReplays; ++i) plan.run(st, eager.tensors(), ws.get(), plan.workspace_size());
  st.synchronize();
  CHECK(first_different_output(replayed, eager.download()) == "");
}
