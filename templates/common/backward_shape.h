// The backward BatchNorm kernels' block shape and how a run's rows are split into slabs, written
// once for the kernels (kernels/bn_backward.cuh) and the host (which sizes grids and workspace).
// Plain C++, like limits.h.
#pragma once
#include "common/host_device.h"

namespace fj {

// A block is kBackwardColThreads x kBackwardRowThreads threads; a thread owns VEC consecutive
// columns (16 bytes of T where alignment allows) and walks every kBackwardRowThreads-th row of
// its block's slab. A warp then reads whole 512-byte row segments (bf16) of dy and saved.
constexpr int kBackwardColThreads = 32;
constexpr int kBackwardRowThreads = 8;
constexpr int kBackwardThreads = kBackwardColThreads * kBackwardRowThreads;
// Per-column kernels (the merges): one thread per column.
constexpr int kBackwardColumnThreads = 256;

// Slabs: at least kBackwardMinSlabRows rows each (fewer partials to merge for small batches),
// at most kBackwardMaxSlabs of them (the partials stay a few MiB and each column's merge a short
// loop however large the batch). Every slab but the last has slab_rows rows.
constexpr int kBackwardMinSlabRows = 64;
constexpr int kBackwardMaxSlabs = 64;

struct BackwardSlabs {
  int count;
  int rows;
};

// The slabs m rows are split into at most: the workspace of a plan made for M rows holds this
// many for M, which bounds backward_slabs(m).count for every m <= M (the count itself is not
// monotonic in m: rounding slab rows up to kBackwardRowThreads can leave fewer slabs).
FJ_HOST_DEVICE constexpr long long backward_slab_bound(long long m) {
  const long long want = (m + kBackwardMinSlabRows - 1) / kBackwardMinSlabRows;
  return want > kBackwardMaxSlabs ? kBackwardMaxSlabs : (want < 1 ? 1 : want);
}

FJ_HOST_DEVICE constexpr BackwardSlabs backward_slabs(long long m) {
  const long long want = backward_slab_bound(m);
  long long rows = (m + want - 1) / want;
  rows = (rows + kBackwardRowThreads - 1) / kBackwardRowThreads * kBackwardRowThreads;
  return {static_cast<int>((m + rows - 1) / rows), static_cast<int>(rows)};
}

}  // namespace fj
