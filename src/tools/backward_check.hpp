// Not shipped: one backward case end to end, as a training step runs it (the forward with
// Tensors::saved, then BackwardPlan), every gradient compared with the float64 reference
// (fusejit/verify/cpu_backward_reference.hpp). `fusejit check --backward` and the GPU tests run
// it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/verify/cpu_backward_reference.hpp"
#include "fusejit/verify/verification.hpp"

namespace fusejit {

struct BackwardCheckOptions {
  std::int64_t rows = 0;  // run this many rows of plans made for the case's M (0: M)
  bool want_dx = true, want_dw = true, want_params = true;
  bool accumulate = false;     // gradients start random and must be added to
  int zero_gamma_column = -1;  // gamma[col] := 0 (its dgamma is still defined)
  int zero_scale_column = -1;  // scale[col] := 0
  int device = 0;
  std::string cache_dir;
  // False: the forward ignores the tuning database (the heuristic's choice, as a test expects).
  bool use_tuning_db = true;
  std::optional<KernelConfig> dx_config, dw_config;  // BackwardOptions's
  bool dx_cublaslt = false, dw_cublaslt = false;     // BackwardOptions's
};

struct BackwardCheckResult {
  std::uint64_t seed = 0;
  std::string config;  // the backward plan's config key
  bool forward_reference =
      false;  // the forward ran the cuBLASLt reference op (Plan::uses_reference)
  // compare_gradients's figures (cpu_backward_reference.hpp); 0 for what the case does not have.
  BackwardErrors errors;
  bool untouched_ok = true;  // gradients not asked for still hold their poison
};

BackwardCheckResult check_backward_case(const SweepCase& c, const BackwardCheckOptions& o = {});

// passes(r.errors, ...) (every figure finite and under `threshold`), and nothing written that
// was not asked for.
bool passes(const BackwardCheckResult& r, double threshold, std::string* why = nullptr);

// The built-in backward sweep: every dtype x mode, tails in M, N and K, M = 2, absent
// parameters, param dtype, momentum=None, strides, large column means (quick: a subset).
std::vector<std::string> builtin_backward_sweep(bool full);

}  // namespace fusejit
