// Not shipped: the regression sweep runner of `fusejit check` and the tests, over the
// verification core of the library (fusejit/verify/verification.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/config/candidates.hpp"
#include "fusejit/verify/verification.hpp"

namespace fusejit {

// Every case of a file; errors name the file and line.
std::vector<SweepCase> read_sweep_file(const std::string& path);

// The built-in sweeps for one (dtype, mode). quick: a fixed cross of M in {2, 3, 17, 64, 127,
// 128, 129, 1000} (and 1 in eval), N in {1, 7, 8, 64, 200, 512}, K in {1, 5, 8, 64, 1000} where
// every value occurs, plus 128x512x1024, varying bias/scale/affine presence, momentum (and
// None), eps, param dtype, packed/odd/padded strides, tracking and both input distributions.
// full: quick plus M in {1024, 4096}, N = 4096, K = 4096 crosses, more small crosses and the
// KernelBench shape 1024x8192x8192. The same every call (no randomness in the case list).
std::vector<SweepCase> builtin_sweep(bool full, DType dtype, Mode mode);
// "quick", "full" or a sweep file; file cases are kept when their dtype and mode are listed.
std::vector<SweepCase> sweep_cases(const std::string& which, const std::vector<DType>& dtypes,
                                   const std::vector<Mode>& modes);

enum class Implementation { plan, reference_op };
std::string_view name(Implementation);

struct CaseResult {
  enum class Status { passed, failed, skipped };
  SweepCase c;
  Status status = Status::failed;
  bool measured = false;  // the op ran and `errors` holds its figures
  CaseErrors errors;
  double threshold = 0;
  std::uint64_t seed = 0;
  std::string config;   // the plan's config key, or the reference op's description
  std::string message;  // why it failed beyond the figures (exception text), or was skipped
};
// One line: status, case, config, error figures, threshold, seed and message.
std::string format_result(const CaseResult& r);

struct SweepOptions {
  Implementation implementation = Implementation::plan;
  std::optional<Variant> variant;      // plan: force a variant; cases it cannot run are skipped
  std::optional<KernelConfig> config;  // plan: force a config; likewise
  int device = 0;
  std::string cache_dir;
  // Case i's inputs use seed + i; without a seed every case draws a fresh one.
  std::optional<std::uint64_t> seed;
  // Ops are built (codegen + NVRTC) this many at a time ahead of the runs; 0: one per core.
  unsigned build_threads = 0;
  // Called after every case, in order (progress output).
  std::function<void(const CaseResult&)> on_result;
};

struct SweepSummary {
  std::size_t cases = 0, passed = 0, failed = 0, skipped = 0;
  std::map<DType, double> worst;  // worst figure of any case that ran, per dtype
};
struct SweepReport {
  std::vector<CaseResult> results;
  SweepSummary summary;
};

CaseResult run_case(const SweepCase& c, const SweepOptions& options);
SweepReport run_sweep(const std::vector<SweepCase>& cases, const SweepOptions& options);

}  // namespace fusejit
