// KernelConfig::overlap_apply (train, two-pass, persistent warpspec): fj_gemm goes out alone as a
// cooperative launch, walks the tiles column panel by column panel, merges each finished panel's
// partials in fj_finalize's order and rewrites its y with fj_apply's arithmetic while later
// panels are multiplied. It must give the two-pass schedule's outputs bit for bit (same tiles,
// same partials, same merge, same affine on the same stored y) whichever way a run goes:
//  - in the kernel: proven by the counters the kernel zeroes and fills (every panel counted
//    row-tiles times, marked ready and merged once, every unit claimed), which keep their
//    poison when it does not run that way;
//  - a cooperative launch the driver refuses (fault injection): the two-pass passes;
//  - captured in a CUDA graph and replayed with momentum=None (the counter bumped by the last
//    panel's merge, after every merge read it);
//  - multi-wave grids (many panels and row tiles per CTA), tails in M and N, no bias / no
//    affine, strided x, columns whose mean is far above their spread.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

Plan forced_plan(const Problem& p, const KernelConfig& config) {
  return fusejit::test::forced_plan(p, config, false);
}

KernelConfig two_pass_twin(KernelConfig c) {
  c.overlap_apply = false;
  return c;
}

struct Outcome {
  CaseOutputs out;
  std::vector<unsigned> counters;  // the overlap region after the run (empty: none)
};

// `rows` rows of `in` through `plan` on a poisoned caller workspace.
Outcome run_rows(const Plan& plan, const CaseInputs& in, std::int64_t rows, bool with_saved) {
  const fusejit::test::PoisonedRun r = fusejit::test::run_poisoned(plan, in, rows, with_saved);
  const WorkspaceLayout layout = workspace_layout(plan.problem(), plan.config());
  return {r.out, r.region<unsigned>(layout.overlap_offset, layout.overlap_bytes)};
}

// The counters a run that applied in the kernel leaves (OverlapCounters): per column tile its
// row tiles counted and its merge strips (32 columns each) done, every queue item claimed (each
// claimant's last claim overshoots), every strip merged.
bool applied_in_kernel(const Outcome& o, const KernelConfig& c, std::int64_t rows, int n) {
  const auto row_tiles = static_cast<unsigned>((rows + c.bm - 1) / c.bm);
  const auto col_tiles = static_cast<unsigned>((n + c.bn - 1) / c.bn);
  const auto strips = static_cast<unsigned>(c.bn / 32);
  REQUIRE(o.counters.size() == 2 * col_tiles + 2);
  for (unsigned i = 0; i < col_tiles; ++i)
    if (o.counters[i] != row_tiles || o.counters[col_tiles + i] != strips) return false;
  return o.counters[2 * col_tiles] >= col_tiles * (strips + row_tiles) &&
         o.counters[2 * col_tiles + 1] == col_tiles * strips;
}

void check_against_float64(const CaseInputs& in, const CaseOutputs& got, std::int64_t rows) {
  std::string why;
  CHECK_MESSAGE(fusejit::test::rows_pass_float64(in, got, rows, &why), why);
}

// All of `in` through `oa` and its two-pass twin: the same bits, and the kernel did the apply.
Outcome check_same_as_two_pass(const KernelConfig& oa, const CaseInputs& in, bool with_saved) {
  const Problem& p = in.c.problem;
  const Outcome one = run_rows(forced_plan(p, oa), in, p.M, with_saved);
  const Outcome two = run_rows(forced_plan(p, two_pass_twin(oa)), in, p.M, with_saved);
  CHECK_MESSAGE(applied_in_kernel(one, oa, p.M, static_cast<int>(p.N)),
                "the overlap counters do not show an in-kernel apply");
  CHECK(two.counters.empty());
  CHECK(first_different_output(one.out, two.out) == "");
  return one;
}

struct Keyed {
  const char* dtype;
  const char* key;
};
// TMA stores (16-bit and fp32 y), thread stores, one consumer, tf32; 64- to 256-column tiles
// (2 to 8 merge strips per panel); groups of 1 to 4 column tiles.
constexpr Keyed kConfigs[] = {
    {"bf16", "warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa"},
    {"fp16", "warpspec.128x128x64.c2.s5.g2.cl1.p1.oa"},
    {"bf16", "warpspec.64x128x64.c1.s6.g3.cl1.p1.oa"},
    {"tf32", "warpspec.128x128x32.c2.s6.g1.cl1.p1.oa"},
    {"tf32", "warpspec.128x256x32.c2.s4.g2.cl1.p1.ts.oa"},
    {"bf16", "warpspec.128x64x64.c2.s6.g4.cl1.p1.oa"},
};

}  // namespace

TEST_CASE("overlap_apply: the in-kernel apply gives the two-pass outputs bit for bit") {
  if (!on_hopper()) return;  // overlap_apply runs the warpspec kernel
  const Device dev = Device::current();
  for (const Keyed& k : kConfigs) {
    const bool tf32 = std::string(k.dtype) == "tf32";
    // One wave with tails in M, N and K; several waves of many panels (N tail, ~2-8 tiles per
    // CTA); momentum=None; no bias, no affine.
    for (const char* shape : {"1100x328x", "4100x1000x", "3000x2056x"}) {
      for (const char* tail : {"", " momentum=none", " nobias noaffine"}) {
        if (std::string(shape) != "1100x328x" && *tail) continue;
        const std::string line =
            fmt::format("{}{} {} train{}", shape, tf32 ? 100 : 72, k.dtype, tail);
        CAPTURE(line);
        CAPTURE(k.key);
        const SweepCase c = parse_sweep_line(line);
        const KernelConfig oa = KernelConfig::parse(k.key);
        REQUIRE_MESSAGE(oa.valid_for(c.problem, dev), oa.why_invalid(c.problem, dev));
        const CaseInputs in = make_case_inputs(c);
        CAPTURE(in.seed);
        for (const bool with_saved : {true, false}) {
          const Outcome one = check_same_as_two_pass(oa, in, with_saved);
          CHECK(one.out.saved.empty() != with_saved);
          if (with_saved) check_against_float64(in, one.out, c.problem.M);
        }
      }
    }
  }
  // Strided x, and columns whose mean is ~1000 times their spread.
  const std::string line = "2100x1000x72 bf16 train ldx=88";
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const KernelConfig oa = KernelConfig::parse("warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa");
  REQUIRE(oa.valid_for(c.problem, dev));
  for (const bool large_mean : {false, true}) {
    CAPTURE(large_mean);
    CaseInputs in = make_case_inputs(c);
    if (large_mean) make_x_large_mean(in);
    const Outcome one = check_same_as_two_pass(oa, in, true);
    CHECK(std::count_if(one.out.y.begin(), one.out.y.end(),
                        [](double v) { return !std::isfinite(v); }) == 0);
    if (!large_mean) check_against_float64(in, one.out, c.problem.M);
  }
}

TEST_CASE("overlap_apply: fewer rows than the plan's, and a refused cooperative launch") {
  if (!on_hopper()) return;
  const Device dev = Device::current();
  const std::string line = "5000x768x64 bf16 train momentum=none";
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const KernelConfig oa = KernelConfig::parse("warpspec.128x256x64.c2.s4.g2.cl1.p1.ts.oa");
  REQUIRE(oa.valid_for(c.problem, dev));
  const Plan one = forced_plan(c.problem, oa);
  const Plan two = forced_plan(c.problem, two_pass_twin(oa));
  const CaseInputs in = make_case_inputs(c);
  for (const std::int64_t rows : {std::int64_t{300}, std::int64_t{2049}, c.problem.M}) {
    CAPTURE(rows);
    const Outcome a = run_rows(one, in, rows, true);
    const Outcome b = run_rows(two, in, rows, true);
    CHECK(applied_in_kernel(a, oa, rows, static_cast<int>(c.problem.N)));
    CHECK(first_different_output(a.out, b.out) == "");
    check_against_float64(in, a.out, rows);
  }
  // The driver refusing the cooperative launch: the same run takes fj_finalize and fj_apply, and
  // the counters keep their poison.
  fault::disarm_all();
  const int before = fault::fired(Fault::cooperative_too_large);
  fault::arm(Fault::cooperative_too_large, 1);
  const Outcome refused = run_rows(one, in, 2049, true);
  fault::disarm_all();
  CHECK(fault::fired(Fault::cooperative_too_large) == before + 1);
  CHECK(std::all_of(refused.counters.begin(), refused.counters.end(),
                    [](unsigned v) { return v == 0xFFFFFFFFu; }));
  const Outcome applied = run_rows(one, in, 2049, true);
  CHECK(applied_in_kernel(applied, oa, 2049, static_cast<int>(c.problem.N)));
  CHECK(first_different_output(refused.out, applied.out) == "");
}

TEST_CASE("overlap_apply: a captured run replays, counting every batch once") {
  if (!on_hopper()) return;
  // momentum=None: each replay's merges read the counter the previous replay bumped, and the
  // counters start from zero in every replay (the kernel zeroes them, not a memset).
  const std::string line = "3000x1024x64 bf16 train momentum=none";
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const KernelConfig oa = KernelConfig::parse("warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa");
  const CaseInputs in = make_case_inputs(c);
  constexpr int kReplays = 3;
  std::vector<CaseOutputs> outs;
  bool replayed_in_kernel = false;  // the last replay's counters, poisoned before the capture
  for (const KernelConfig& config : {oa, two_pass_twin(oa)}) {
    const Plan plan = forced_plan(c.problem, config);
    DeviceCase dc(in, true);
    DeviceBuffer ws(plan.workspace_size());
    ws.fill_bytes(0xFF);
    const Stream st;
    replay_captured(
        st, [&] { plan.run(st, dc.tensors(), ws.get(), plan.workspace_size()); }, kReplays);
    outs.push_back(dc.download());
    if (config.overlap_apply) {
      Outcome o;
      const WorkspaceLayout layout = workspace_layout(plan.problem(), plan.config());
      o.counters.resize(layout.overlap_bytes / 4);
      ws.download(o.counters.data(), layout.overlap_bytes, layout.overlap_offset);
      replayed_in_kernel = applied_in_kernel(o, oa, c.problem.M, static_cast<int>(c.problem.N));
    }
  }
  CHECK(outs[0].num_batches_tracked == in.num_batches_tracked + kReplays);
  CHECK(replayed_in_kernel);
  CHECK(first_different_output(outs[0], outs[1]) == "");
}
