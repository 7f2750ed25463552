// Split-K, second kernel: one CTA per output tile adds the tile's SPLIT_K fp32 slices that the
// GEMM kernel left in the workspace (kernels/tiled_gemm.cuh) into an AccTile in shared memory,
// always in the order s = 0, 1, ..., S-1, so a run's sums never depend on which GEMM CTA
// finished first. Then it runs the same BatchNorm epilogue the unsplit GEMM would have, so the
// kernels after it (fj_finalize, fj_apply, fj_bump) are the unsplit schedule's.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/params.h"
#include "epilogue/bn_epilogue.cuh"
#include "kernels/tiled_gemm.cuh"

namespace fj {

template <class Spec>
struct SplitKReduce {
  using Gemm = TiledGemm<Spec>;
  static_assert(Gemm::kSplits > 1, "SplitKReduce: only for SPLIT_K > 1");
  // The reduce is a stream of L2 reads with a few adds each: 256 threads keep enough loads in
  // flight even where the GEMM's CTA is 64 threads. Any count works if it nests with BN for the
  // epilogue's column reductions; the GEMM's own count always does.
  static constexpr int kThreads = 256 % Spec::BN == 0 || Spec::BN % 256 == 0 ? 256 : Spec::THREADS;
  static constexpr int kSmemBytes = Gemm::Tile::kBytes + BnEpilogue<Spec, kThreads>::kScratchBytes;
  static constexpr int kGridX = Gemm::Raster::kTiles;
  static constexpr long long kSplitStride = static_cast<long long>(kGridX) * Gemm::kSliceVecs;

  __device__ static void run(const Params& p) {
    extern __shared__ __align__(128) char smem[];
    const int linear = blockIdx.x;
    const typename Gemm::Tile tile{reinterpret_cast<float*>(smem)};
    const int n = Gemm::slice_vecs_in_m(linear);
    const float4* first = Gemm::slice(p, 0, linear);
    wait_for_prior_grid();
    // One CTA reads S x 64 KiB (128x128 tiles) from L2 alone: with one vector per split in flight
    // per thread it waited on latency (1024^3 bf16 .k4 measured slower than no split at all), so
    // each thread keeps kUnroll x S 16-byte loads in flight (at most 16: 64 registers).
    constexpr int S = Gemm::kSplits;
    constexpr int kUnroll = S >= 16 ? 1 : 16 / S;
    for (int i0 = threadIdx.x; i0 < n; i0 += kThreads * kUnroll) {
      // All loads first (they are independent), then the adds in split order.
      float4 v[kUnroll][S];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u * kThreads;
#pragma unroll
        for (int s = 0; s < S; ++s)
          if (i < n) v[u][s] = first[s * kSplitStride + i];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = i0 + u * kThreads;
        if (i >= n) break;
        float4 acc = v[u][0];
#pragma unroll
        for (int s = 1; s < S; ++s) {
          acc.x += v[u][s].x;
          acc.y += v[u][s].y;
          acc.z += v[u][s].z;
          acc.w += v[u][s].w;
        }
        tile.vec4(i) = acc;
      }
    }
    __syncthreads();
    Gemm::template finish<kThreads>(p, smem, linear);
  }
};

}  // namespace fj
