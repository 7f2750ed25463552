// Parameters of the reference op's plain BatchNorm kernels (reference/plain_bn.cuh), shared
// verbatim by the host (reference/cublaslt_reference.cpp) and the kernels. Plain C++: no CUDA
// headers. Sizes are run-time values so one compiled module serves every shape.
#pragma once

namespace fj {

// Block shapes the host launches with. ref_stats blocks: 32 columns (one warp reads 32
// consecutive floats of a row) x 16 row groups that sum disjoint rows of those columns.
constexpr int kRefStatsCols = 32;
constexpr int kRefStatsRowGroups = 16;
constexpr int kRefStatsThreads = kRefStatsCols * kRefStatsRowGroups;
constexpr int kRefCoefThreads = 128;  // also ref_stats_merge's, one thread per column
// A chunk of ref_stats has at least this many rows (16 per row group), and a run has about
// kRefStatsWaves blocks per SM, where its columns alone would not fill the GPU.
constexpr long long kRefStatsMinChunkRows = 256;
constexpr int kRefStatsWaves = 2;
constexpr int kRefApplyThreads = 256;

struct RefParams {
  // G = x W^T (+ bias when the cuBLASLt epilogue added it), fp32 [M][ldg]. May alias y when y
  // is fp32: every element is read before the same thread writes it.
  const float* g;
  long long ldg;
  void* y;  // [M][ldy] in Spec::T
  long long ldy;
  // [N] in Spec::P, or null: bias is non-null only when the GEMM did not add it already.
  const void* bias;
  const void* scale;
  const void* gamma;
  const void* beta;
  void* running_mean;  // [N] Spec::P; train: may be null (not tracked)
  void* running_var;
  long long* num_batches_tracked;  // train: may be null unless cumulative
  float* save_mean;                // [N] or null
  float* save_invstd;              // [N] or null
  // Tensors::saved ([M][ldy] in Spec::T) or null: train c = a - mean_a, eval u = a + bias, what
  // the backward pass reads (fusejit/tensors.hpp).
  void* saved;
  // Per-column normalization y = (z - col_mean) * col_mul + col_add, written by ref_stats or
  // ref_stats_merge (train) or ref_eval_coef (eval), read by ref_apply; train also writes
  // col_gmean, the mean of G, for saved's c = G - mean G (bias, if in G, cancels). Workspace,
  // [N] floats each.
  float* col_mean;
  float* col_mul;
  float* col_add;
  float* col_gmean;
  // Train: ref_stats' chunks of rows, [chunks][3][N] float64 (mean z, sum of squared deviations
  // of z, mean G) in the workspace when chunks > 1.
  double* chunk_stats;
  long long chunk_rows;
  int chunks;
  long long M;  // the run's rows
  int N;
  int train;       // 1: batch statistics; 0: running statistics
  int cumulative;  // 1: momentum=None, factor 1 / (num_batches_tracked + 1)
  double eps;
  double momentum;
};

}  // namespace fj
