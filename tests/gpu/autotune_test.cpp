// The autotuner on a GPU: two small shapes tuned end to end, the recorded winner is what the
// next Plan dispatches to (and it computes the right thing), a deliberately wrong candidate is
// rejected by verification, a recorded reference-op winner run on two streams at once, the
// heuristic's reference-op pick without the database, tuning on first sight through
// PlanOptions::autotune, and the `fusejit autotune` command.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuner.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/log.hpp"
#include "gpu_required.hpp"
#include "tools/sweep.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;
using Status = CandidateOutcome::Status;

namespace {

std::string cache_dir() {
  const char* d = std::getenv("FUSEJIT_CACHE_DIR");  // per test executable (tests/CMakeLists.txt)
  return d ? d : "";
}

Problem problem(std::int64_t M, std::int64_t N, std::int64_t K, DType d, Mode m) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

// Few runs: these tests prove the mechanism, not the timings.
TunerOptions quick() {
  TunerOptions o;
  o.device = 0;
  o.cache_dir = cache_dir();
  o.target_ms = 20;
  o.max_runs = 20;
  o.seed = 0x5EED;
  return o;
}

PlanOptions plan_options() {
  PlanOptions o;
  o.device = 0;
  o.cache_dir = cache_dir();
  o.autotune = false;
  return o;
}

const CandidateOutcome* outcome(const TuneResult& r, const std::string& key) {
  for (const auto& c : r.candidates)
    if (c.key == key) return &c;
  return nullptr;
}

// A tuning entry whose winner is the reference op, as `fusejit autotune` records one.
bool record_reference_winner(const TuningDb& db, const Problem& p) {
  TuningEntry e;
  e.problem = p;
  e.winner = std::string(kReferenceCandidate);
  e.winner_ms = 0.1;
  e.reference_ms = 0.1;
  e.error = 1e-3;
  e.candidates = 1;
  e.timestamp = 1700000000;
  return db.record(e);
}

// The plan's output on fresh inputs against the float64 reference (the sweep's machinery).
double plan_error(const Plan& plan, const Problem& p) {
  SweepCase c;
  c.problem = p;
  const CaseInputs in = make_case_inputs(c, 77);
  DeviceCase d(in);
  FJ_CU(cuCtxSynchronize());  // DeviceCase's poison memsets run on the legacy stream
  const Stream s;
  plan.run(s, d.tensors());
  s.synchronize();
  const ReferenceOutputs ref =
      reference_forward(reference_inputs(in), reference_settings(p, in.num_batches_tracked));
  const CaseErrors e = compare(in, d.download(), ref);
  CHECK(!e.non_finite);
  CHECK(e.counter_ok);
  return e.worst();
}

// The plan runs what the entry says: its fused winner, or the reference op (reporting the
// best fused config).
void check_dispatches_to(const Plan& plan, const TuningEntry& e) {
  if (e.winner == kReferenceCandidate) {
    CHECK(plan.uses_reference());
    CHECK(plan.workspace_size() > 0);  // at least the per-column coefficients
    CHECK(plan.kernel_names().front() == "cublasLtMatmul");
    if (!e.best_fused.empty()) CHECK(plan.config().key() == e.best_fused);
  } else {
    CHECK(!plan.uses_reference());
    CHECK(plan.config().key() == e.winner);
  }
}

struct Cli {
  int code = -1;
  std::string out;
};

Cli run_cli(const std::string& args, bool with_stderr = true) {
  const char* cli = std::getenv("FUSEJIT_CLI");
  REQUIRE(cli);
  Cli r;
  FILE* f = popen(
      (std::string(cli) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  REQUIRE(f);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), f)) r.out += buf.data();
  const int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST_CASE("autotune two small shapes end to end; the next Plan runs the recorded winner") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  for (const Problem& p : {problem(256, 512, 256, DType::bf16, Mode::train),
                           problem(128, 384, 512, DType::fp16, Mode::eval)}) {
    CAPTURE(p.key());
    const TuneResult r = tune(p, quick());
    MESSAGE(format_shape(p.shape()), " ", name(p.dtype), " ", name(p.mode), ": ", r.entry.winner,
            " ", r.entry.winner_ms, " ms (cuBLASLt ", r.entry.reference_ms.value_or(-1),
            " ms), runner-up ", r.entry.runner_up, "; tuned in ", r.seconds, " s (compile ",
            r.compile_seconds, " s)");
    CHECK(r.recorded);
    CHECK(r.db_path == db.path().string());
    // Every candidate was considered: the configs of both variants (where the GPU has them)
    // and the reference op, which ran and was timed.
    CHECK(r.candidates.size() == tuning_candidates(p, dev).size());
    CHECK(r.entry.candidates == static_cast<int>(r.candidates.size()));
    CHECK(r.entry.reference_ms.has_value());
    const CandidateOutcome* w = outcome(r, r.entry.winner);
    REQUIRE(w);
    CHECK(w->status == Status::verified);
    CHECK(w->error < sweep_threshold(p.dtype));
    CHECK(w->median_ms == r.entry.winner_ms);
    // The winner is the fastest candidate that was verified, and nothing faster was left out
    // unverified.
    for (const auto& c : r.candidates) {
      if (c.key == r.entry.winner) break;
      CHECK(c.status == Status::rejected);
    }
    for (const auto& c : r.candidates)
      if (c.median_ms && c.status != Status::rejected) CHECK(*c.median_ms >= r.entry.winner_ms);
    // The close ones were timed again side by side (TunerOptions::final_ratio): more runs than
    // one candidate's first pass may take, never for a dropped one, and never for one alone.
    int re_timed = 0;
    for (const auto& c : r.candidates)
      if (c.runs > quick().max_runs) {
        ++re_timed;
        CHECK(c.status != Status::dropped);
      }
    MESSAGE(re_timed, " candidates re-timed side by side");
    CHECK(re_timed != 1);

    // Recorded...
    const auto e = db.find(p);
    REQUIRE(e);
    CHECK(e->winner == r.entry.winner);
    CHECK(e->winner_ms == r.entry.winner_ms);
    // ...and what the next plan runs, correctly, with plan creation in milliseconds.
    const Plan plan(p, plan_options());
    CHECK(plan.dispatch() == "tuned");
    check_dispatches_to(plan, *e);
    CHECK(plan_error(plan, p) < sweep_threshold(p.dtype));
    const auto t0 = std::chrono::steady_clock::now();
    const Plan again(p, plan_options());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("plan creation with a warm cache and database: ", ms, " ms");
    CHECK(ms < 200);
    check_dispatches_to(again, *e);
    // Forcing a variant or ignoring the database bypasses the entry.
    PlanOptions heuristic = plan_options();
    heuristic.use_tuning_db = false;
    const Plan h(p, heuristic);
    CHECK(h.dispatch() == "heuristic");
    CHECK(h.config().key() == default_config(p, dev).key());
  }
}

TEST_CASE("a fast but wrong candidate is rejected by verification and the next best recorded") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  const Problem p = problem(256, 256, 384, DType::bf16, Mode::eval);

  TunerOptions o = quick();
  o.inject_wrong_candidate = "fastest";
  const auto warnings = log_warning_count();
  const TuneResult r = tune(p, o);
  REQUIRE(!r.candidates.empty());
  const CandidateOutcome& fastest = r.candidates.front();  // sorted by time
  CAPTURE(fastest.key);
  CHECK(fastest.status == Status::rejected);
  CHECK(fastest.message.find("verification") != std::string::npos);
  CHECK(fastest.error > sweep_threshold(p.dtype));
  CHECK(log_warning_count() > warnings);  // a wrong kernel is worth a warning
  CHECK(r.entry.winner != fastest.key);
  const CandidateOutcome* w = outcome(r, r.entry.winner);
  REQUIRE(w);
  CHECK(w->status == Status::verified);
  CHECK(r.candidates[1].key == r.entry.winner);  // the next best, since it is right
  const auto recorded = db.find(p);
  REQUIRE(recorded);
  CHECK(recorded->winner == r.entry.winner);

  // Naming the candidate instead: whatever the timings do, it is never the one recorded.
  o.inject_wrong_candidate = r.entry.winner;
  const TuneResult r2 = tune(p, o);
  CHECK(r2.entry.winner != r.entry.winner);
  const CandidateOutcome* named = outcome(r2, r.entry.winner);
  REQUIRE(named);
  CHECK(named->status != Status::verified);
  const auto again = db.find(p);
  REQUIRE(again);
  CHECK(again->winner == r2.entry.winner);
}

// A tuning entry whose winner is the reference op makes every Plan of the problem run it, and
// a Plan may run on several streams at once when each has its own workspace: the reference op
// must then keep everything of a run (cuBLASLt's workspace, its per-column coefficients, its
// fp32 copy of the GEMM output) in that workspace, not in buffers of its own.
TEST_CASE("a Plan running the recorded reference op: two streams, own workspaces, right results") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  // 16-bit y, so the fp32 GEMM output lives in the workspace too; train, so the coefficients
  // depend on each run's own batch.
  const SweepCase c = parse_sweep_line("1000x640x512 bf16 train");
  REQUIRE(record_reference_winner(db, c.problem));
  const Plan plan(c.problem, plan_options());
  REQUIRE(plan.uses_reference());
  const std::size_t need = plan.workspace_size();
  CHECK(need >= static_cast<std::size_t>(c.problem.M * c.problem.N + 3 * c.problem.N) * 4);

  constexpr int kStreams = 2, kRuns = 3;
  std::vector<CaseInputs> in;
  std::vector<std::unique_ptr<DeviceCase>> dev_case;
  std::vector<DeviceBuffer> ws;
  std::vector<Stream> streams;
  for (int i = 0; i < kStreams; ++i) {
    in.push_back(make_case_inputs(c, 0xC0FFEEu + static_cast<std::uint64_t>(i)));
    dev_case.push_back(std::make_unique<DeviceCase>(in.back()));
    ws.emplace_back(need);
    streams.emplace_back();
  }
  FJ_CU(cuCtxSynchronize());  // DeviceCase's poison memsets run on the legacy stream
  // Interleaved and unsynchronized: a buffer shared between the streams' runs would mix them.
  for (int r = 0; r < kRuns; ++r)
    for (int i = 0; i < kStreams; ++i)
      plan.run(streams[i], dev_case[i]->tensors(), ws[i].get(), need);
  for (const Stream& s : streams) s.synchronize();
  for (int i = 0; i < kStreams; ++i) {
    CAPTURE(i);
    ReferenceInputs ref_in = reference_inputs(in[i]);
    ReferenceSettings settings = reference_settings(c.problem, in[i].num_batches_tracked);
    ReferenceOutputs ref;
    for (int r = 0; r < kRuns; ++r) {
      ref = reference_forward(ref_in, settings);
      ref_in.running_mean = ref.running_mean;
      ref_in.running_var = ref.running_var;
      settings.num_batches_tracked = ref.num_batches_tracked;
    }
    const CaseErrors err = compare(in[i], dev_case[i]->download(), ref);
    CHECK(!err.non_finite);
    CHECK(err.worst() < sweep_threshold(c.problem.dtype));
  }

  // The workspace is checked like a fused plan's.
  for (const auto& [ptr, bytes] :
       {std::pair<void*, std::size_t>{nullptr, 0},
        std::pair<void*, std::size_t>{ws[0].get(), need - 1},
        std::pair<void*, std::size_t>{static_cast<char*>(ws[0].get()) + 16, need}}) {
    try {
      plan.run(streams[0], dev_case[0]->tensors(), ptr, bytes);
      FAIL("a bad workspace was accepted");
    } catch (const InvalidArgument& x) {
      CHECK(x.argument() == "workspace");
    }
  }
}

// A recorded reference winner on a shape where cuBLASLt runs M rows only (ReferenceOp::
// runs_fewer_rows false: N = 1 with padded strides on H200): M rows on the reference op, fewer
// on the plan's fused config, one workspace that serves both, right results either way.
TEST_CASE("a Plan running the recorded reference op: fewer rows where cuBLASLt runs M only") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  const SweepCase c = parse_sweep_line("128x1x1000 bf16 eval ldx=1008 ldw=1016 ldy=16");
  const ReferenceOp op(c.problem);
  if (op.runs_fewer_rows()) {
    MESSAGE("this cuBLASLt runs fewer rows of " << c.text() << ": nothing to fall back from");
    return;
  }
  REQUIRE(record_reference_winner(db, c.problem));
  const Plan plan(c.problem, plan_options());
  REQUIRE(plan.uses_reference());
  PlanOptions forced = plan_options();
  forced.config = plan.config();
  const Plan fused(c.problem, forced);
  CHECK(plan.workspace_size() >= op.workspace_size());
  CHECK(plan.workspace_size() >= fused.workspace_size());
  for (const std::int64_t rows : {c.problem.M, c.problem.M / 2 + 1}) {
    CAPTURE(rows);
    SweepCase run_case = c;
    run_case.problem.M = rows;
    const CaseInputs in = make_case_inputs(run_case, 91);
    DeviceCase d(in);
    FJ_CU(cuCtxSynchronize());  // DeviceCase's poison memsets run on the legacy stream
    const Stream s;
    plan.run(s, d.tensors(), rows);
    s.synchronize();
    const ReferenceOutputs ref = reference_forward(
        reference_inputs(in), reference_settings(run_case.problem, in.num_batches_tracked));
    const CaseErrors err = compare(in, d.download(), ref);
    std::string why;
    CHECK_MESSAGE(passes(err, sweep_threshold(c.problem.dtype), &why), why);
  }
}

// The dispatch's last step runs the reference op for large strict-fp32 problems; a Plan that
// ignores the tuning database takes that same step rather than a different default.
TEST_CASE("use_tuning_db = false: a large strict-fp32 problem runs the reference op, correctly") {
  primary_context(0);
  const Device dev = Device::get(0);
  const SweepCase c = parse_sweep_line("2048x2048x1024 fp32 train");
  REQUIRE(heuristic_prefers_reference(c.problem));
  PlanOptions o = plan_options();
  o.use_tuning_db = false;
  const Plan plan(c.problem, o);
  CHECK(plan.dispatch() == "heuristic");
  CHECK(plan.uses_reference());
  CHECK(plan.kernel_names().front() == "cublasLtMatmul");
  CHECK(plan_error(plan, c.problem) < sweep_threshold(c.problem.dtype));
  // Forcing the variant still runs the fused kernels.
  PlanOptions forced = o;
  forced.variant = default_config(c.problem, dev).variant;
  const Plan fused(c.problem, forced);
  CHECK(!fused.uses_reference());
  CHECK(fused.kernel_names().front() != "cublasLtMatmul");
}

TEST_CASE("PlanOptions::autotune tunes on first sight; neighbours use the bucket") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  const Problem p = problem(192, 320, 256, DType::bf16, Mode::train);
  // The cache directory outlives the test run: start this one from an empty database.
  std::filesystem::remove(db.path());
  REQUIRE(!db.find(p));
  PlanOptions o = plan_options();
  o.autotune = true;
  const Plan plan(p, o);
  CHECK(plan.dispatch() == "autotuned");
  const auto e = db.find(p);
  REQUIRE(e);
  check_dispatches_to(plan, *e);
  CHECK(plan_error(plan, p) < sweep_threshold(p.dtype));
  const Plan again(p, o);  // now an exact entry: no second tuning
  CHECK(again.dispatch() == "tuned");

  // An untuned neighbour (within 4x per dimension, same kind) without autotuning: the
  // nearest entry's winner where it can run the problem, else the heuristic.
  Problem q = p;
  q.M = 200;
  q.N = 300;
  const KernelChoice expect = choose_from_table(*db.table(), q, dev);
  const Plan near(q, plan_options());
  CHECK(near.dispatch() == std::string(name(expect.source)));
  CHECK((near.dispatch() == "bucket" || near.dispatch() == "heuristic"));
  CHECK(near.config().key() == expect.config.key());
  CHECK(plan_error(near, q) < sweep_threshold(q.dtype));
}

TEST_CASE("fusejit autotune: JSON results match the database; the table otherwise") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  const Cli j = run_cli(
      "autotune --shapes 256x512x256 --dtypes bf16 --modes train --json "
      "--cache-dir " +
          cache_dir(),
      false);
  REQUIRE_MESSAGE(j.code == 0, j.out);
  const nlohmann::json out = nlohmann::json::parse(j.out);
  REQUIRE(out["results"].size() == 1);
  const auto& res = out["results"][0];
  CHECK(out["database"] == db.path().string());
  CHECK(res["recorded"] == true);
  const Problem p = problem(256, 512, 256, DType::bf16, Mode::train);
  CHECK(res["problem"] == p.key());
  const auto e = db.find(p);
  REQUIRE(e);
  CHECK(e->winner == res["winner"].get<std::string>());
  CHECK(res["candidates"].size() == tuning_candidates(p, dev).size());

  const Cli t = run_cli("autotune --shapes 128x384x512 --dtypes fp16 --modes eval --cache-dir " +
                        cache_dir());
  REQUIRE_MESSAGE(t.code == 0, t.out);
  CHECK(t.out.find("vs cuBLASLt") != std::string::npos);
  CHECK(t.out.find("runner-up") != std::string::npos);
  CHECK(t.out.find("[1/1] 128x384x512 fp16 eval: compiling") != std::string::npos);  // not a tty
  CHECK(t.out.find('\r') == std::string::npos);
  CHECK(t.out.find(db.path().string()) != std::string::npos);
}
