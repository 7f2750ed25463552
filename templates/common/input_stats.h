// KernelConfig::input_stats (kernels/input_stats.cuh): train's column statistics of a = x W^T
// taken from x before the GEMM, mean_a = W xbar and var_a[n] = w_n^T S w_n with S x's centred
// K x K covariance. The sizes and the workspace region's layout, shared by the host
// (workspace_layout, the launch) and the kernel. Plain C++, like limits.h.
#pragma once
#include "common/host_device.h"

namespace fj {

// The kernel's block and its warps; the rows of x whose column means are its shift; and the
// rows a CTA takes per round (a 16-row slab per warp), by which a run of few rows gets fewer
// CTAs (plan/launch.cpp). Phase 3 takes a column per warp, so a CTA takes kInputStatsWarps
// columns at a time.
constexpr int kInputStatsThreads = 256;
constexpr int kInputStatsWarps = kInputStatsThreads / 32;
constexpr int kInputStatsTileRows = 64;
constexpr int kInputStatsCtaRows = 16 * kInputStatsWarps;
// The most CTAs a run's cooperative grid has: the workspace holds one partial per CTA.
constexpr int kInputStatsMaxCtas = 264;
// The largest K: each warp holds d^T d's upper 16x16 tiles in its accumulators (80 registers
// at K = 64) and leaves them in shared memory for its CTA's sums, and the per-CTA partials grow
// as K^2.
constexpr int kInputStatsMaxK = 64;
// The fallback (kernels/input_stats.cuh, phase 4) takes the flagged columns this many at a time:
// a CTA's partials of a round are [columns][2] floats, and its shared memory holds their W rows.
constexpr int kInputStatsFallbackCols = 64;

// K padded to the kernel's tile (16, 32 or 64): S is computed as KP x KP with zero padding.
FJ_HOST_DEVICE constexpr int input_stats_kp(int k) {
  return k <= 16 ? 16 : (k <= 32 ? 32 : 64);
}

// A CTA's sums (kernels/input_stats.cuh), in the order its warps leave them: d^T d's upper
// 16x16 tiles fragment by fragment ([tile][half][register][lane]: InputStats::entry_index says
// where S's entry (j, k) is), then sum d [KP].
FJ_HOST_DEVICE constexpr long long input_stats_sums(int kp) {
  const long long blocks = kp / 16;
  return blocks * (blocks + 1) / 2 * 256 + kp;
}

// The region (Params::ws_xstats), in floats from its start; every part 16-byte aligned.
//  - flag: one word, nonzero when some column's quadratic form cancelled too much to trust
//    (the kernel then takes that column's statistics from a itself); two counts of the run's
//    16-row slabs, those multiplied exactly in x's own type and those in three bf16 parts (the
//    tests read them); and how many columns were flagged.
//  - columns: [N] x {mean_a, var_a}.
//  - flagged_columns: [N] ints, the flagged columns' indices (in the order they were flagged).
//  - fallback: per CTA, [kInputStatsFallbackCols][2] sums of a round of flagged columns.
//  - merged: the sums over every row of d = x - shift (input_stats_sums' layout).
//  - partials: per CTA the same sums over its row tiles, `partial_stride` floats apart.
struct InputStatsLayout {
  long long flag, exact_slabs, split_slabs, flagged, columns, flagged_columns, fallback, merged,
      partials, partial_stride, total;
};
FJ_HOST_DEVICE constexpr long long input_stats_round4(long long v) {
  return (v + 3) / 4 * 4;
}
FJ_HOST_DEVICE constexpr InputStatsLayout input_stats_layout(long long n, int kp) {
  InputStatsLayout l{};
  l.flag = 0;
  l.exact_slabs = 1;
  l.split_slabs = 2;
  l.flagged = 3;
  l.columns = 4;
  l.flagged_columns = input_stats_round4(l.columns + 2 * n);
  l.fallback = input_stats_round4(l.flagged_columns + n);
  l.merged = input_stats_round4(l.fallback + kInputStatsMaxCtas * kInputStatsFallbackCols * 2);
  l.partials = input_stats_round4(l.merged + input_stats_sums(kp));
  l.partial_stride = input_stats_sums(kp);
  l.total = l.partials + kInputStatsMaxCtas * l.partial_stride;
  return l;
}

}  // namespace fj
