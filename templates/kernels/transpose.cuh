// tf32's transposed operand copies for the gradient GEMMs on wgmma, which reads tf32 operands
// K-major only (mainloop/wgmma_ops.cuh): dX = dA W takes W^T, dW = dA^T x takes dA^T and x^T,
// each a copy in the backward workspace (plan/backward_core.cpp). The tiled kernel reads the
// MN-major operands with one 4-byte copy per element instead; its tf32 GEMMs ran at a third of
// the tensor cores' rate (H200: the backward 3.6x its two cuBLASLt GEMMs at 4096^3).
//
// One 32 x 32 tile per block through shared memory: 32 threads read each source row's 128 bytes
// and write each destination row's 128 bytes. The tile's rows are 33 floats so that the column
// reads of the write phase land in 32 distinct banks. Dimensions at run time, so one kernel
// serves all three copies; the grid is the tiles, row tiles fastest, in one dimension (rows
// reach the batch size, past grid.y's 65535 x 32).
#pragma once
#include "common/gemm_params.h"
#include "common/grid_dependency.cuh"

namespace fj {

__device__ __forceinline__ void transpose_tile(const TransposeParams& p) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];
  join_launch_chain();
  const long long row_tiles = (p.rows + kTransposeTile - 1) / kTransposeTile;
  const long long t = blockIdx.x;
  const int r0 = static_cast<int>(t % row_tiles) * kTransposeTile;
  const int c0 = static_cast<int>(t / row_tiles) * kTransposeTile;
  const int tx = static_cast<int>(threadIdx.x) % kTransposeTile;
  const int ty = static_cast<int>(threadIdx.x) / kTransposeTile;
  constexpr int kStep = kTransposeThreads / kTransposeTile;  // rows per pass: 4 elements a thread
  const float* src = static_cast<const float*>(p.src);
  float* dst = static_cast<float*>(p.dst);
#pragma unroll
  for (int i = ty; i < kTransposeTile; i += kStep) {
    const int r = r0 + i, c = c0 + tx;
    if (r < p.rows && c < p.cols) tile[i][tx] = src[r * p.ld_src + c];
  }
  __syncthreads();
#pragma unroll
  for (int i = ty; i < kTransposeTile; i += kStep) {
    const int c = c0 + i, r = r0 + tx;
    if (c < p.cols && r < p.rows) dst[c * p.ld_dst + r] = tile[tx][i];
  }
}

}  // namespace fj
