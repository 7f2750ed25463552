// The gradient GEMMs' split-K, second kernel: C = (or, accumulating, C +=) the sum of the
// SPLIT_K fp32 slices that fj_bwd_dx / fj_bwd_dw left in GemmParams::partials
// (kernels/grad_gemm.cuh, grad_wgmma.cuh; layout in common/split_k.h), always added in the order
// s = 0, 1, ..., S-1, so a run's gradients never depend on which split finished first.
//
// Why an elementwise pass rather than the forward's one CTA per tile (kernels/splitk_reduce.cuh):
// the gradient GEMMs split where their grid has only a few tiles (dW of a narrow layer is one or
// two), so one CTA per tile would read every slice through one or two SMs. Here every SM takes a
// share: a thread per element of C (consecutive threads on consecutive columns, so each slice's
// loads coalesce), with all S of its loads in flight at once. A first version gave a thread 4
// columns and 8 slices in flight: at 256 x 64 with 32 slices it ran 16 blocks and took 6.5 us
// (ncu, H200), a chain of L2 round trips rather than bandwidth.
//
// Host launch contract: block.x = kThreads, grid.x = any count (grid-stride loop; the host takes
// enough to fill the GPU), no dynamic shared memory.
#pragma once
#include "common/gemm_params.h"
#include "common/grid_dependency.cuh"
#include "common/split_k.h"
#include "common/types.cuh"

namespace fj {

template <class G>
struct GradSplitSum {
  using T = typename G::T;
  static constexpr int kSplits = G::SPLIT_K, COLS = G::COLS, LDC = G::LDC;
  static_assert(kSplits > 1 && kSplits <= 32, "GradSplitSum: 1 < SPLIT_K <= 32");
  static constexpr int kLd = split_slice_ld(COLS);
  static constexpr int kThreads = kGradSplitSumThreads;

  __device__ static void run(const GemmParams& p) {
    join_launch_chain();
    const int rows = G::ROWS > 0 ? G::ROWS : p.m;
    const long long elements = static_cast<long long>(rows) * COLS;
    const long long split_stride = static_cast<long long>(rows) * kLd;
    T* const c = static_cast<T*>(p.c);
    const bool accumulate = p.accumulate != 0;
    for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < elements;
         i += static_cast<long long>(gridDim.x) * kThreads) {
      const long long r = i / COLS;
      const int col = static_cast<int>(i % COLS);
      const float* const src = p.partials + r * kLd + col;
      float v[kSplits];
#pragma unroll
      for (int s = 0; s < kSplits; ++s) v[s] = src[s * split_stride];
      float sum = v[0];
#pragma unroll
      for (int s = 1; s < kSplits; ++s) sum += v[s];
      T* const dst = c + r * LDC + col;
      *dst = from_float<T>(accumulate ? sum + to_float(*dst) : sum);
    }
  }
};

}  // namespace fj
