// The transposed operand copies for the gradient GEMMs on wgmma (grad_gemm_reads_copies): dX =
// dA W takes W^T, dW = dA^T x takes x^T and, for tf32, dA^T, each a copy in the backward
// workspace (plan/backward_core.cpp) whose rows are padded to 16 bytes. tf32 needs them because
// wgmma reads tf32 operands K-major only (mainloop/wgmma_ops.cuh): the tiled kernel, reading the
// MN-major operands with one 4-byte copy per element, ran at a third of the tensor cores' rate
// (H200: the backward 3.6x its two cuBLASLt GEMMs at 4096^3). 16-bit types need them where the
// rows of x and W are not 16-byte aligned, which TMA cannot load (odd K: 4097x4095x129), so that
// those layers too run on wgmma rather than the tiled kernel; dA's own rows are padded where
// fj_bwd_da (or fj_bwd_resident) writes them.
//
// One 32 x 32 tile per block through shared memory, elements moved as raw bits: 32 threads read
// each source row's 32 elements and write each destination row's 32. The tile's rows are 33
// elements so that the column reads of the write phase spread over the banks. Dimensions at run
// time, so one kernel serves every copy; the grid is the tiles, row tiles fastest, in one dimension
// (rows reach the batch size, past grid.y's 65535 x 32).
#pragma once
#include "common/gemm_params.h"
#include "common/grid_dependency.cuh"
#include "common/select.cuh"

namespace fj {

// ELEMENT_BYTES: sizeof the storage type, 2 or 4; E: its raw bits (the copy does no arithmetic).
template <int ELEMENT_BYTES>
__device__ __forceinline__ void transpose_tile(const TransposeParams& p) {
  static_assert(ELEMENT_BYTES == 2 || ELEMENT_BYTES == 4, "transpose_tile: 16- or 32-bit elements");
  using E = typename Select<ELEMENT_BYTES == 2, unsigned short, float>::type;
  __shared__ E tile[kTransposeTile][kTransposeTile + 1];
  join_launch_chain();
  const long long row_tiles = (p.rows + kTransposeTile - 1) / kTransposeTile;
  const long long t = blockIdx.x;
  const int r0 = static_cast<int>(t % row_tiles) * kTransposeTile;
  const int c0 = static_cast<int>(t / row_tiles) * kTransposeTile;
  const int tx = static_cast<int>(threadIdx.x) % kTransposeTile;
  const int ty = static_cast<int>(threadIdx.x) / kTransposeTile;
  constexpr int kStep = kTransposeThreads / kTransposeTile;  // rows per pass: 4 elements a thread
  const E* src = static_cast<const E*>(p.src);
  E* dst = static_cast<E*>(p.dst);
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
