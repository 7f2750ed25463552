// The op in float64 on the host: a restatement of reference_forward in
// /work/shared/spec/reference_model.py, the yardstick every GPU result is compared against.
//   z = (x W^T + b) * scale
//   train: mean, biased var of z over the M rows; running stats move by momentum (or the
//          cumulative factor 1/(num_batches_tracked + 1)) towards mean and the unbiased var.
//   eval : mean, var = running_mean, running_var.
//   y = (z - mean) / sqrt(var + eps) * gamma + beta
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "fusejit/dtype.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

struct ReferenceInputs {
  std::int64_t M = 0, N = 0, K = 0;
  std::vector<double> x;  // [M][K], packed
  std::vector<double> w;  // [N][K], packed (nn.Linear weight layout)
  // [N] each, or empty when absent (bias 0, scale 1, gamma 1, beta 0).
  std::vector<double> bias, scale, gamma, beta;
  // [N] each. eval: required. train: both empty = running stats not tracked.
  std::vector<double> running_mean, running_var;
};

struct ReferenceSettings {
  Mode mode = Mode::train;
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative moving average
  std::int64_t num_batches_tracked = 0;  // before this step (read by the cumulative factor)
  unsigned threads = 0;                  // 0: std::thread::hardware_concurrency()
};
// mode, eps and momentum of `p`.
ReferenceSettings reference_settings(const Problem& p, std::int64_t num_batches_tracked = 0);

struct ReferenceOutputs {
  std::vector<double> y;  // [M][N], packed
  // train: updated; eval: unchanged copies; empty when not tracked (train only).
  std::vector<double> running_mean, running_var;
  // The statistics y was normalized with, as reference_forward returns them: train: the batch
  // mean of z and 1/sqrt(biased var + eps) (= save_mean / save_invstd); eval: the running ones.
  std::vector<double> save_mean, save_invstd;
  std::int64_t num_batches_tracked = 0;  // train: +1 (PyTorch counts every training batch)
};

// Throws InvalidArgument naming the offending input: "M" for M < 2 in train mode (as PyTorch
// raises), a size mismatch ("x", "w", "bias", ...), missing running stats in eval.
ReferenceOutputs reference_forward(const ReferenceInputs& in, const ReferenceSettings& s);

// z = (x W^T + b) * scale, [M][N] packed: the GEMM part alone. Blocked and threaded over
// (row block, column block) tiles, so 1024^3 takes a fraction of a second.
std::vector<double> reference_linear(const ReferenceInputs& in, unsigned threads = 0);

}  // namespace fusejit
