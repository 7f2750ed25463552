// The forward's optional `saved` output (Tensors::saved, what the backward pass needs): train
// c = a - mean_a, eval u = a + b, laid out like y. Every path that writes it (tiled mma and SIMT
// epilogues, split-K's reduce, the two-pass apply folded and not, warpspec's fragment epilogue
// with thread and TMA stores, pingpong, clusters) against float64, from NaN-poisoned buffers;
// with a null `saved` every output is the same bits as with one; columns whose mean is a
// thousand times their spread keep c's digits; the pointer checks; the cuBLASLt reference op
// writes it too, alone and as a plan's choice, for fewer rows than its M as well.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/verify/verification.hpp"
#include "gpu_required.hpp"
#include "test_graph.hpp"
#include "test_hopper.hpp"
#include "test_inputs.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;
using fusejit::test::first_different_output;
using fusejit::test::forced_plan;
using fusejit::test::make_x_large_mean;
using fusejit::test::on_hopper;
using fusejit::test::same_bits;

namespace {

// What a plain fp32 implementation gets for `saved` on these inputs, as its relative error
// against float64: each a summed over k in order with fmaf, the column mean summed in order in
// fp32. A column whose mean is far above its spread loses digits of c in a itself, before any
// kernel decision; the fused kernels must do no worse than a small multiple of this.
double fp32_floor(const ReferenceInputs& r, Mode mode, const std::vector<double>& ref_saved) {
  const auto M = static_cast<std::size_t>(r.M), N = static_cast<std::size_t>(r.N),
             K = static_cast<std::size_t>(r.K);
  std::vector<double> got(M * N);
  for (std::size_t n = 0; n < N; ++n) {
    std::vector<float> a(M);
    for (std::size_t m = 0; m < M; ++m) {
      float s = 0.f;
      for (std::size_t k = 0; k < K; ++k)
        s = std::fmaf(static_cast<float>(r.x[m * K + k]), static_cast<float>(r.w[n * K + k]), s);
      a[m] = s;
    }
    float shift = 0.f;
    if (mode == Mode::train) {
      for (std::size_t m = 0; m < M; ++m) shift += a[m];
      shift = -shift / static_cast<float>(M);
    } else if (!r.bias.empty()) {
      shift = static_cast<float>(r.bias[n]);
    }
    for (std::size_t m = 0; m < M; ++m) got[m * N + n] = a[m] + shift;
  }
  return relative_error(got, ref_saved);
}

// How far a tensor core's fp32 accumulation alone can move train's c, relative to c's spread:
// the MMA adds its products to the running sum with fewer alignment bits kept than an IEEE fp32
// add, about 2^-21 of the running sum per step (fitted on H100 with x ~ 1000 + N(0, 1): tf32
// warpspec at 93-1541 rows reached 1.7e-3..7.9e-3 where the plain fp32 floor was 1.9e-4..7e-4).
// Over K steps whose running sums are ~|a| that is a random walk of 2^-21 sqrt(K) rms(a); the
// fp32 floor above cannot show it because it adds in IEEE fp32. (mma.sync, the tiled mainloop,
// came out at ~1e-4 on the same inputs: the bound is wgmma's.) 12 runs of this test on H100
// afterwards: warpspec tf32 saved at most 4.6e-3 against tolerances of 1.3e-2 and more.
double tensor_core_floor(const ReferenceInputs& r, const std::vector<double>& ref_saved) {
  const auto M = static_cast<std::size_t>(r.M), N = static_cast<std::size_t>(r.N),
             K = static_cast<std::size_t>(r.K);
  double a2 = 0, c2 = 0;
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      double a = 0;
      for (std::size_t k = 0; k < K; ++k) a += r.x[m * K + k] * r.w[n * K + k];
      a2 += a * a;
      c2 += ref_saved[m * N + n] * ref_saved[m * N + n];
    }
  return std::ldexp(1.0, -21) * std::sqrt(static_cast<double>(K)) * std::sqrt(a2 / c2);
}

struct Run {
  CaseOutputs out;
  CaseErrors errors;
};

// One run of `plan` on `in`, with `saved` requested or not, from freshly poisoned outputs.
Run run_once(const Plan& plan, const CaseInputs& in, bool with_saved,
             const std::vector<double>& ref_saved) {
  DeviceCase dc(in, with_saved);
  const Stream st;
  plan.run(st, dc.tensors());
  st.synchronize();
  Run r;
  r.out = dc.download();
  const ReferenceOutputs ref = reference_forward(
      reference_inputs(in), reference_settings(in.c.problem, in.num_batches_tracked));
  r.errors = compare(in, r.out, ref, with_saved ? &ref_saved : nullptr);
  return r;
}

// `line` (sweep-file syntax) under `key`: saved within `tolerance` of float64 (default: the
// sweep's threshold for the dtype, which every other figure must meet too); and a second run
// without saved leaving y, the running and saved stats and the counter the same bits.
// large_mean: x ~ 1000 + N(0, 1), every column's mean ~1000 times its spread; the tolerance is
// then the sweep's threshold plus four times the plain fp32 floor (fp32_floor), for saved and y.
void check_case(const std::string& line, const std::string& key, bool large_mean = false) {
  const SweepCase c = parse_sweep_line(line);
  const Problem& p = c.problem;
  const KernelConfig config = KernelConfig::parse(key);
  CAPTURE(line);
  CAPTURE(key);
  const Device dev = Device::current();
  if (!config.valid_for(p, dev)) {
    FAIL_CHECK("config not valid for the case: " << config.why_invalid(p, dev));
    return;
  }
  const Plan plan = forced_plan(p, config);
  REQUIRE(!plan.uses_reference());
  CaseInputs in = make_case_inputs(c);
  CAPTURE(in.seed);
  if (large_mean) make_x_large_mean(in);
  const ReferenceInputs ri = reference_inputs(in);
  const std::vector<double> ref_saved = reference_saved(ri, p.mode);
  const double threshold = sweep_threshold(p.dtype);

  const Run with = run_once(plan, in, true, ref_saved);
  const CaseErrors& e = with.errors;
  REQUIRE(with.out.saved.size() == ref_saved.size());
  CHECK(!e.non_finite);
  CHECK(e.padding_ok);
  if (large_mean) {
    const double floor = fp32_floor(ri, p.mode, ref_saved);
    // tf32's threshold is the only one small enough for the tensor cores' accumulation to
    // matter here (train only: eval's u is not centred, so its relative error stays ~1e-5).
    const double accumulation = p.dtype == DType::tf32 && p.mode == Mode::train
                                    ? 2 * tensor_core_floor(ri, ref_saved)
                                    : 0.0;
    const double tolerance = threshold + 4 * floor + accumulation;
    MESSAGE(fmt::format(
        "{} {} (x ~ 1000 + N(0,1)): saved {:.2e}, y {:.2e}, fp32 floor {:.2e}, tolerance {:.2e}",
        line, key, e.saved, e.y, floor, tolerance));
    CHECK(e.saved < tolerance);
    CHECK(e.y < tolerance);
  } else {
    MESSAGE(fmt::format("{} {}: saved {:.2e}, y {:.2e}", line, key, e.saved, e.y));
    std::string why;
    CHECK_MESSAGE(passes(e, threshold, &why), why);
    CHECK(e.saved < threshold);
  }

  // saved must change nothing else: same inputs (same counter and running stats before the
  // run), no saved, the same bits everywhere.
  const Run without = run_once(plan, in, false, ref_saved);
  CHECK(without.out.saved.empty());
  CHECK(first_different_output(without.out, with.out) == "");
}

// Cases per schedule class for a config with BM rows per tile: train in one pass (M <= BM),
// two passes with the apply pass merging the partials itself (at most 8 row tiles) and after
// fj_finalize (more), eval with and without bias. M and N have tails against the tile.
std::vector<std::string> schedule_cases(int bm, const char* dtype, const char* shape_nk,
                                        const char* extra = "") {
  const int single = bm - bm / 4 - 3;  // < BM, not a multiple of anything
  const int folded = 4 * bm + 17;      // 5 row tiles
  const int unfolded = 12 * bm + 5;    // 13 row tiles
  std::vector<std::string> out;
  for (int m : {single, folded, unfolded})
    out.push_back(fmt::format("{}x{} {} train{}", m, shape_nk, dtype, extra));
  out.push_back(fmt::format("{}x{} {} eval{}", folded, shape_nk, dtype, extra));
  out.push_back(fmt::format("{}x{} {} eval nobias{}", single, shape_nk, dtype, extra));
  return out;
}

constexpr const char* kDTypes[] = {"fp32", "tf32", "fp16", "bf16"};

// The tiled configs of a dtype's math path (fp32: SIMT FFMA; tf32, fp16, bf16: mma.sync), and a
// split-K one (its reduce kernel runs the epilogue).
const char* tiled_key(const std::string& dtype) {
  return dtype == "fp32" ? "tiled.64x64x16.w2x1.s3.g8" : "tiled.64x64x32.w2x2.s3.g8";
}
const char* splitk_key(const std::string& dtype) {
  return dtype == "fp32" ? "tiled.64x64x16.w2x1.s3.g8.k3" : "tiled.64x64x32.w2x2.s3.g8.k2";
}

}  // namespace

TEST_CASE("saved, tiled variant: every schedule class and dtype against float64") {
  primary_context(0);
  for (const char* d : kDTypes) {
    CAPTURE(d);
    // N = 200: a partial last column tile; K = 72 a partial k tile.
    for (const std::string& line : schedule_cases(64, d, "200x72")) check_case(line, tiled_key(d));
    // N = 7: odd rows (2- and 4-byte alignment), so every store of y and saved is scalar and the
    // apply pass takes its column-tail path; ldy = 9: padding that must stay poisoned.
    for (const std::string& line : schedule_cases(64, d, "7x40", " ldy=9"))
      check_case(line, tiled_key(d));
  }
}

TEST_CASE("saved, tiled split-K: the reduce kernel's epilogue writes it") {
  primary_context(0);
  for (const char* d : kDTypes) {
    CAPTURE(d);
    for (const std::string& line : schedule_cases(64, d, "200x200"))
      check_case(line, splitk_key(d));
  }
}

TEST_CASE("saved, warpspec variant: thread stores, TMA stores, pingpong, clusters (sm_90)") {
  if (!on_hopper()) return;
  // Thread stores through the staging buffer: two consumers of 64 rows, one of 128 (two atoms);
  // pingpong (eval: per-team coefficient path); TMA stores of y (saved by the warps' own stores
  // from the same boxes, 16-bit and fp32) with two consumers, one consumer of two atoms, and a
  // cluster of two.
  // Keys without their BK (tf32 rows of 32 fp32 and 16-bit rows of 64 are both 128 bytes).
  struct Keyed {
    const char* key;
    int bm;
    bool sixteen_bit_only;
  };
  constexpr Keyed kKeys[] = {
      {"warpspec.128x128x{}.c2.s5.g8.cl1.p1", 128, false},
      {"warpspec.128x128x{}.c1.s6.g8.cl1.p1", 128, false},
      {"warpspec.128x128x{}.c2.s5.g8.cl1.p1.pp", 128, true},
      {"warpspec.128x256x{}.c2.s4.g8.cl1.p1.ts", 128, false},
      {"warpspec.64x128x{}.c1.s6.g8.cl1.p1.ts", 64, false},
      {"warpspec.128x128x{}.c2.s5.g8.cl2.p0.ts", 128, false},
  };
  for (const Keyed& k : kKeys)
    for (const char* d : {"tf32", "fp16", "bf16"}) {
      const bool tf32 = std::string(d) == "tf32";
      if (k.sixteen_bit_only && tf32) continue;
      CAPTURE(d);
      const std::string key = fmt::format(fmt::runtime(k.key), tf32 ? 32 : 64);
      // N = 200: a partial column tile, still whole 16-byte rows as TMA needs.
      for (const std::string& line : schedule_cases(k.bm, d, "200x64")) check_case(line, key);
    }
}

TEST_CASE("saved, recompute configs: the affine pass writes c = a - mean_a") {
  primary_context(0);
  // Train with more than one row tile only (the configs' class): 5 and 13 row tiles, both
  // through fj_finalize; plain x and x ~ 1000 + N(0, 1).
  auto train_lines = [](int bm, const char* d, const char* nk) {
    std::vector<std::string> lines = schedule_cases(bm, d, nk);
    return std::vector<std::string>{lines[1], lines[2]};
  };
  for (const char* d : kDTypes) {
    CAPTURE(d);
    const std::string key = std::string(tiled_key(d)) + ".rc";
    for (const std::string& line : train_lines(64, d, "200x72")) check_case(line, key);
    for (const std::string& line : train_lines(64, d, "96x128")) check_case(line, key, true);
  }
  if (!on_hopper()) return;
  for (const char* key :
       {"warpspec.128x128x64.c2.s5.g8.cl1.p1.rc", "warpspec.128x256x64.c2.s4.g8.cl1.p1.ts.rc"})
    for (const char* d : {"fp16", "bf16"}) {
      CAPTURE(d);
      for (const std::string& line : train_lines(128, d, "200x64")) check_case(line, key);
      for (const std::string& line : train_lines(128, d, "96x128")) check_case(line, key, true);
    }
}

TEST_CASE("recompute: the statistics are the two-pass schedule's, bit for bit") {
  primary_context(0);
  // Both schedules reduce the same per-tile partials and merge them in fj_finalize (more than 8
  // row tiles, so the two-pass schedule does not fold): running and saved statistics and the
  // counter must be the same bits. y and saved differ by the two-pass schedule's rounding of
  // d to the output type; both are checked against float64 by check_case.
  struct Keyed {
    const char* dtype;
    const char* key;
    bool hopper;
  };
  constexpr Keyed kKeys[] = {{"fp32", "tiled.64x64x16.w2x1.s3.g8", false},
                             {"bf16", "tiled.64x64x64.w2x2.s3.g8", false},
                             {"tf32", "warpspec.128x128x32.c2.s6.g8.cl1.p1", true},
                             {"bf16", "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts", true}};
  for (const Keyed& k : kKeys) {
    if (k.hopper && !on_hopper()) continue;
    for (const char* momentum : {"0.1", "none"}) {
      const std::string line = fmt::format("2000x200x72 {} train momentum={}", k.dtype, momentum);
      const SweepCase c = parse_sweep_line(line);
      CAPTURE(line);
      CAPTURE(k.key);
      const KernelConfig two_pass = KernelConfig::parse(k.key);
      KernelConfig recompute = two_pass;
      recompute.recompute = true;
      REQUIRE((c.problem.M + two_pass.bm - 1) / two_pass.bm > 8);
      const CaseInputs in = make_case_inputs(c);
      const std::vector<double> ref_saved = reference_saved(reference_inputs(in), Mode::train);
      const Run a = run_once(forced_plan(c.problem, two_pass), in, true, ref_saved);
      const Run b = run_once(forced_plan(c.problem, recompute), in, true, ref_saved);
      CHECK(same_bits(a.out.running_mean, b.out.running_mean));
      CHECK(same_bits(a.out.running_var, b.out.running_var));
      CHECK(same_bits(a.out.save_mean, b.out.save_mean));
      CHECK(same_bits(a.out.save_invstd, b.out.save_invstd));
      CHECK(a.out.num_batches_tracked == b.out.num_batches_tracked);
      MESSAGE(fmt::format("{} {}: y vs float64 two-pass {:.2e}, recompute {:.2e}", line, k.key,
                          a.errors.y, b.errors.y));
      CHECK(b.errors.y <= sweep_threshold(c.problem.dtype));
    }
  }
}

TEST_CASE("saved keeps c's digits where a column's mean is ~1000 times its spread") {
  primary_context(0);
  // x ~ 1000 + N(0, 1): mean_a ~ 600, spread of a ~ 0.6. Storing a rounded to T and subtracting
  // later would lose every digit of c in 16-bit types (bf16 spacing at 600 is 4).
  for (const char* d : kDTypes) {
    CAPTURE(d);
    for (const std::string& line : schedule_cases(64, d, "96x128"))
      check_case(line, tiled_key(d), true);
    for (const std::string& line : schedule_cases(64, d, "96x256"))
      check_case(line, splitk_key(d), true);
  }
  if (!on_hopper()) return;
  for (const std::string& line : schedule_cases(128, "tf32", "96x128"))
    check_case(line, "warpspec.128x128x32.c2.s5.g8.cl1.p1", true);
  for (const char* key :
       {"warpspec.128x128x64.c2.s5.g8.cl1.p1", "warpspec.128x256x64.c2.s4.g8.cl1.p1.ts"})
    for (const std::string& line : schedule_cases(128, "bf16", "96x128"))
      check_case(line, key, true);
}

TEST_CASE("saved: misaligned or overlapping y is refused by name, by the reference op too") {
  primary_context(0);
  const SweepCase c = parse_sweep_line("300x64x64 bf16 train");
  const Problem& p = c.problem;
  const CaseInputs in = make_case_inputs(c, 7);
  DeviceCase dc(in, true);
  const Plan plan = forced_plan(p, KernelConfig::parse(tiled_key("bf16")));
  auto rejected = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return "(accepted)";
  };
  const Tensors good = dc.tensors();
  CHECK(rejected([&] { plan.validate(good); }) == "(accepted)");
  // y and the places saved is tried at, in one buffer of three y's: the run also refuses saved
  // over x or W, which the case's own buffers may sit right beside.
  const std::uintptr_t y_bytes = static_cast<std::uintptr_t>(p.M * p.lda_y()) * 2;
  const DeviceBuffer around(3 * y_bytes);
  const std::uintptr_t y = around.address() + y_bytes;
  auto with_saved = [&](std::uintptr_t address) {
    Tensors t = good;
    t.y = reinterpret_cast<void*>(y);
    t.saved = reinterpret_cast<void*>(address);
    return t;
  };
  CHECK(rejected([&] { plan.validate(with_saved(y)); }) == "saved");
  CHECK(rejected([&] { plan.validate(with_saved(y + y_bytes - 256)); }) == "saved");
  // Ending exactly where y begins, or beginning right after its last element: no overlap.
  CHECK(rejected([&] { plan.validate(with_saved(y + y_bytes)); }) == "(accepted)");
  CHECK(rejected([&] { plan.validate(with_saved(y - y_bytes)); }) == "(accepted)");
  CHECK(rejected([&] { plan.validate(with_saved(y - y_bytes + 16)); }) == "saved");
  CHECK(rejected([&] {
          plan.validate(with_saved(reinterpret_cast<std::uintptr_t>(good.saved) + 2));
        }) == "saved");
  const Stream st;
  CHECK(rejected([&] { plan.run(st, with_saved(y)); }) == "saved");
  // The cuBLASLt reference op checks saved as the plan does.
  const ReferenceOp ref(p);
  CHECK(rejected([&] { ref.validate(good); }) == "(accepted)");
  CHECK(rejected([&] { ref.run(st, with_saved(y + y_bytes - 256)); }) == "saved");
  CHECK(rejected([&] {
          ref.run(st, with_saved(reinterpret_cast<std::uintptr_t>(good.saved) + 2));
        }) == "saved");
  st.synchronize();
}

// The reference op (cuBLASLt GEMM + plain BatchNorm kernels) on `line`'s case, as `rows` rows
// (0: M) of an op made for M: saved and y against float64 within the sweep's threshold (large
// mean: plus four times the plain fp32 floor, as check_case), and without saved the same bits
// everywhere else. tf32: against the float64 of whichever way cuBLASLt's kernel read x and W
// (Tf32Operands) the outputs are closest to, as the sweep judges the reference op.
void check_reference(const std::string& line, std::int64_t rows = 0, bool large_mean = false) {
  const SweepCase c = parse_sweep_line(line);
  SweepCase run_case = c;
  if (rows) run_case.problem.M = rows;
  const Problem& p = run_case.problem;
  CAPTURE(line);
  CAPTURE(rows);
  const ReferenceOp op(c.problem);
  const DeviceBuffer ws(op.workspace_size());
  CaseInputs in = make_case_inputs(run_case);
  CAPTURE(in.seed);
  if (large_mean) make_x_large_mean(in);
  auto once = [&](bool with_saved) {
    DeviceCase dc(in, with_saved);
    const Stream st;
    op.run(st, dc.tensors(), p.M, ws.get(), ws.size());
    st.synchronize();
    Run r;
    r.out = dc.download();
    return r;
  };
  const Run with = once(true);
  const double threshold = sweep_threshold(p.dtype);
  const ReadingErrors judged =
      compare_readings(in, with.out, reference_settings(p, in.num_batches_tracked),
                       kCublasLtTf32Readings, threshold);
  const CaseErrors& e = judged.errors;
  // The floors below, of the reading judged.
  const ReferenceInputs ri = reference_inputs(in, judged.reading);
  const std::vector<double> ref_saved = reference_saved(ri, p.mode);
  REQUIRE(with.out.saved.size() == ref_saved.size());
  CHECK(!e.non_finite);
  CHECK(e.padding_ok);
  // tf32's GEMM runs on cuBLASLt's tensor cores: their accumulation counts as in check_case.
  const double accumulation =
      p.dtype == DType::tf32 && p.mode == Mode::train ? 2 * tensor_core_floor(ri, ref_saved) : 0.0;
  const double tolerance =
      large_mean ? threshold + 4 * fp32_floor(ri, p.mode, ref_saved) + accumulation : threshold;
  MESSAGE(fmt::format("reference op, {} as {} rows: saved {:.2e}, y {:.2e}, tolerance {:.2e}", line,
                      p.M, e.saved, e.y, tolerance));
  CHECK(e.saved < tolerance);
  CHECK(e.y < tolerance);
  if (!large_mean) {
    std::string why;
    CHECK_MESSAGE(passes(e, threshold, &why), why);
  }
  const Run without = once(false);
  CHECK(without.out.saved.empty());
  CHECK(first_different_output(without.out, with.out) == "");
}

TEST_CASE("saved, reference op: every dtype, parameter dtype and mode, fewer rows, large means") {
  primary_context(0);
  for (const char* d : kDTypes) {
    CAPTURE(d);
    // fp32 parameters take cuBLASLt's bias epilogue (16-byte aligned bias), 16-bit ones the
    // plain kernels' bias ("same"); no bias; no scale or affine; momentum None; no running stats;
    // a row stride with padding.
    for (const char* extra :
         {"", " same", " nobias", " noscale noaffine", " momentum=none", " ldy=136"}) {
      check_reference(fmt::format("300x130x200 {} train{}", d, extra));
      check_reference(fmt::format("300x130x200 {} eval{}", d, extra));
    }
    check_reference(fmt::format("300x130x200 {} train notrack", d));
    // Fewer rows than the op's M: the batch statistics of those rows alone.
    check_reference(fmt::format("300x130x200 {} train", d), 129);
    check_reference(fmt::format("300x130x200 {} train", d), 2);
    check_reference(fmt::format("300x130x200 {} eval", d), 1);
    // Tall and narrow: fj_ref_stats in chunks of rows merged by fj_ref_stats_merge (16 chunks of
    // 256 rows here), also for a run of fewer rows (4 chunks) and with x ~ 1000 + N(0, 1).
    check_reference(fmt::format("4000x40x64 {} train", d));
    check_reference(fmt::format("4000x40x64 {} train momentum=none", d), 1000);
    check_reference(fmt::format("2000x64x96 {} train", d), 0, true);
    // x ~ 1000 + N(0, 1): c from G - mean G keeps its digits.
    check_reference(fmt::format("96x128x128 {} train", d), 0, true);
    check_reference(fmt::format("96x128x128 {} eval", d), 0, true);
  }
}

TEST_CASE("reference op: a shape cuBLASLt runs for M rows only refuses fewer, by name") {
  primary_context(0);
  // N = 1 with padded strides: on H200 (cuBLAS 13.0) none of the heuristic's algorithms for 128
  // rows passed cuBLASLt's check at fewer rows. Either way the op is right for what it accepts.
  const std::string line = "128x1x1000 bf16 eval ldx=1008 ldw=1016 ldy=16";
  check_reference(line);
  const SweepCase c = parse_sweep_line(line);
  const ReferenceOp op(c.problem);
  MESSAGE(fmt::format("{}: runs fewer rows: {}", line, op.runs_fewer_rows()));
  if (op.runs_fewer_rows()) {
    check_reference(line, 64);
    return;
  }
  const CaseInputs in = make_case_inputs(c);
  DeviceCase dc(in, true);
  const DeviceBuffer ws(op.workspace_size());
  const Stream st;
  try {
    op.run(st, dc.tensors(), 64, ws.get(), ws.size());
    FAIL_CHECK("a run of fewer rows was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "rows");
  }
}

TEST_CASE("saved from a plan whose choice is the reference op: the reference op writes it") {
  primary_context(0);
  // Strict fp32 with K >= 1536: without a tuning entry the dispatch
  // prefers the reference op (tune/dispatch.hpp), as a tuning whose winner was the reference does.
  for (const char* line : {"600x1100x2000 fp32 train", "300x700x2048 fp32 eval nobias"}) {
    CAPTURE(std::string(line));
    const SweepCase c = parse_sweep_line(line);
    const Problem& p = c.problem;
    PlanOptions po;
    po.autotune = false;
    po.use_tuning_db = false;
    const Plan plan(p, po);
    REQUIRE(plan.uses_reference());
    CHECK(plan.kernel_names().front() == "cublasLtMatmul");
    const ReferenceOp op(p);
    CHECK(plan.workspace_size() == op.workspace_size());
    // A training forward's rows of any batch up to M: the plan's outputs, saved included, are
    // the reference op's own to the bit, and within the sweep's threshold of float64.
    for (const std::int64_t rows : {p.M, p.M / 2 + 3}) {
      CAPTURE(rows);
      SweepCase run_case = c;
      run_case.problem.M = rows;
      const CaseInputs in = make_case_inputs(run_case);
      auto run = [&](auto&& go) {
        DeviceCase dc(in, true);
        const Stream st;
        go(st, dc.tensors());
        st.synchronize();
        return dc.download();
      };
      const DeviceBuffer ws(op.workspace_size());
      const CaseOutputs via_plan =
          run([&](CUstream st, const Tensors& t) { plan.run(st, t, rows); });
      const CaseOutputs via_op =
          run([&](CUstream st, const Tensors& t) { op.run(st, t, rows, ws.get(), ws.size()); });
      REQUIRE(!via_plan.saved.empty());
      CHECK(first_different_output(via_plan, via_op) == "");
      const ReferenceInputs ri = reference_inputs(in);
      const std::vector<double> ref_saved = reference_saved(ri, run_case.problem.mode);
      const CaseErrors e = compare(
          in, via_plan,
          reference_forward(ri, reference_settings(run_case.problem, in.num_batches_tracked)),
          &ref_saved);
      MESSAGE(fmt::format("{} as {} rows through the plan: saved {:.2e}, y {:.2e}", line, rows,
                          e.saved, e.y));
      std::string why;
      CHECK_MESSAGE(passes(e, sweep_threshold(p.dtype), &why), why);
      CHECK(e.saved < sweep_threshold(p.dtype));
    }
  }
}
