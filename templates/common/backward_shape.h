// The backward BatchNorm kernels' block shape and how a run's rows are split into slabs, written
// once for the kernels (kernels/bn_backward.cuh) and the host (which sizes grids and workspace).
// Plain C++, like limits.h.
#pragma once
#include "common/host_device.h"

namespace fj {

// A block is kBackwardColThreads x kBackwardRowThreads threads; a thread owns VEC consecutive
// columns (kBackwardVecBytes of T where alignment allows) and walks every kBackwardRowThreads-th
// row of its block's slab. Where alignment allows 8-byte vectors, a warp reads whole 256-byte
// row segments of dy and saved.
constexpr int kBackwardColThreads = 32;
// 8 bytes, not 16: with 8 bf16 columns a thread of fj_bwd_da held 40 coefficients and 16 sums,
// 98 registers, two resident blocks per SM, and the pass took 61 us (ncu on H100, 4096x4096
// bf16, 1.6 TB/s); with 4 columns and four rows' loads in flight (73 registers, three blocks)
// it took 40 us.
constexpr int kBackwardVecBytes = 8;
constexpr int kBackwardRowThreads = 8;
constexpr int kBackwardThreads = kBackwardColThreads * kBackwardRowThreads;
// Per-column kernels (the merges of slab partials): kBackwardMergeLanes threads per column, each
// adding every kBackwardMergeLanes-th slab, so a column's loads are in flight together (one thread
// walking 64 slabs made fj_bwd_coef a 7.7 us pass at N = 4096 on H100, 4.8 us with eight lanes).
constexpr int kBackwardColumnThreads = 256;
constexpr int kBackwardMergeLanes = 8;
constexpr int kBackwardMergeColumns = kBackwardColumnThreads / kBackwardMergeLanes;

// Strips: blocks of kBackwardColThreads threads x VEC columns across N, VEC the elements of
// min(vec_bytes, kBackwardVecBytes) (vec_bytes: the alignment of the layer's rows). The kernels'
// BackwardShape and the host's workspace both count them here.
FJ_HOST_DEVICE constexpr int backward_strips(int n, int vec_bytes, int elem_bytes) {
  const int bytes = vec_bytes < kBackwardVecBytes ? vec_bytes : kBackwardVecBytes;
  const int vec = bytes / elem_bytes > 0 ? bytes / elem_bytes : 1;
  const int cols = kBackwardColThreads * vec;
  return (n + cols - 1) / cols;
}

// Slabs: at least kBackwardMinSlabRows rows each (fewer partials to merge for small batches),
// at most kBackwardMaxSlabs of them (the partials stay a few MiB and each column's merge a short
// loop however large the batch), unless the layer is so narrow that strips x kBackwardMaxSlabs
// blocks leave the GPU short of loads in flight: then up to kBackwardTargetBlocks / strips slabs.
// Measured (ncu, H200, bf16 train): at 65536 x 256 (2 strips, 128 blocks) fj_bwd_reduce read
// dy and saved at 0.8 TB/s and fj_bwd_da moved its 96 MB at 1.8 TB/s; at 16384 x 1024 (512
// blocks) 2.5 TB/s both. Every slab but the last has slab_rows rows.
constexpr int kBackwardMinSlabRows = 64;
constexpr int kBackwardMaxSlabs = 64;
constexpr int kBackwardTargetBlocks = 512;

// fj_bwd_resident (kernels/bn_backward.cuh) holds a thread's rows of its slab in registers
// between the column sums and da: at most kBackwardResidentRows of them (2 x 2 registers a row
// of 8 bytes), so its blocks hold rows where slab_rows <= kBackwardResidentRows x
// kBackwardRowThreads and each has one slab of one strip (else they read the rows again).
// Eight rows: every backward_slabs split of up to 64 x (its slab cap) rows, e.g. 2048x2048,
// 4096x1024, 8192x512; kBackwardResidentBlocksPerSm blocks per SM (64 registers) let a grid of
// up to 4 x the SMs be resident (528 blocks on H100 and H200: 2048x2048's 512).
constexpr int kBackwardResidentRows = 8;
constexpr int kBackwardResidentBlocksPerSm = 4;

FJ_HOST_DEVICE constexpr bool backward_slab_in_registers(int slab_rows) {
  return slab_rows <= kBackwardResidentRows * kBackwardRowThreads;
}

// Where fj_bwd_resident's blocks keep their rows between the column sums and da (the host's
// launch and the kernels decide alike, from the run's slabs, units and grid):
//   registers: every strip x slab unit has a block, whose rows fit in registers
//              (backward_slab_in_registers and units == grid, bn_backward_resident);
//   shared:    more units than blocks, slabs that would fit: a block keeps its first unit's rows
//              in kBackwardResidentSharedBytes of dynamic shared memory and reads its other
//              units again (backward_first_rows_in_shared; its own kernel,
//              fj_bwd_resident_shared);
//   reread:    every unit read again.
enum class ResidentRows { registers, shared, reread };

FJ_HOST_DEVICE constexpr bool backward_first_rows_in_shared(int slab_rows, int units, int grid) {
  return backward_slab_in_registers(slab_rows) && units > grid;
}

// A block's first unit in shared memory: dy's and saved's kBackwardResidentRows rows per thread,
// kBackwardVecBytes each (32 KiB; with the kernel's ~10 KiB of static shared memory four blocks
// of 64 registers still fit an SM of sm_90, three of sm_80, two of sm_86 and sm_89).
constexpr int kBackwardResidentSharedBytes =
    2 * kBackwardResidentRows * kBackwardThreads * kBackwardVecBytes;

struct BackwardSlabs {
  int count;
  int rows;
};

// The most slabs a run of `strips` strips takes (kBackwardMaxSlabs, or more for narrow layers).
FJ_HOST_DEVICE constexpr long long backward_slab_cap(int strips) {
  const long long s = strips < 1 ? 1 : strips;
  const long long fill = (kBackwardTargetBlocks + s - 1) / s;
  return fill > kBackwardMaxSlabs ? fill : kBackwardMaxSlabs;
}

// The slabs m rows are split into at most: the workspace of a plan made for M rows holds this
// many for M, which bounds backward_slabs(m, strips).count for every m <= M (the count itself is
// not monotonic in m: rounding slab rows up to kBackwardRowThreads can leave fewer slabs).
FJ_HOST_DEVICE constexpr long long backward_slab_bound(long long m, int strips) {
  const long long want = (m + kBackwardMinSlabRows - 1) / kBackwardMinSlabRows;
  const long long cap = backward_slab_cap(strips);
  return want > cap ? cap : (want < 1 ? 1 : want);
}

FJ_HOST_DEVICE constexpr BackwardSlabs backward_slabs(long long m, int strips) {
  const long long want = backward_slab_bound(m, strips);
  long long rows = (m + want - 1) / want;
  rows = (rows + kBackwardRowThreads - 1) / kBackwardRowThreads * kBackwardRowThreads;
  return {static_cast<int>((m + rows - 1) / rows), static_cast<int>(rows)};
}

}  // namespace fj
