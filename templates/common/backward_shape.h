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

// fj_bwd_cluster (train, sm_90+; kernels/bn_backward_cluster.cuh): a cluster of CTAs owns a slab
// of kClusterBnColThreads x VEC columns over all of a run's rows, each CTA a share of the rows of
// dy and saved in shared memory. kClusterBnColThreads threads span a slab's row (64 bytes of
// each tensor where rows allow 8-byte vectors: two DRAM sectors), the block's other threads
// take further rows.
constexpr int kClusterBnThreads = 256;
constexpr int kClusterBnColThreads = 8;
constexpr int kClusterBnVecBytes = 16;
constexpr int kClusterBnRowThreads = kClusterBnThreads / kClusterBnColThreads;
// The largest cluster the host asks for (16 is beyond the portable 8: the kernel is marked as
// allowing it, and the host asks the driver whether such clusters fit).
constexpr int kClusterBnMaxCluster = 16;
// The shared memory a CTA aims at: the smallest cluster whose CTAs need at most this much,
// else the largest cluster (the least shared memory per CTA), if its CTAs fit at all. 64 KiB keeps three CTAs per SM, so one CTA's
// loads overlap another's sums and stores.
constexpr int kClusterBnTargetSmem = 64 * 1024;

// Bytes of one slab row of one tensor, from a thread's piece of it (VEC elements).
FJ_HOST_DEVICE constexpr int cluster_bn_row_bytes(int thread_bytes) {
  return kClusterBnColThreads * thread_bytes;
}

struct ClusterBnLaunch {
  int cluster;     // CTAs per cluster; 0: the run's rows do not fit (the three passes run)
  int cta_rows;    // rows per CTA, a multiple of kClusterBnRowThreads
  int smem_bytes;  // dynamic shared memory per CTA: cta_rows rows of dy and of saved
};

// How a run of m rows is split, for slab rows of `row_bytes` per tensor, CTAs of at most
// `max_smem` bytes of dynamic shared memory and clusters of at most `max_cluster` CTAs.
FJ_HOST_DEVICE constexpr ClusterBnLaunch cluster_bn_launch(long long m, int row_bytes,
                                                           int max_smem, int max_cluster) {
  ClusterBnLaunch fits{0, 0, 0};
  for (int c = max_cluster; c >= 1; c /= 2) {
    long long rows = (m + c - 1) / c;
    rows = (rows + kClusterBnRowThreads - 1) / kClusterBnRowThreads * kClusterBnRowThreads;
    const long long smem = rows * row_bytes * 2;
    if (smem > max_smem) break;
    // From the largest cluster down: the last within the target, else the first that fits.
    if (smem <= kClusterBnTargetSmem || fits.cluster == 0)
      fits = {c, static_cast<int>(rows), static_cast<int>(smem)};
    else
      break;
  }
  return fits;
}

}  // namespace fj
