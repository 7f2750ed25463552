// Train mode's da from one element of dy and of the forward's `saved` (c = a - mean_a), with the
// column's coefficients {A, B, C, -} as fj_bwd_coef writes them (BackwardParams::ws_coef):
//   da = s dz = s g invstd (dy - dbeta / m - zh dgamma / m),  zh = s invstd c
//      = A dy + B c + C,  A = s g invstd, B = -A s invstd dgamma / m, C = -A dbeta / m.
// Two fused multiply-adds per element, spelled out so the contraction does not depend on the
// compiler. (A dX GEMM that formed da itself from this function in shared memory, for the same
// bits, measured 1.6-1.8x slower than this pass plus the GEMM reading da: docs/performance.md.)
#pragma once

namespace fj {

__device__ __forceinline__ float backward_da(const float4& k, float dy, float saved) {
  return __fmaf_rn(k.x, dy, __fmaf_rn(k.y, saved, k.z));
}

}  // namespace fj
