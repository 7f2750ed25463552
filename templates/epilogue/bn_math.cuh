// Per-column BatchNorm math shared by the GEMM epilogues and the finalize kernel. With
// a = x W^T (fp32) and z = s (a + b):
//   eval : y = A a + B, A = g s / sqrt(rv + eps),    B = beta + g (s b - rm) / sqrt(rv + eps)
//   train: y = A a + B, A = g s / sqrt(s^2 var_a + eps), B = beta - A mean_a
// (the bias cancels out of y in train mode; it still moves running_mean).
#pragma once
#include "common/column_stats.h"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/spec_flag.cuh"
#include "common/types.cuh"

namespace fj {

// KernelConfig::recompute (codegen names these only in its kernel sets): the first GEMM pass
// reduces the column statistics and stores no y (STATS_ONLY); the second is the eval epilogue
// with each column's affine from the finalize (WS_AFFINE: p.ws_coef's {A, B, mean_a, -}).
FJ_SPEC_FLAG(StatsOnly, STATS_ONLY, false);
FJ_SPEC_FLAG(WsAffine, WS_AFFINE, false);
// KernelConfig::grid_sync (a recompute set's fj_gemm, warpspec): with Params::grid_sync the
// STATS_ONLY pass finishes the statistics across the grid and stores y itself
// (FragmentBnEpilogue::finish_resident).
FJ_SPEC_FLAG(GridSync, GRID_SYNC, false);

struct Affine {
  float a, b;
};

// A column's parameters, which eval_affine and train_column_of fold; loaded apart from the folding
// so that a caller can issue the loads early: the resident GEMM
// (FragmentBnEpilogue::finish_resident) loads them before its grid barrier rather than after its
// merge, where they would add a memory round trip to the path every CTA waits on.
struct ColumnParams {
  float b = 0.f, s = 1.f, g = 1.f, beta = 0.f;
};

template <class Spec>
__device__ __forceinline__ ColumnParams column_params(const Params& p, int n) {
  using P = typename Spec::P;
  ColumnParams c;
  if constexpr (Spec::HAS_BIAS) c.b = load_param<P>(p.bias, n, 0.f);
  if constexpr (Spec::HAS_SCALE) c.s = load_param<P>(p.scale, n, 1.f);
  if constexpr (Spec::HAS_AFFINE) {
    c.g = load_param<P>(p.gamma, n, 1.f);
    c.beta = load_param<P>(p.beta, n, 0.f);
  }
  return c;
}

template <class Spec>
__device__ __forceinline__ Affine eval_affine(const Params& p, int n) {
  if constexpr (WsAffine<Spec>::value) {
    const float4 abm = reinterpret_cast<const float4*>(p.ws_coef)[n];
    return {abm.x, abm.y};
  }
  using P = typename Spec::P;
  const float rm = to_float(static_cast<const P*>(p.running_mean)[n]);
  const float rv = to_float(static_cast<const P*>(p.running_var)[n]);
  const ColumnParams c = column_params<Spec>(p, n);
  const float invstd = rsqrtf(rv + p.eps);
  return {c.g * c.s * invstd, c.beta + c.g * (c.s * c.b - rm) * invstd};
}

// The eval epilogues' saved output, saved = a + this: eval's u = a + b (the bias); WS_AFFINE's
// train c = a - mean_a, as the other train schedules save it.
template <class Spec>
__device__ __forceinline__ float eval_saved_offset(const Params& p, int n) {
  if constexpr (WsAffine<Spec>::value)
    return -reinterpret_cast<const float4*>(p.ws_coef)[n].z;
  else
    return Spec::HAS_BIAS ? load_param<typename Spec::P>(p.bias, n, 0.f) : 0.f;
}

// The momentum factor of this run. Cumulative (momentum=None) reads num_batches_tracked before
// the run increments it, so every reader must run before the increment (see bump_batches).
template <class Spec>
__device__ __forceinline__ float momentum_factor(const Params& p) {
  if constexpr (Spec::CUMULATIVE)
    return 1.0f / static_cast<float>(*p.num_batches_tracked + 1);
  else
    return p.momentum;
}

// Train mode, one column with its batch statistics of a (biased variance over `rows` rows, the
// batch: this run's, or the global batch of synchronized ranks) and its parameters `cp`: returns
// the folded affine and, when `record`, updates the running stats (with the unbiased variance)
// and writes the saved stats. Exactly one call per column per run records.
template <class Spec>
__device__ __forceinline__ Affine train_column_of(const Params& p, const ColumnParams& cp, int n,
                                                  float mean_a, float var_a, float factor,
                                                  bool record, float rows) {
  using P = typename Spec::P;
  const float mean_z = cp.s * (mean_a + cp.b);
  const float var_z = cp.s * cp.s * var_a;
  const float invstd = rsqrtf(var_z + p.eps);
  if (record && p.running_mean) {
    P* rm = static_cast<P*>(p.running_mean);
    P* rv = static_cast<P*>(p.running_var);
    const float unbias = rows / (rows - 1.f);
    rm[n] = from_float<P>((1.f - factor) * to_float(rm[n]) + factor * mean_z);
    rv[n] = from_float<P>((1.f - factor) * to_float(rv[n]) + factor * var_z * unbias);
  }
  if (record && p.save_mean) p.save_mean[n] = mean_z;
  if (record && p.save_invstd) p.save_invstd[n] = invstd;
  const float A = cp.g * cp.s * invstd;
  return {A, cp.beta - A * mean_a};
}

template <class Spec>
__device__ __forceinline__ Affine train_column_of(const Params& p, int n, float mean_a, float var_a,
                                                  float factor, bool record, float rows) {
  return train_column_of<Spec>(p, column_params<Spec>(p, n), n, mean_a, var_a, factor, record,
                               rows);
}

// The same over this run's rows.
template <class Spec>
__device__ __forceinline__ Affine train_column(const Params& p, int n, float mean_a, float var_a,
                                               float factor, bool record) {
  return train_column_of<Spec>(p, n, mean_a, var_a, factor, record,
                               static_cast<float>(rows_of<Spec>(p)));
}

// A train column's folded affine and batch mean of a, where the WS_AFFINE epilogues and fj_apply
// read them (p.ws_coef's {A, B, mean_a, -}: eval_affine, eval_saved_offset). One writer per
// column per run.
__device__ __forceinline__ void store_column_coefficients(const Params& p, int n, const Affine& f,
                                                          float mean_a) {
  reinterpret_cast<float4*>(p.ws_coef)[n] = make_float4(f.a, f.b, mean_a, 0.f);
}

}  // namespace fj
