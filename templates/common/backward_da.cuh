// Train mode's da from one element of dy and of the forward's `saved` (c = a - mean_a), with the
// column's coefficients {A, B, C, -} as fj_bwd_coef writes them (BackwardParams::ws_coef):
//   da = s dz = s g invstd (dy - dbeta / m - zh dgamma / m),  zh = s invstd c
//      = A dy + B c + C,  A = s g invstd, B = -A s invstd dgamma / m, C = -A dbeta / m.
// One function for every kernel that forms da (fj_bwd_da, and the dX GEMM that forms its own
// operand: kernels/grad_wgmma.cuh, FORM_DA): the fused multiply-adds are spelled out, so both
// give the same bits, and dW (which reads the da one of them stored) sees the operand dX used.
#pragma once

namespace fj {

__device__ __forceinline__ float backward_da(const float4& k, float dy, float saved) {
  return __fmaf_rn(k.x, dy, __fmaf_rn(k.y, saved, k.z));
}

}  // namespace fj
