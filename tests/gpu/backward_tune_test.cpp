// `fusejit autotune --backward` on a GPU: a layer's gradient GEMMs tuned end to end, the winner
// recorded in the database's backward entries and run by the next BackwardPlan of the layer
// (and of another M of its class), its gradients right against float64; a fast but wrong
// candidate rejected by the tuner's verification; the command's JSON.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "fusejit/backward.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/tune/backward_tuner.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/log.hpp"
#include "gpu_required.hpp"
#include "tools/backward_check.hpp"
#include "tools/sweep.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;
using Status = CandidateOutcome::Status;

namespace {

std::string cache_dir() {
  const char* d = std::getenv("FUSEJIT_CACHE_DIR");  // per test executable (tests/CMakeLists.txt)
  return d ? d : "";
}

// Few runs: these tests prove the mechanism, not the timings.
TunerOptions quick() {
  TunerOptions o;
  o.device = 0;
  o.cache_dir = cache_dir();
  o.target_ms = 10;
  o.max_runs = 10;
  o.final_rounds = 3;
  o.seed = 0xB4C5;
  return o;
}

const CandidateOutcome* outcome(const TuneResult& r, const std::string& key) {
  for (const auto& c : r.candidates)
    if (c.key == key) return &c;
  return nullptr;
}

// Every gradient of a BackwardPlan made with the case's cache (no forced tiles: the dispatch
// chooses) against float64, through the checker `fusejit check --backward` runs.
BackwardCheckResult plan_check(const SweepCase& c, std::int64_t rows = 0) {
  BackwardCheckOptions o;
  o.cache_dir = cache_dir();
  o.rows = rows;
  return check_backward_case(c, o);
}

}  // namespace

TEST_CASE("autotune --backward: the winner is recorded, verified and run by the next plans") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  for (const std::string line : {"384x256x192 bf16 train", "200x136x96 fp16 eval"}) {
    const SweepCase c = parse_sweep_line(line);
    const Problem& p = c.problem;
    CAPTURE(line);
    const TuneResult r = tune_backward(p, quick());
    MESSAGE(line, ": ", r.entry.winner, " ", r.entry.winner_ms, " ms, runner-up ",
            r.entry.runner_up, "; ", r.candidates.size(), " candidates in ", r.seconds,
            " s (compile ", r.compile_seconds, " s)");
    CHECK(r.recorded);
    const std::vector<BackwardConfig> listed = backward_tuning_configs(p, dev);
    // Every listed pair was considered, plus at most the pair of the two fastest GEMMs.
    CHECK(r.candidates.size() >= listed.size());
    CHECK(r.candidates.size() <= listed.size() + 1);
    CHECK(outcome(r, plan_backward_config(p, default_backward_config(p, dev), dev).key()));
    CHECK(!r.entry.reference_ms);
    const CandidateOutcome* w = outcome(r, r.entry.winner);
    REQUIRE(w);
    CHECK(w->status == Status::verified);
    CHECK(w->error < sweep_threshold(p.dtype));
    CHECK(w->median_ms == r.entry.winner_ms);
    for (const auto& k : r.candidates)
      if (k.median_ms && k.status != Status::rejected) CHECK(*k.median_ms >= r.entry.winner_ms);

    const auto e = db.find(p, TunedPass::backward);
    REQUIRE(e);
    CHECK(e->winner == r.entry.winner);
    CHECK(!db.find(p, TunedPass::forward).has_value());  // the forward's entries untouched
    const BackwardChoice choice = choose_backward(p, dev, cache_dir());
    CHECK(choice.source == KernelChoice::Source::exact);
    CHECK(choice.config.key() == e->winner);

    BackwardOptions bo;
    bo.cache_dir = cache_dir();
    const BackwardPlan plan(p, bo);
    CHECK(plan.config_key() == e->winner);
    CHECK(plan.dispatch() == "tuned");
    BackwardOptions forced = bo;
    forced.dx_config = default_backward_config(p, dev).dx;
    CHECK(BackwardPlan(p, forced).dispatch() == "config");
    const BackwardCheckResult got = plan_check(c);
    CHECK(got.config == e->winner);
    std::string why;
    CHECK_MESSAGE(passes(got, sweep_threshold(p.dtype), &why), why);

    // Another M of the same class shares the entry (and its kernel set).
    Problem q = p;
    q.M = p.M - 17;
    REQUIRE(m_class(q.M).lo == m_class(p.M).lo);
    const BackwardChoice shared = choose_backward(q, dev, cache_dir());
    CHECK(shared.source == KernelChoice::Source::m_class);
    CHECK(shared.config.key() == e->winner);
    CHECK(BackwardPlan(q, bo).dispatch() == "m-class");
    SweepCase cq = c;
    cq.problem = q;
    const BackwardCheckResult got_q = plan_check(cq);
    CHECK(got_q.config == e->winner);
    CHECK_MESSAGE(passes(got_q, sweep_threshold(p.dtype), &why), why);
  }
}

TEST_CASE("autotune --backward rejects a fast but wrong candidate and records the next best") {
  primary_context(0);
  const Device dev = Device::get(0);
  const TuningDb db = TuningDb::for_device(dev, cache_dir());
  const Problem p = parse_sweep_line("256x128x160 bf16 train").problem;
  TunerOptions o = quick();
  o.inject_wrong_candidate = "fastest";
  const auto warnings = log_warning_count();
  const TuneResult r = tune_backward(p, o);
  REQUIRE(r.candidates.size() >= 2);
  const CandidateOutcome& fastest = r.candidates.front();  // sorted by time
  CAPTURE(fastest.key);
  CHECK(fastest.status == Status::rejected);
  CHECK(fastest.message.find("dx error") != std::string::npos);
  CHECK(log_warning_count() > warnings);
  CHECK(r.entry.winner != fastest.key);
  CHECK(r.candidates[1].key == r.entry.winner);
  const auto recorded = db.find(p, TunedPass::backward);
  REQUIRE(recorded);
  CHECK(recorded->winner == r.entry.winner);
}

TEST_CASE("fusejit autotune --backward --json") {
  const char* cli = std::getenv("FUSEJIT_CLI");
  REQUIRE(cli);
  const std::string cmd = std::string(cli) + " autotune --backward --shapes 130x64x72 " +
                          "--dtypes bf16 --modes train --target-ms 5 --json --cache-dir '" +
                          cache_dir() + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), f)) out += buf.data();
  const int status = pclose(f);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const auto j = nlohmann::json::parse(out);
  REQUIRE(j["results"].size() == 1);
  const auto& res = j["results"][0];
  CHECK(res["pass"] == "backward");
  CHECK(res["winner"].get<std::string>().starts_with("dx."));
  CHECK(res["heuristic_ms"].is_number());
  CHECK(res["vs_heuristic"].get<double>() <= 1.0 + 1e-9);  // the heuristic is a candidate
  CHECK(res["recorded"] == true);
}
