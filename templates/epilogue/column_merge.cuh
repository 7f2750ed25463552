// How the per-(row tile, column) partials (mean, M2) that the two-pass GEMM epilogues write merge
// into a column's batch statistics, and in which order: fj_finalize merges them in blocks of
// FinalizeShape's columns, and a resident GEMM (Spec::GRID_SYNC) merges them in its own epilogue,
// one thread per column, in the same order. Chan's merge is not associative in floating point, so
// the order is part of the result; keeping it in one place is what makes the resident schedule's
// statistics the recompute schedule's bit for bit. (kernels/overlap_apply.cuh's merge_strip runs
// the same order with a lane per group; its test compares it with fj_finalize's bits.)
#pragma once
#include "common/column_stats.h"
#include "common/params.h"
#include "common/rows.cuh"

namespace fj {

template <class Spec>
struct FinalizeShape {
  // Narrow layers (N <= 992: fewer than 32 blocks of 32 columns) take 32 groups instead of 8, so
  // that a thread's chain of dependent merges over many row tiles is 4x shorter (65536x256x64
  // has 512 row tiles), and blocks of 8 columns instead of 32, so that the merges spread over
  // 4x the SMs: with 8 blocks of 1,024 threads at 65536x256x64 bf16, fj_finalize issued ~17,000
  // warp instructions on each of its 8 SMs and took 8.7 us; with 32 blocks (and merge_row_tiles'
  // loads 8 deep) 7.6 us (ncu on H200, one call). The groups set the merge order (and so the
  // bits); the column count per block does not.
  static constexpr bool kNarrow = (Spec::N + 31) / 32 < 32;
  static constexpr int kCols = kNarrow ? 8 : 32;
  static constexpr int kGroups = kNarrow ? 32 : 8;
  static constexpr int kThreads = kCols * kGroups;
  static constexpr int kGridX = (Spec::N + kCols - 1) / kCols;
};

// Chan-merges column n's partials of row tiles first, first + step, ... into (cnt, mean, m2).
// The loads of kUnroll tiles go out before their merges, so a thread waits on memory once per
// kUnroll tiles rather than once per tile: twice for the 16 tiles of a narrow layer's group at
// 65536 rows.
template <class Spec>
__device__ __forceinline__ void merge_row_tiles(const Params& p, int n, int first, int step,
                                                float& cnt, float& mean, float& m2) {
  const int m = rows_of<Spec>(p);
  const int row_tiles = row_tiles_of<Spec>(p);
  constexpr int kUnroll = 8;
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

// Column n over every row tile by one thread, in fj_finalize's order: group g of kGroups merges
// tiles g, g + kGroups, ... in turn, then the groups merge in order 0, 1, ..., skipping empty
// ones. The same operations on the same values as merge_column_partials in bn_finalize.cuh,
// where the groups run on separate threads. Here eight groups advance together, so their
// loads go out at once: a thread then waits on L2 once per eight groups' tiles rather than
// once per group. The resident GEMM runs this on its critical path: on H100, 2048x2048x512 bf16
// train went from 0.0168 to 0.0155 ms with it (two device calls, docs/performance.md).
template <class Spec>
__device__ __forceinline__ void merge_column_in_finalize_order(const Params& p, int n, float& cnt,
                                                               float& mean, float& m2) {
  constexpr int kGroups = FinalizeShape<Spec>::kGroups;
  constexpr int kBatch = 8;
  static_assert(kGroups % kBatch == 0, "column merge: whole batches of groups");
  const int m = rows_of<Spec>(p);
  const int row_tiles = row_tiles_of<Spec>(p);
  const float2* partials = reinterpret_cast<const float2*>(p.ws_partials);
  cnt = 0.f, mean = 0.f, m2 = 0.f;
  for (int g0 = 0; g0 < kGroups; g0 += kBatch) {
    float gc[kBatch], gmean[kBatch], gm2[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) gc[u] = 0.f, gmean[u] = 0.f, gm2[u] = 0.f;
    // Depth by depth: tile t0 + u is group (g0 + u)'s next one.
    for (int t0 = g0; t0 < row_tiles; t0 += kGroups) {
      float2 pm[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        pm[u] =
            t0 + u < row_tiles ? partials[static_cast<long long>(t0 + u) * Spec::N + n] : float2{};
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int t = t0 + u;
        if (t < row_tiles)
          chan_merge(gc[u], gmean[u], gm2[u], static_cast<float>(min(Spec::BM, m - t * Spec::BM)),
                     pm[u].x, pm[u].y);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (g0 + u == 0) {
        cnt = gc[0], mean = gmean[0], m2 = gm2[0];  // group 0 is where fj_finalize starts
      } else if (gc[u] > 0.f) {
        chan_merge(cnt, mean, m2, gc[u], gmean[u], gm2[u]);
      }
    }
  }
}

}  // namespace fj
