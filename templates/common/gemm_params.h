// Kernel parameters of the gradient GEMMs (kernels/grad_gemm.cuh) and of tf32's transposed
// operand copies (kernels/transpose.cuh), shared verbatim by the host and the generated kernels.
// Plain C++: no CUDA headers.
#pragma once

namespace fj {

struct GemmParams {
  const void* a;
  const void* b;
  void* c;
  int m;           // rows of this run: the GEMM's ROWS or RED where the Spec says 0
  int accumulate;  // != 0: C += A B instead of C = A B
  // SPLIT_K > 1: the fp32 slices (common/split_k.h's layout) the GEMM writes and the split sum
  // (kernels/grad_split_sum.cuh) adds into C; unused otherwise.
  float* partials;
};

// dst [cols][ld_dst] = the transpose of src [rows][ld_src], 4-byte elements, in tiles of
// kTransposeTile x kTransposeTile, one block of kTransposeThreads each (the grid: the tiles).
constexpr int kTransposeTile = 32;
constexpr int kTransposeThreads = 256;
struct TransposeParams {
  const void* src;
  void* dst;
  long long ld_src, ld_dst;
  int rows, cols;
};

}  // namespace fj
