// Train mode, second pass, part 1: combine the per-row-tile (mean, M2) partials of each column
// with Chan's formula, update the running stats once per column, write the saved stats and the
// folded (A, B) that bn_apply uses, with the column's batch mean of a (the forward's `saved`
// output, train c = a - mean_a, needs it there). Block = 32 columns x FIN_GROUPS row-tile groups:
// the groups merge disjoint sets of tiles in parallel, then one warp merges the groups. When a run
// has few row tiles, bn_apply<Spec, true> does this merge itself and this kernel is not launched:
// see finalize_column.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "epilogue/bn_math.cuh"

namespace fj {

template <class Spec>
struct FinalizeShape {
  static constexpr int kCols = 32;
  // Narrow layers (N < 1024: fewer than 32 blocks) take 32 groups instead of 8, so that a
  // thread's chain of dependent merges over many row tiles is 4x shorter (65536x256x64 has 512
  // row tiles on 8 blocks). Not timed on its own: two device calls before and after measured
  // 0.0515 and 0.0483 ms for the whole two-pass train op there (docs/performance.md), which
  // calls' drift could also explain.
  static constexpr int kGroups = (Spec::N + kCols - 1) / kCols < 32 ? 32 : 8;
  static constexpr int kThreads = kCols * kGroups;
  static constexpr int kGridX = (Spec::N + kCols - 1) / kCols;
};

// Chan-merges column n's partials of row tiles first, first + step, ... into (cnt, mean, m2).
// The loads of UNROLL tiles go out before their merges, so a thread waits on memory once per
// UNROLL tiles rather than once per tile.
template <class Spec>
__device__ __forceinline__ void merge_row_tiles(const Params& p, int n, int first, int step,
                                                float& cnt, float& mean, float& m2) {
  const int m = rows_of<Spec>(p);
  const int row_tiles = row_tiles_of<Spec>(p);
  constexpr int kUnroll = 4;
  const float2* partials = reinterpret_cast<const float2*>(p.ws_partials);
  for (int t0 = first; t0 < row_tiles; t0 += kUnroll * step) {
    float2 pm[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = t0 + u * step;
      pm[u] = t < row_tiles ? partials[static_cast<long long>(t) * Spec::N + n] : float2{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = t0 + u * step;
      if (t >= row_tiles) break;
      const float rows = static_cast<float>(min(Spec::BM, m - t * Spec::BM));
      chan_merge(cnt, mean, m2, rows, pm[u].x, pm[u].y);
    }
  }
}

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
  int n;
  float cnt, mean, m2;
  if (!merge_column_partials<Spec>(p, n, cnt, mean, m2)) return;
  const Affine f = train_column<Spec>(p, n, mean, m2 / static_cast<float>(rows_of<Spec>(p)),
                                      momentum_factor<Spec>(p), true);
  reinterpret_cast<float4*>(p.ws_coef)[n] = make_float4(f.a, f.b, mean, 0.f);
}

}  // namespace fj
