// The backward pass of y = BatchNorm1d(scale * (x W^T + b)) in float64 on the host: the
// yardstick for the GPU backward. The math is templates/common/backward_params.h's, written out
// element by element (z = s (a + b), a = x W^T, zh = (z - mu) invstd, y = g zh + beta):
//   dbeta = sum_m dy, dgamma = sum_m dy zh
//   train: dz = g invstd / M (M dy - dbeta - zh dgamma)     eval: dz = g dy / sqrt(rv + eps)
//   da = s dz, dbias = sum_m da, dscale = sum_m dz (a + b), dx = da W, dW = da^T x.
#pragma once
#include <vector>

#include "fusejit/problem.hpp"
#include "fusejit/verify/cpu_reference.hpp"

namespace fusejit {

struct BackwardReferenceOutputs {
  std::vector<double> dx;  // [M][K] packed
  std::vector<double> dw;  // [N][K] packed
  // [N] each; empty when the parameter is absent (has_bias, has_scale, has_affine).
  std::vector<double> dbias, dscale, dgamma, dbeta;
  // Natural scale of each parameter gradient per column: the sum of |term| of its reduction,
  // with dz and da at the magnitude of their own terms (dz_natural: train |g| invstd / M (M |dy|
  // + |dbeta| + |zh dgamma|), eval |dz|): sum_m |s| dz_natural for dbias; for dscale in train
  // |g| eps invstd^3 sum_m |dy c| (the terms of the closed form g eps invstd^3 sum dy c, equal
  // to sum dz (a + b)), in eval sum_m dz_natural |a + b|.
  // dbias is exactly 0 in train mode in exact math (BatchNorm cancels the bias), and dscale
  // can cancel too, so their errors must be measured against these scales, not their values.
  // Empty when the parameter is absent.
  std::vector<double> dbias_scale, dscale_scale;
  // dx and dW as they would be if da had no cancellation: da's terms' magnitudes with da's sign
  // (train |s| g invstd / M (M |dy| + |dbeta| + |zh dgamma|); eval |da| itself), times W and x.
  // With M = 2 in train, zh = +-sqrt(var / (var + eps)) and da is eps / var of its terms, so dx
  // and dW are too: errors are measured against max(||dx||, ||dx_natural||). For large M the
  // two norms agree within O(1 / sqrt(M)).
  std::vector<double> dx_natural, dw_natural;
  // [M][N]: what the forward's `saved` output holds: train c = a - mean_a (a = x W^T, its batch
  // column mean), eval u = a + b.
  std::vector<double> saved;
};

// `dy` is [M][N] packed. Mode and eps come from `p`; p.M/N/K and p.has_bias/has_scale/has_affine
// must agree with `in` (InvalidArgument naming the mismatch otherwise). Train normalizes with
// the batch statistics exactly as reference_forward computes them (biased variance); eval with
// in.running_mean / in.running_var, which it then requires. The running-stat update of the
// forward does not enter y, so it has no gradient here.
BackwardReferenceOutputs backward_reference(const Problem& p, const ReferenceInputs& in,
                                            const std::vector<double>& dy);

}  // namespace fusejit
