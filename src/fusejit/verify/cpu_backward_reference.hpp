// The backward pass of y = BatchNorm1d(scale * (x W^T + b)) in float64 on the host: the
// yardstick for the GPU backward. The math is templates/common/backward_params.h's, written out
// element by element (z = s (a + b), a = x W^T, zh = (z - mu) invstd, y = g zh + beta):
//   dbeta = sum_m dy, dgamma = sum_m dy zh
//   train: dz = g invstd / M (M dy - dbeta - zh dgamma)     eval: dz = g dy / sqrt(rv + eps)
//   da = s dz, dbias = sum_m da, dscale = sum_m dz (a + b), dx = da W, dW = da^T x.
#pragma once
#include <cstdint>
#include <string>
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

// What a forward run saved, as the backward reads it (the GPU's values, as doubles).
struct SavedForward {
  std::vector<double> saved;        // [M][N] packed: train c = a - mean_a, eval u = a + b
  std::vector<double> save_invstd;  // [N]: train (1/sqrt(var z + eps)); empty in eval
};

// The gradients as the backward computes them from dy and what the forward saved, without
// recomputing the forward: O(M N) for the column part plus only the asked-for parts of the two
// GEMMs, so large layers can be checked (the autotuner verifies with it). dx is returned at the
// columns dx_cols of K ([M][dx_cols.size()] packed, dx_natural likewise), dW at the rows dw_rows
// of N ([dw_rows.size()][K] packed, dw_natural likewise); every parameter gradient and its scale
// for all N columns; `saved` is left empty.
// train: zh = s f.save_invstd[n] c with c = f.saved; eval: zh = (s u - running_mean) invstd with
// invstd = 1 / sqrt(running_var + eps), u = f.saved. The rest is backward_reference's, by the
// same code. Validates as backward_reference does (x and w are read whole), and throws
// InvalidArgument naming "saved" ([M][N] elements), "save_invstd" ([N] in train, empty in eval),
// "dx_cols" or "dw_rows" (an index outside [0, K) or [0, N)).
BackwardReferenceOutputs backward_reference_from_saved(const Problem& p, const ReferenceInputs& in,
                                                       const std::vector<double>& dy,
                                                       const SavedForward& f,
                                                       const std::vector<std::int64_t>& dx_cols,
                                                       const std::vector<std::int64_t>& dw_rows);

// ||got - ref|| / max(||ref||, ||natural||) (2-norms): relative_error (verification.hpp), unless
// cancellation made the reference small against its terms (dx_natural above), then the error
// against the natural norm. +inf as relative_error gives it (sizes differ, got not finite).
double gradient_error(const std::vector<double>& got, const std::vector<double>& ref,
                      const std::vector<double>& natural);

// The errors of one backward run against the reference. 0 for what was not compared.
struct BackwardErrors {
  double saved = 0, dx = 0, dw = 0, dbias = 0, dscale = 0, dgamma = 0, dbeta = 0;
  double worst() const;
};

// Gradients read back from a run, as doubles packed like `ref`'s; an empty vector is not compared.
struct BackwardGradients {
  std::vector<double> saved, dx, dw, dbias, dscale, dgamma, dbeta;
};

// dx, dw by gradient_error against their naturals; dgamma, dbeta, saved by relative_error; dbias
// and dscale by scaled_error against ref.dbias_scale / ref.dscale_scale (they cancel to near 0 in
// train mode). Non-finite -> +inf, as is a size that differs from ref's
// (backward_reference_from_saved leaves ref.saved empty: leave got.saved empty against it).
BackwardErrors compare_gradients(const BackwardReferenceOutputs& ref, const BackwardGradients& got);

// Every figure finite and under `threshold`. `why` (when given) gets the ones that are not,
// "; "-separated ("dx error 0.0123 >= 0.01").
bool passes(const BackwardErrors& e, double threshold, std::string* why = nullptr);

}  // namespace fusejit
