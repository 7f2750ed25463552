// Split-K: which k tiles each of S CTAs of one output tile multiplies. Plain C++ shared by the
// kernels and the host (tests check the partition), so the two can never disagree.
#pragma once
#include "common/host_device.h"

namespace fj {

// Half-open range [begin, end) of k tiles.
struct KRange {
  int begin, end;
};

// Split s of `splits` over `k_tiles`: contiguous ranges in order, the first k_tiles % splits one
// tile longer, so no split is more than one tile longer than another and none is empty while
// splits <= k_tiles (KernelConfig::why_invalid refuses more splits than k tiles for the forward;
// a gradient GEMM's reduction is the run's M, so some of its splits may be empty: they store
// zeros).
FJ_HOST_DEVICE constexpr KRange split_k_range(int k_tiles, int splits, int s) {
  const int base = k_tiles / splits, extra = k_tiles % splits;
  const int begin = s * base + (s < extra ? s : extra);
  return {begin, begin + base + (s < extra ? 1 : 0)};
}

// The gradient GEMMs' split-K slices (kernels/grad_gemm.cuh, grad_wgmma.cuh): slice s of an
// output [rows][cols] is an fp32 matrix [rows][split_slice_ld(cols)] at s * rows * that ld floats
// of the workspace region. The row stride is a multiple of 8 floats, so the GEMMs' 16-byte (tiled)
// and 8-byte (warpspec fragment pairs) stores of a group starting inside cols stay in its row.
FJ_HOST_DEVICE constexpr int split_slice_ld(int cols) {
  return (cols + 7) / 8 * 8;
}

// Threads of a block of the split sum (kernels/grad_split_sum.cuh), which the host launches.
constexpr int kGradSplitSumThreads = 256;

}  // namespace fj
