// Train mode, second pass, part 1: combine the per-row-tile (mean, M2) partials of each column
// with Chan's formula, update the running stats once per column, write the saved stats and the
// folded (A, B) that bn_apply uses. Block = 32 columns x FIN_GROUPS row-tile groups: the groups
// merge disjoint sets of tiles in parallel, then one warp merges the groups.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/params.h"
#include "epilogue/bn_math.cuh"

namespace fj {

constexpr int kFinCols = 32;
constexpr int kFinGroups = 8;

template <class Spec>
__device__ void bn_finalize(const Params& p) {
  constexpr int kRowTiles = (Spec::M + Spec::BM - 1) / Spec::BM;
  __shared__ float s_n[kFinGroups][kFinCols], s_mean[kFinGroups][kFinCols],
      s_m2[kFinGroups][kFinCols];
  wait_for_prior_grid();
  const int cx = threadIdx.x % kFinCols;
  const int g = threadIdx.x / kFinCols;
  const int n = blockIdx.x * kFinCols + cx;
  const float2* partials = reinterpret_cast<const float2*>(p.ws_partials);
  float cnt = 0.f, mean = 0.f, m2 = 0.f;
  if (n < Spec::N) {
    for (int t = g; t < kRowTiles; t += kFinGroups) {
      const float2 pm = partials[static_cast<long long>(t) * Spec::N + n];
      const float rows = static_cast<float>(min(Spec::BM, Spec::M - t * Spec::BM));
      chan_merge(cnt, mean, m2, rows, pm.x, pm.y);
    }
  }
  s_n[g][cx] = cnt;
  s_mean[g][cx] = mean;
  s_m2[g][cx] = m2;
  __syncthreads();
  if (g != 0 || n >= Spec::N) return;
  for (int k = 1; k < kFinGroups; ++k)
    if (s_n[k][cx] > 0.f) chan_merge(cnt, mean, m2, s_n[k][cx], s_mean[k][cx], s_m2[k][cx]);
  const Affine f =
      train_column<Spec>(p, n, mean, m2 / static_cast<float>(Spec::M), momentum_factor<Spec>(p));
  reinterpret_cast<float2*>(p.ws_coef)[n] = make_float2(f.a, f.b);
}

}  // namespace fj
