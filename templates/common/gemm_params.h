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
  // != 0: this GEMM may run beside the grid launched right before it (dW beside dX: the
  // backward's GEMMs share no output, and both read only what earlier grids finished). It waits
  // for that grid only before it exits (join_launch_chain as its last step), so its own completion
  // still implies the earlier grid's, as the next kernel of the chain and the stream's later work
  // need.
  int beside_prior;
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
