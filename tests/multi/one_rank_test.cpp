// Synchronized statistics on one GPU: a communicator of one rank. Its exchange is real (the
// records go through ncclAllGather and fj_rank_finalize), so this checks the whole synchronized
// schedule against the unsynchronized one, which one rank must reproduce:
//  - bit for bit where the unsynchronized run merges its row tiles with fj_finalize (more than
//    8 row tiles): y, saved, running and saved stats, the counter;
//  - against float64 where it does not (one row tile: single-pass; at most 8: fj_apply_fold);
//  - a rank with no rows: no GEMM, the counter counts the batch, and statistics of an empty
//    global batch are NaN, as documented;
//  - under CUDA graph capture, the all-gather included: two replays equal two direct runs.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/verify/verification.hpp"
#include "gpu_required.hpp"
#include "test_graph.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;
using fusejit::test::same_bits;

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) FAIL(what << " failed: " << ncclGetErrorString(r));
}

// A one-rank communicator on device 0 (the tests' primary context), destroyed with the test.
struct OneRankComm {
  ncclComm_t comm = nullptr;
  OneRankComm() {
    int dev = 0;
    check_nccl(ncclCommInitAll(&comm, 1, &dev), "ncclCommInitAll");
  }
  ~OneRankComm() {
    if (comm) ncclCommDestroy(comm);
  }
};

// A plan of `p` synchronized over the one-rank communicator (config: the dispatch's unless
// given).
Plan synced_plan(Problem p, ncclComm_t comm, std::optional<KernelConfig> config = {}) {
  p.stat_ranks = 1;
  PlanOptions o;
  o.config = config;
  o.stats_comm = comm;
  return Plan(p, o);
}

}  // namespace

TEST_CASE("one rank: bit-identical to the unsynchronized fj_finalize schedule, every dtype") {
  primary_context(0);
  OneRankComm comm;
  const Stream s;
  for (const char* dtype : {"bf16", "fp16", "tf32", "fp32"})
    for (const char* momentum : {"0.3", "none"}) {
      // 2000 rows: more than 8 row tiles for every config, so the unsynchronized run merges with
      // fj_finalize, whose order fj_rank_stats repeats.
      const SweepCase c =
          parse_sweep_line(fmt::format("2000x384x136 {} train momentum={}", dtype, momentum));
      CAPTURE(c.text());
      const CaseInputs in = make_case_inputs(c);
      CAPTURE(in.seed);
      // The default config with the schedule synchronized statistics repeat: storing y, then
      // fj_finalize and fj_apply (a recompute twin stores y from a second GEMM instead, and a
      // grid_sync one, which needs recompute, normalizes y in the GEMM itself).
      KernelConfig two_pass = Plan(c.problem).config();
      two_pass.recompute = false;
      two_pass.grid_sync = false;
      PlanOptions po;
      po.config = two_pass;
      const Plan plain(c.problem, po);
      const Plan sync = synced_plan(c.problem, comm.comm, plain.config());
      CAPTURE(plain.config().key());
      REQUIRE((c.problem.M + plain.config().bm - 1) / plain.config().bm > 8);
      DeviceCase a(in, true), b(in, true);
      plain.run(s, a.tensors());
      sync.run(s, b.tensors());
      s.synchronize();
      const CaseOutputs ga = a.download(), gb = b.download();
      REQUIRE(!ga.saved.empty());
      REQUIRE(!gb.saved.empty());
      CHECK(fusejit::test::first_different_output(ga, gb) == "");
      const ReferenceOutputs ref = reference_forward(
          reference_inputs(in), reference_settings(c.problem, in.num_batches_tracked));
      std::string why;
      CHECK_MESSAGE(passes(compare(in, gb, ref), sweep_threshold(c.problem.dtype), &why), why);
    }
}

TEST_CASE("one rank: one row tile and few row tiles (other merge orders) match float64") {
  primary_context(0);
  OneRankComm comm;
  const Stream s;
  for (const char* dtype : {"bf16", "fp32"})
    for (const int m : {2, 100, 600}) {
      const SweepCase c =
          parse_sweep_line(fmt::format("{}x200x72 {} train momentum=0.1", m, dtype));
      CAPTURE(c.text());
      const CaseInputs in = make_case_inputs(c);
      CAPTURE(in.seed);
      const Plan sync = synced_plan(c.problem, comm.comm);
      DeviceCase dev(in, true);
      sync.run(s, dev.tensors());
      s.synchronize();
      const ReferenceOutputs ref = reference_forward(
          reference_inputs(in), reference_settings(c.problem, in.num_batches_tracked));
      std::string why;
      CHECK_MESSAGE(
          passes(compare(in, dev.download(), ref), sweep_threshold(c.problem.dtype), &why), why);
    }
}

TEST_CASE("one rank with no rows: no GEMM, the batch counted, NaN statistics of an empty batch") {
  primary_context(0);
  OneRankComm comm;
  const Stream s;
  const SweepCase c = parse_sweep_line("300x96x64 bf16 train momentum=0.1");
  const CaseInputs in = make_case_inputs(c);
  const Plan sync = synced_plan(c.problem, comm.comm);
  DeviceCase dev(in, true);
  sync.run(s, dev.tensors(), 0);
  s.synchronize();
  const CaseOutputs got = dev.download();
  CHECK(got.num_batches_tracked == in.num_batches_tracked + 1);
  for (std::size_t n = 0; n < got.running_mean.size(); ++n) {
    CAPTURE(n);
    CHECK(std::isnan(got.running_mean[n]));
    CHECK(std::isnan(got.running_var[n]));
  }
  // y was not touched: still the poison DeviceCase wrote.
  for (const double v : got.y) REQUIRE(std::isnan(v));
}

TEST_CASE("one rank under CUDA graph capture: two replays equal two direct runs") {
  primary_context(0);
  OneRankComm comm;
  const Stream s;
  const SweepCase c = parse_sweep_line("1500x256x128 bf16 train momentum=none");
  const CaseInputs in = make_case_inputs(c);
  const Plan sync = synced_plan(c.problem, comm.comm);
  DeviceCase direct(in, true), replayed(in, true);
  sync.run(s, direct.tensors());
  sync.run(s, direct.tensors());
  s.synchronize();
  fusejit::test::replay_captured(
      s, [&] { sync.run(s, replayed.tensors()); }, 2);
  const CaseOutputs a = direct.download(), b = replayed.download();
  CHECK(same_bits(a.y, b.y));
  CHECK(same_bits(a.running_mean, b.running_mean));
  CHECK(same_bits(a.running_var, b.running_var));
  CHECK(a.num_batches_tracked == in.num_batches_tracked + 2);
  CHECK(b.num_batches_tracked == in.num_batches_tracked + 2);
}
