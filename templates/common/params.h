// Kernel parameters, shared verbatim by the host (plan/launch) and the generated kernels, so the
// two can never disagree on layout. Plain C++: no CUDA headers.
#pragma once

namespace fj {

struct Params {
  // GEMM operands: x [M][ldx], W [N][ldw], y [M][ldy], in the storage type Spec::T.
  const void* x;
  const void* w;
  void* y;
  // Optional (null: not written), laid out like y and never overlapping it: what the backward
  // pass needs of the forward. train: c = a - mean_a (a = x W^T, mean_a its batch column mean);
  // eval: u = a + b. Rounded to Spec::T.
  void* saved;
  // Per-feature parameters [N] in Spec::P; null when the problem says they are absent.
  const void* bias;
  const void* scale;
  const void* gamma;
  const void* beta;
  // BatchNorm buffers [N] in Spec::P (running stats) and fp32 (saved stats); may be null in train.
  void* running_mean;
  void* running_var;
  long long* num_batches_tracked;
  float* save_mean;
  float* save_invstd;
  // Workspace (train, two-pass): per (row tile, column) partial statistics, and per column the
  // folded coefficients the apply pass uses with the batch mean of a (for `saved`). Every
  // region's place and size: workspace_layout() on the host.
  float* ws_partials;  // [row_tiles][N] x {mean, M2} (float2)
  float* ws_coef;      // [N] x {A, B, mean_a, unused} (float4)
  // Workspace (tiled, split-K): the GEMM's fp32 partial sums, [SPLIT_K][tiles][BM * BN], which
  // the reduce kernel adds up (see kernels/splitk_reduce.cuh).
  float* ws_splitk;
  // Workspace (train, synchronized statistics: Spec::RANKS > 0): every rank's record of its
  // rows' column statistics, side by side in rank order (common/column_stats.h), and this
  // rank's own slot among them, which the all-gather fills in place on the other ranks.
  const unsigned char* ws_ranks;
  unsigned char* ws_rank_record;
  // Workspace (warpspec, KernelConfig::pad_operands): W's N rows, then x's m rows, each of
  // Spec::KP elements, 128-byte aligned; written by fj_pad_operands, loaded by the GEMM's TMA.
  void* ws_padded;
  // Workspace (train, KernelConfig::overlap_apply): the in-kernel apply's counters
  // (kernels/overlap_apply.cuh, OverlapCounters), zeroed by the GEMM itself.
  unsigned* ws_overlap;
  // Workspace (train, KernelConfig::input_stats): fj_input_stats' partials, x's mean and
  // covariance, each column's (mean_a, var_a), the columns it could not trust and its
  // fallback's partials (common/input_stats.h, InputStatsLayout).
  float* ws_xstats;
  // Rows of this run: x is [m][ldx], y [m][ldy]. Kernels compiled for an exact M ignore it
  // (common/rows.cuh).
  int m;
  float eps;
  float momentum;  // ignored when Spec::CUMULATIVE
  // Train, KernelConfig::grid_sync (Spec::GRID_SYNC): 1 when the host launched fj_gemm
  // cooperatively with one CTA per tile, so that it finishes the statistics and stores y itself
  // (nothing runs after it); 0 when the run's tiles do not fit on the GPU at once and fj_gemm
  // only writes the partials, as recompute's first pass.
  int grid_sync;
  // Train, KernelConfig::overlap_apply (Spec::OVERLAP_APPLY): 1 when the host launched fj_gemm
  // cooperatively, so that it merges and applies each column panel itself (nothing runs after
  // it); 0 when the driver refused that launch and fj_gemm runs as the two-pass GEMM, followed
  // by fj_finalize and fj_apply.
  int overlap;
};

}  // namespace fj
