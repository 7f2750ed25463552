// The tuner's two shared stages, for Plan's candidates (tuner.cpp) and BackwardPlan's
// (backward_tuner.cpp) alike: compile every candidate's kernels in parallel, then time them
// the one way fusejit times kernels (EventTimer, rotating input sets): an early exit for the
// clearly slower ones, and the close ones again side by side.
#pragma once
#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/tune/tuner.hpp"

namespace fusejit {

// The first line of an error message (what a candidate's outcome keeps).
std::string first_line(const std::string& s);

double seconds_since(std::chrono::steady_clock::time_point t0);

// Calls o.on_progress, if any.
void report(const TunerOptions& o, TuneProgress::Stage stage, std::size_t done, std::size_t total,
            const std::string& candidate);

// Held while a tuning measures (times and verifies): tunings started from several threads (plans
// made concurrently with autotuning on, a forward and a backward tune) would otherwise time
// each other's kernels. Compiling may overlap.
std::mutex& measuring_lock();

// Each of the `n` sources through compile_cached for `arch`, `o.compile_threads` NVRTC jobs at
// a time (0: one per core); `source(i)` is called on the worker threads. Progress (stage
// compiling, named by keys[i]) is reported from the calling thread as jobs finish. Returns each
// job's error ("" if none).
std::vector<std::string> compile_all(std::size_t n,
                                     const std::function<KernelSource(std::size_t)>& source,
                                     const std::vector<std::string>& keys, const std::string& arch,
                                     const TunerOptions& o);

// One candidate to time: its outcome (status, median, runs and message are written) and how to
// run it once on input set `set`. A candidate without `run` (it failed to build) is skipped.
struct TimedCandidate {
  CandidateOutcome* out = nullptr;
  std::function<void(CUstream, int set)> run;
};

// Times every candidate in order on `stream` over `sets` rotating input sets: o.warmup runs,
// then o.min_runs; one whose median is then above o.drop_ratio x the best so far is dropped,
// the others run until ~o.target_ms of timed work (at most o.max_runs). Those within
// o.final_ratio of the best are then timed again in o.final_rounds interleaved rounds and keep
// the median of their round medians. A run that throws marks its candidate failed. Progress:
// stage timing.
void time_candidates(std::vector<TimedCandidate>& cs, int sets, CUstream stream,
                     const TunerOptions& o);

// Whether the test hook TunerOptions::inject_wrong_candidate asks to corrupt this verification
// run: the candidate's key, or "fastest" for the first candidate verified (k == 0).
bool inject_wrong_here(const TunerOptions& o, const std::string& key, std::size_t k);

// One candidate's verification as both tuners judge it. `check` runs the candidate, records its
// error in `c.error` and returns passes()'s verdict with the reason in *why. A failed verdict or a
// throwing run marks the candidate rejected, with one warning naming `who` ("autotune KEY",
// "autotune --backward KEY"). True when verified.
bool verify_candidate(CandidateOutcome& c, const std::string& who,
                      const std::function<bool(std::string* why)>& check);

// The outcomes as TuneResult::candidates lists them: the timed ones by median, fastest first,
// then those without a time.
void rank_by_time(std::vector<CandidateOutcome>& outcomes);

// The fastest of `ranked` other than `winner` that was neither rejected nor failed; null if none.
const CandidateOutcome* runner_up(const std::vector<CandidateOutcome>& ranked,
                                  const std::string& winner);

// What a tune throws when no candidate passed verification: `what` and every candidate's status
// and message.
[[noreturn]] void throw_none_verified(const std::string& what,
                                      const std::vector<CandidateOutcome>& ranked);

}  // namespace fusejit
