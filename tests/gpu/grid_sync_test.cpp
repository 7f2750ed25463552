// KernelConfig::grid_sync (train, warpspec): when a run's tiles all fit on the GPU at once, or (a
// persistent config) its row tiles do, fj_gemm goes out alone as a cooperative launch and takes
// its tiles in rounds of whole column panels; each round meets at a grid barrier, merges the
// column partials in fj_finalize's order and stores y itself. It must give the recompute
// schedule's outputs bit for bit (same partials, same merge order, same affine on the same
// accumulators), whichever way a run goes:
//  - resident, in one round or several (a prime number of column tiles: one panel a round):
//    proven to be the one-kernel path by the workspace's coefficient region, which only
//    fj_finalize writes and which must keep its poison;
//  - a run whose row tiles do not fit (a plan made for more rows) and a cooperative launch the
//    driver refuses (fault injection): recompute's kernels, coefficients written;
//  - captured in a CUDA graph and replayed, with momentum=None (the counter CTA 0 bumps after
//    the barrier every CTA read it before);
//  - strided x, columns whose mean is far above their spread, and two resident plans on two
//    streams at once.
// And recompute's own kernels: its affine pass, a programmatic dependent launch of fj_finalize,
// reads only its own run's coefficients when runs follow each other on one workspace.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/error.hpp"
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

// Runs give their own poisoned workspace (run_rows), so the plans have none.
Plan forced_plan(const Problem& p, const KernelConfig& config) {
  return fusejit::test::forced_plan(p, config, false);
}

KernelConfig without_grid_sync(KernelConfig c) {
  c.grid_sync = false;
  return c;
}

struct Outcome {
  CaseOutputs out;
  bool coef_written = false;  // fj_finalize ran: the coefficient region lost its poison
};

// `rows` rows of `in` (a case of in.c.problem.M >= rows rows) through `plan` on a poisoned
// caller workspace.
Outcome run_rows(const Plan& plan, const CaseInputs& in, std::int64_t rows, bool with_saved) {
  const fusejit::test::PoisonedRun r = fusejit::test::run_poisoned(plan, in, rows, with_saved);
  const WorkspaceLayout layout = workspace_layout(plan.problem(), plan.config());
  REQUIRE(layout.coef_bytes > 0);
  return {r.out, r.written(layout.coef_offset, layout.coef_bytes)};
}

// y (and saved) against float64 by the sweep's rule, for `rows` rows of the case.
void check_against_float64(const CaseInputs& in, const CaseOutputs& got, std::int64_t rows) {
  std::string why;
  CHECK_MESSAGE(fusejit::test::rows_pass_float64(in, got, rows, &why), why);
}

// All of `in` through `gs` and through its recompute twin: the resident run leaves the
// coefficient region poisoned (no fj_finalize), the twin writes it, and every output is the
// same bits. Returns the resident run's outcome.
Outcome check_same_as_recompute(const KernelConfig& gs, const CaseInputs& in, bool with_saved) {
  const Problem& p = in.c.problem;
  const Outcome one = run_rows(forced_plan(p, gs), in, p.M, with_saved);
  const Outcome three = run_rows(forced_plan(p, without_grid_sync(gs)), in, p.M, with_saved);
  CHECK_MESSAGE(!one.coef_written, "the resident run launched fj_finalize");
  CHECK(three.coef_written);
  CHECK(first_different_output(one.out, three.out) == "");
  return one;
}

// `rounds` times, from the same starting state: fresh device cases of `a` and `b` (with saved),
// `enqueue(da, db)` queues a run of each, `wait()` waits for both; each must give the outputs it
// gave alone.
template <class Enqueue, class Wait>
void check_rounds_give_alone(int rounds, const CaseInputs& a, const CaseOutputs& alone_a,
                             const CaseInputs& b, const CaseOutputs& alone_b, Enqueue enqueue,
                             Wait wait) {
  for (int i = 0; i < rounds; ++i) {
    CAPTURE(i);
    DeviceCase da(a, true), db(b, true);
    enqueue(da, db);
    wait();
    CHECK(first_different_output(da.download(), alone_a) == "");
    CHECK(first_different_output(db.download(), alone_b) == "");
  }
}

struct Keyed {
  const char* dtype;
  const char* key;
};
// Two consumers with TMA stores, thread stores, one consumer and not persistent, tf32, 3xTF32
// and unaligned rows through the padded copies.
constexpr Keyed kConfigs[] = {
    {"bf16", "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs"},
    {"fp16", "warpspec.128x128x64.c2.s5.g8.cl1.p1.rc.gs"},
    {"bf16", "warpspec.64x128x64.c1.s6.g8.cl1.p0.rc.gs"},
    {"tf32", "warpspec.128x128x32.c2.s6.g8.cl1.p1.rc.gs"},
    {"tf32x3", "warpspec.128x128x32.c2.s3.g8.cl1.p1.rc.gs"},
};

}  // namespace

TEST_CASE("grid_sync: one kernel gives recompute's outputs bit for bit") {
  if (!on_hopper()) return;  // grid_sync runs the warpspec kernel
  const Device dev = Device::current();
  for (const Keyed& k : kConfigs) {
    // Tails in M and N; > 8 row tiles; momentum=None; no bias; no affine; a K tail.
    for (const char* tail : {"", " momentum=none", " nobias noaffine"}) {
      const std::string line =
          fmt::format("1100x328x{} {} train{}", std::string(k.dtype).starts_with("tf32") ? 100 : 72,
                      k.dtype, tail);
      CAPTURE(line);
      CAPTURE(k.key);
      const SweepCase c = parse_sweep_line(line);
      const KernelConfig gs = KernelConfig::parse(k.key);
      REQUIRE_MESSAGE(gs.valid_for(c.problem, dev), gs.why_invalid(c.problem, dev));
      const CaseInputs in = make_case_inputs(c);
      CAPTURE(in.seed);
      for (const bool with_saved : {true, false}) {
        const Outcome one = check_same_as_recompute(gs, in, with_saved);
        CHECK(one.out.saved.empty() != with_saved);
        check_against_float64(in, one.out, c.problem.M);
      }
    }
    // Several rounds (persistent configs): more tiles than SMs, tails in M and N. 128x256
    // tiles: 17 row tiles x 12 column tiles, rounds of 7 and 5 panels; 128x128: 17 x 23, rounds
    // of 7, 7, 7 and 2 (3xTF32 at 128x128 likewise): in the last round most CTAs have no tile
    // and arrive at its barrier all the same.
    if (!KernelConfig::parse(k.key).persistent) continue;
    for (const char* tail : {"", " momentum=none"}) {
      const std::string line =
          fmt::format("2100x2904x{} {} train{}",
                      std::string(k.dtype).starts_with("tf32") ? 100 : 72, k.dtype, tail);
      CAPTURE(line);
      CAPTURE(k.key);
      const SweepCase c = parse_sweep_line(line);
      const KernelConfig gs = KernelConfig::parse(k.key);
      REQUIRE_MESSAGE(gs.valid_for(c.problem, dev), gs.why_invalid(c.problem, dev));
      const std::int64_t tiles =
          (c.problem.M + gs.bm - 1) / gs.bm * ((c.problem.N + gs.bn - 1) / gs.bn);
      const unsigned grid =
          resident_grid(gs, c.problem.N, c.problem.M, static_cast<unsigned>(dev.sm_count));
      CAPTURE(grid);
      REQUIRE((grid > 0 && grid < tiles && tiles > dev.sm_count && tiles % grid != 0));
      const CaseInputs in = make_case_inputs(c);
      CAPTURE(in.seed);
      const Outcome one = check_same_as_recompute(gs, in, true);
      check_against_float64(in, one.out, c.problem.M);
    }
  }
  // Strided x (ldx > K), and columns whose mean is ~1000 times their spread (x ~ 1000 + N(0,1),
  // where a lost digit in the merge would show): still recompute's bits, and no NaN.
  {
    const std::string line = "1100x328x72 bf16 train ldx=88";
    CAPTURE(line);
    const SweepCase c = parse_sweep_line(line);
    const KernelConfig gs = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs");
    REQUIRE(gs.valid_for(c.problem, dev));
    for (const bool large_mean : {false, true}) {
      CAPTURE(large_mean);
      CaseInputs in = make_case_inputs(c);
      if (large_mean) make_x_large_mean(in);
      const Outcome one = check_same_as_recompute(gs, in, true);
      CHECK(std::count_if(one.out.y.begin(), one.out.y.end(),
                          [](double v) { return !std::isfinite(v); }) == 0);
      if (!large_mean) check_against_float64(in, one.out, c.problem.M);
    }
  }
  // Unaligned rows (K odd in bf16): the copy kernel first, then the resident GEMM.
  const std::string line = "1000x1001x1003 bf16 train";
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const KernelConfig gs = KernelConfig::parse("warpspec.64x128x64.c1.s6.g8.cl1.p1.pad.rc.gs");
  REQUIRE_MESSAGE(gs.valid_for(c.problem, dev), gs.why_invalid(c.problem, dev));
  const CaseInputs in = make_case_inputs(c);
  const Outcome one = check_same_as_recompute(gs, in, true);
  check_against_float64(in, one.out, c.problem.M);
}

TEST_CASE("grid_sync: runs that cannot be resident take recompute's kernels, same bits") {
  if (!on_hopper()) return;  // grid_sync runs the warpspec kernel
  const Device dev = Device::current();
  // A plan for 20000 rows of N = 512 in 128x256 tiles: 157 row tiles x 2. The config is
  // persistent, so a resident run has at most one CTA per SM (resident_tiles()), and a round
  // needs every row tile of a column panel: 157 are more than an H100's 132 SMs or an H200's.
  // 9000 rows (71 row tiles) run in two rounds of one panel, 2000 rows (16 x 2 tiles) in one.
  const std::string line = "20000x512x64 bf16 train momentum=none";
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const KernelConfig gs = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs");
  REQUIRE(gs.valid_for(c.problem, dev));
  const Plan one = forced_plan(c.problem, gs);
  const Plan three = forced_plan(c.problem, without_grid_sync(gs));
  const CaseInputs in = make_case_inputs(c);
  REQUIRE((gs.persistent && 157 > dev.sm_count && 71 <= dev.sm_count));
  for (const std::int64_t rows : {std::int64_t{2000}, std::int64_t{9000}, c.problem.M}) {
    CAPTURE(rows);
    const Outcome a = run_rows(one, in, rows, true);
    const Outcome b = run_rows(three, in, rows, true);
    CHECK(a.coef_written == (rows == c.problem.M));
    CHECK(b.coef_written);
    CHECK(first_different_output(a.out, b.out) == "");
    check_against_float64(in, a.out, rows);
  }
  // The driver refusing the cooperative launch (as with SMs held elsewhere): the same run falls
  // back, and says nothing; in one round and in two.
  for (const std::int64_t rows : {std::int64_t{2000}, std::int64_t{9000}}) {
    CAPTURE(rows);
    fault::disarm_all();
    const int before = fault::fired(Fault::cooperative_too_large);
    fault::arm(Fault::cooperative_too_large, 1);
    const Outcome refused = run_rows(one, in, rows, true);
    fault::disarm_all();
    CHECK(fault::fired(Fault::cooperative_too_large) == before + 1);
    CHECK(refused.coef_written);
    const Outcome resident = run_rows(one, in, rows, true);
    CHECK(!resident.coef_written);
    CHECK(first_different_output(refused.out, resident.out) == "");
  }
}

TEST_CASE("grid_sync: a captured resident run replays, counting every batch once") {
  if (!on_hopper()) return;  // grid_sync runs the warpspec kernel
  // momentum=None: each replay's factor reads the counter the previous replay bumped.
  const std::string line = "1500x256x64 bf16 train momentum=none";
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const KernelConfig gs = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs");
  const CaseInputs in = make_case_inputs(c);
  constexpr int kReplays = 3;
  std::vector<CaseOutputs> outs;
  for (const KernelConfig& config : {gs, without_grid_sync(gs)}) {
    const Plan plan = forced_plan(c.problem, config);
    DeviceCase dc(in, true);
    DeviceBuffer ws(plan.workspace_size());
    const Stream st;
    replay_captured(
        st, [&] { plan.run(st, dc.tensors(), ws.get(), plan.workspace_size()); }, kReplays);
    outs.push_back(dc.download());
  }
  CHECK(outs[0].num_batches_tracked == in.num_batches_tracked + kReplays);
  CHECK(first_different_output(outs[0], outs[1]) == "");
}

TEST_CASE("grid_sync: resident runs on two streams at once each meet only their own grid") {
  if (!on_hopper()) return;  // grid_sync runs the warpspec kernel
  // Two plans of 16 tiles each, so both grids fit at once: each cooperative launch must count
  // its own CTAs (the driver's barrier word per launch), or a barrier would pass early or never.
  const KernelConfig gs = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs");
  const SweepCase a = parse_sweep_line("1000x512x64 bf16 train");
  const SweepCase b = parse_sweep_line("1020x512x128 bf16 train momentum=none");
  const CaseInputs in_a = make_case_inputs(a), in_b = make_case_inputs(b);
  const Plan plan_a = forced_plan(a.problem, gs), plan_b = forced_plan(b.problem, gs);
  // Alone first: the expected bits.
  const Outcome alone_a = run_rows(plan_a, in_a, a.problem.M, true);
  const Outcome alone_b = run_rows(plan_b, in_b, b.problem.M, true);
  REQUIRE(!alone_a.coef_written);
  REQUIRE(!alone_b.coef_written);
  // Then 20 times each, interleaved on two streams, from the same starting state every time.
  DeviceBuffer ws_a(plan_a.workspace_size()), ws_b(plan_b.workspace_size());
  const Stream sa, sb;
  check_rounds_give_alone(
      20, in_a, alone_a.out, in_b, alone_b.out,
      [&](DeviceCase& da, DeviceCase& db) {
        plan_a.run(sa, da.tensors(), ws_a.get(), plan_a.workspace_size());
        plan_b.run(sb, db.tensors(), ws_b.get(), plan_b.workspace_size());
      },
      [&] {
        sa.synchronize();
        sb.synchronize();
      });
}

TEST_CASE(
    "recompute: back-to-back runs on one workspace each normalize with their own statistics") {
  // fj_gemm_affine is a programmatic dependent launch of fj_finalize, which lets it start at
  // once: its mainloops run beside the finalize, and it must wait for it before reading the
  // coefficients. Two runs of different data, queued back to back on one stream and one
  // workspace, would show an affine pass that did not wait: the second run's would read the
  // first run's coefficients, still in the workspace. Both runs must give what each gives alone.
  // 63 row tiles of 128: the cluster of two has a CTA past M. momentum=None: the finalize reads
  // the counter that the affine pass bumps.
  const SweepCase a = parse_sweep_line("8064x256x64 bf16 train momentum=none");
  const SweepCase b = parse_sweep_line("8064x256x64 bf16 train momentum=none non_centred");
  const CaseInputs in_a = make_case_inputs(a), in_b = make_case_inputs(b);
  std::vector<const char*> keys = {"tiled.64x64x64.w2x2.s3.g8.rc"};
  if (on_hopper()) {
    keys.push_back("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc");
    keys.push_back("warpspec.128x128x64.c2.s5.g8.cl2.p1.ts.rc");  // cluster and dependent launch
    keys.push_back("warpspec.128x128x64.c2.s5.g8.cl1.p1.pp.rc");  // each group waits itself
  }
  for (const char* key : keys) {
    CAPTURE(key);
    const Plan plan = forced_plan(a.problem, KernelConfig::parse(key));
    const Outcome alone_a = run_rows(plan, in_a, a.problem.M, true);
    const Outcome alone_b = run_rows(plan, in_b, b.problem.M, true);
    REQUIRE(alone_a.coef_written);
    // Different statistics, so reading the other run's coefficients would change y.
    REQUIRE(first_different_output(alone_a.out, alone_b.out) != "");
    DeviceBuffer ws(plan.workspace_size());
    ws.fill_bytes(0xFF);
    const Stream st;
    check_rounds_give_alone(
        10, in_a, alone_a.out, in_b, alone_b.out,
        [&](DeviceCase& da, DeviceCase& db) {
          plan.run(st, da.tensors(), ws.get(), plan.workspace_size());
          plan.run(st, db.tensors(), ws.get(), plan.workspace_size());
        },
        [&] { st.synchronize(); });
  }
}
