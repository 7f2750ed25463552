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
  // Grid: one CTA per output tile (the host counts them for the run's M).

  __device__ static void run(const Params& p) {
    extern __shared__ __align__(128) char smem[];
    const int linear = blockIdx.x;
    const typename Gemm::Tile tile{reinterpret_cast<float*>(smem)};
    const int n = Gemm::slice_vecs_in_m(p, linear);
    const float4* first = Gemm::slice(p, 0, linear);
    const long long split_stride =
        static_cast<long long>(Gemm::raster(p).tiles()) * Gemm::kSliceVecs;
    wait_for_prior_grid();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      // All loads first (they are independent), then the adds in split order.
      float4 v[Gemm::kSplits];
#pragma unroll
      for (int s = 0; s < Gemm::kSplits; ++s) v[s] = first[s * split_stride + i];
      float4 acc = v[0];
#pragma unroll
      for (int s = 1; s < Gemm::kSplits; ++s) {
        acc.x += v[s].x;
        acc.y += v[s].y;
        acc.z += v[s].z;
        acc.w += v[s].w;
      }
      tile.vec4(i) = acc;
    }
    __syncthreads();
    Gemm::template finish<kThreads>(p, smem, linear);
  }
};

}  // namespace fj
