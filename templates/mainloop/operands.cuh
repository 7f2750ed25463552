// What the tiled mainloops multiply, independent of which kernel asks: one CTA computes
//   acc(r, c) = sum_k A(r, k) B(c, k)      (r < BM, c < BN of the tile at (m0, n0))
// for C = A B^T-style GEMMs whose operands are each stored one of two ways:
//   K-major  (X_MN_MAJOR = false): A is [ROWS][LDA], A(r, k) = a[r * LDA + k] (k contiguous);
//   MN-major (X_MN_MAJOR = true):  A is [RED][LDA],  A(r, k) = a[k * LDA + r] (r contiguous);
// and B likewise with COLS, LDB. The forward GEMM (x W^T: both K-major) and the two gradient
// GEMMs of the backward pass (dX = dA W: B MN-major; dW = dA^T x: both MN-major) are all this.
//
// The mainloops take the compile-time description as their template argument G:
//   using T; static constexpr int MATH;               (common/math_kind.cuh)
//   static constexpr int ROWS, COLS, RED;              ROWS and RED may be 0: the run's
//   static constexpr bool A_MN_MAJOR, B_MN_MAJOR;
//   static constexpr int LDA, LDB;                     row strides, in elements
//   static constexpr int BM, BN, BK, WARPS_M, WARPS_N, STAGES, THREADS;
//   static constexpr int A_VEC_BYTES, B_VEC_BYTES;     each operand's copy width: the widest
//                                                      its rows' alignment allows, <= 16
//   optionally static constexpr bool TF32_ROUND;       (mainloop/tiled_mma.cuh)
// and the run-time part (pointers, and the extents that are 0 in G) as a GemmOperands.
#pragma once

namespace fj {

struct GemmOperands {
  const void* a;
  const void* b;
  int rows;  // ROWS when G::ROWS > 0 (then ignored), else the run's
  int red;   // RED when G::RED > 0 (then ignored), else the run's
};

// The forward GEMM's description from its kernel Spec: a = x W^T, x [M][LDX], W [N][LDW], both
// K-contiguous (nn.Linear's layout). Everything else (tiles, math, flags) is the Spec's own.
template <class Spec>
struct LinearOperands : Spec {
  static constexpr int ROWS = Spec::M, COLS = Spec::N, RED = Spec::K;
  static constexpr int LDA = Spec::LDX, LDB = Spec::LDW;
  static constexpr bool A_MN_MAJOR = false, B_MN_MAJOR = false;
};

// G::ROWS or the run's value; G::RED likewise. Compile-time constants where G fixes them.
template <class G>
__device__ __forceinline__ int gemm_rows(const GemmOperands& op) {
  if constexpr (G::ROWS > 0)
    return G::ROWS;
  else
    return op.rows;
}
template <class G>
__device__ __forceinline__ int gemm_red(const GemmOperands& op) {
  if constexpr (G::RED > 0)
    return G::RED;
  else
    return op.red;
}

}  // namespace fj
