// The autotuner: measure every kernel fusejit could run for a problem on this GPU, plus the
// cuBLASLt reference op as a contender (so the recorded choice is never slower than the
// obvious alternative), verify the fastest against the float64 reference, record it.
//
//   1. candidates: candidate_configs(problem, device) (both variants where they apply) and
//      "reference" (ReferenceOp);
//   2. compile every candidate in parallel, one NVRTC job per core (the disk cache dedupes);
//   3. time each on random data of the real shape with CUDA events: warm-up, then `min_runs`
//      runs; a candidate whose median is then above drop_ratio x the best so far is dropped
//      (early exit), the others run until ~target_ms of timed work; those within final_ratio
//      of the best are then timed again in interleaved rounds, every one once per round, and
//      ranked by the median of their round medians (the one reported);
//   4. verify in order of time against the float64 reference (check/sweep.hpp's inputs,
//      thresholds and comparison; see verification_columns) until one passes: the winner. A
//      fast but wrong candidate is rejected (with a warning) and the next best is recorded;
//   5. record the entry in the device's TuningDb.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/device.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tune/tuning_db.hpp"

namespace fusejit {

// What tune() reports while it works (for progress bars).
struct TuneProgress {
  enum class Stage { compiling, timing, verifying, done };
  Stage stage = Stage::compiling;
  std::size_t done = 0, total = 0;  // candidates compiled / timed / verified so far, of total
  std::string candidate;            // the one just finished (or being verified)
};

struct TunerOptions {
  int device = 0;         // GPU ordinal (its primary context)
  std::string cache_dir;  // kernels and the tuning database; empty: DiskCache::default_dir()
  bool record = true;     // write the winner to the tuning database
  bool include_reference = true;  // time the cuBLASLt reference op as a contender
  unsigned compile_threads = 0;   // 0: one per core
  int warmup = 3;
  int min_runs = 5;  // timed runs before the early-exit check
  int max_runs = 50;
  double target_ms = 100;  // timed work per surviving candidate: runs = target / median
  double drop_ratio = 1.5;
  // Consecutive timings of the same kernel on an H100 differed by up to 10% (its clocks move
  // under the power limit while GEMMs run back to back), enough to crown whichever close
  // candidate happened to run in a fast moment: the close ones are re-timed side by side.
  double final_ratio = 1.15;
  int final_rounds = 9;
  std::optional<std::uint64_t> seed;  // inputs; default: a fresh seed
  // Test hook: wraps one candidate's verification run so that it corrupts its output afterwards
  // (y in the forward tuner, dx in the backward one: a kernel that is fast and wrong). A candidate
  // key, "reference", or "fastest" (whichever candidate timed fastest). Timing runs are not
  // wrapped, so it stays as fast as it was.
  std::string inject_wrong_candidate;
  std::function<void(const TuneProgress&)> on_progress;
};

struct CandidateOutcome {
  enum class Status {
    timed,     // measured; not verified (slower than the winner)
    dropped,   // early exit: median after min_runs above drop_ratio x the best
    failed,    // did not compile, build or run (message)
    rejected,  // verification failed (message, error)
    verified,  // passed verification (the winner, and the best fused one if the reference won)
  };
  std::string key;  // KernelConfig::key() or "reference"
  Status status = Status::failed;
  std::optional<double> median_ms;
  int runs = 0;
  double error = 0;  // worst relative error when verified or rejected
  std::string message;
};
std::string_view name(CandidateOutcome::Status);

struct TuneResult {
  TuningEntry entry;
  std::vector<CandidateOutcome> candidates;  // fastest first; failed ones last
  double seconds = 0;                        // wall time of the whole tune
  double compile_seconds = 0;                // wall time of the parallel compile stage
  bool recorded = false;                     // written to the database file
  std::string db_path;
};

// The candidates tune() considers, in the order it times them: the heuristic's choice, the
// reference contender (when included), then the other configs of candidate_configs().
std::vector<std::string> tuning_candidates(const Problem& p, const Device& d,
                                           bool include_reference = true);
// Their kernel sources, in the same order: what tune() compiles, so that `fusejit compile
// --variant all` can fill a cache ahead of time (no GPU needed) and a tune then only times.
std::vector<KernelSource> tuning_sources(const Problem& p, const Device& d,
                                         bool include_reference = true);

// The output columns verification compares. All of them while M x N x K <= budget multiply-
// adds; beyond that the float64 reference would take minutes, so a subset: the first and last
// 8 columns, both sides of every 64-column boundary among the first 8, and the rest spread
// evenly, at least 64 and as many as the budget allows. A column of y depends on W's row and
// all of x only, so the subset is checked exactly, statistics included.
inline constexpr std::int64_t kVerifyBudget = std::int64_t{1} << 30;
std::vector<std::int64_t> verification_columns(const Problem& p,
                                               std::int64_t budget = kVerifyBudget);

// Tunes `p` on GPU options.device and (options.record) records the winner. Throws
// InvalidArgument for a bad problem, UnsupportedDevice without a GPU, Error when no candidate
// passes verification (nothing is recorded then).
TuneResult tune(const Problem& p, const TunerOptions& options = {});

}  // namespace fusejit
