// Train mode, second pass, part 1: combine the per-row-tile (mean, M2) partials of each column
// with Chan's formula, update the running stats once per column, write the saved stats and the
// folded (A, B) that bn_apply uses, with the column's batch mean of a (the forward's `saved`
// output, train c = a - mean_a, needs it there). Block = FinalizeShape's kCols columns x kGroups
// row-tile groups: the groups merge disjoint sets of tiles in parallel, then group 0's threads
// merge the groups. When a run has few row tiles, bn_apply<Spec, true> does this merge itself and
// this kernel is not launched: see finalize_column.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "epilogue/bn_math.cuh"
#include "epilogue/column_merge.cuh"

namespace fj {

// One thread's whole finalize of column n (bn_apply's folded path). `record`: this call is
// the one per column that updates the running stats and writes the saved stats. `mean_a`
// receives the column's batch mean of a.
template <class Spec>
__device__ __forceinline__ Affine finalize_column(const Params& p, int n, bool record,
                                                  float& mean_a) {
  float cnt = 0.f, m2 = 0.f;
  mean_a = 0.f;
  merge_row_tiles<Spec>(p, n, 0, 1, cnt, mean_a, m2);
  return train_column<Spec>(p, n, mean_a, m2 / static_cast<float>(rows_of<Spec>(p)),
                            momentum_factor<Spec>(p), record);
}

// Block-wide: the column this thread's lane covers, merged over every row tile into (cnt, mean,
// m2). The groups merge disjoint sets of tiles in parallel, then group 0 merges the groups; true
// in the one thread per column that holds the result (group 0, n < N). Every thread must call it
// (it synchronizes the block).
template <class Spec>
__device__ __forceinline__ bool merge_column_partials(const Params& p, int& n, float& cnt,
                                                      float& mean, float& m2) {
  using S = FinalizeShape<Spec>;
  __shared__ float s_n[S::kGroups][S::kCols], s_mean[S::kGroups][S::kCols],
      s_m2[S::kGroups][S::kCols];
  const int cx = threadIdx.x % S::kCols;
  const int g = threadIdx.x / S::kCols;
  n = blockIdx.x * S::kCols + cx;
  cnt = 0.f, mean = 0.f, m2 = 0.f;
  if (n < Spec::N) merge_row_tiles<Spec>(p, n, g, S::kGroups, cnt, mean, m2);
  s_n[g][cx] = cnt;
  s_mean[g][cx] = mean;
  s_m2[g][cx] = m2;
  __syncthreads();
  if (g != 0 || n >= Spec::N) return false;
  for (int k = 1; k < S::kGroups; ++k)
    if (s_n[k][cx] > 0.f) chan_merge(cnt, mean, m2, s_n[k][cx], s_mean[k][cx], s_m2[k][cx]);
  return true;
}

template <class Spec>
__device__ void bn_finalize(const Params& p) {
  wait_for_prior_grid();
  // The next kernel (fj_apply, or recompute's fj_gemm_affine) waits for this grid before it
  // reads what it writes, and before that reads only what neither this grid nor a later one
  // writes (fj_apply nothing; the affine GEMM x and W): letting it launch now lets the affine
  // GEMM's loads and mainloop run on the SMs this small grid leaves idle.
  allow_dependent_launch();
  int n;
  float cnt, mean, m2;
  if (!merge_column_partials<Spec>(p, n, cnt, mean, m2)) return;
  const Affine f = train_column<Spec>(p, n, mean, m2 / static_cast<float>(rows_of<Spec>(p)),
                                      momentum_factor<Spec>(p), true);
  store_column_coefficients(p, n, f, mean);
}

}  // namespace fj
