// The reference op's scale + BatchNorm, after a cuBLASLt GEMM left G = x W^T (+ bias) in fp32.
// Deliberately plain: each kernel states the formula of reference_model.py directly, with
// float64 statistics, so it can stand as an independent check of the fused kernels.
//   z = (G + bias) * scale                        (bias here only if the GEMM did not add it)
//   train: mean = sum z / M; var = sum (z - mean)^2 / M   (two passes per chunk of rows: no
//          cancellation; chunks merged pairwise)
//   eval : mean = running_mean; var = running_var
//   y = (z - mean) / sqrt(var + eps) * gamma + beta
//   saved (optional): train c = G - mean G (= a - mean a), eval u = G + bias (= a + bias)
// Spec provides T (the storage type of y) and P (the parameters' storage type).
#pragma once
#include "common/types.cuh"
#include "reference/ref_params.h"

namespace fj {

template <class Spec>
__device__ __forceinline__ float ref_z(const RefParams& p, long long m, int n) {
  using P = typename Spec::P;
  float v = p.g[m * p.ldg + n];
  if (p.bias) v += to_float(static_cast<const P*>(p.bias)[n]);
  if (p.scale) v *= to_float(static_cast<const P*>(p.scale)[n]);
  return v;
}

template <class Spec>
__device__ __forceinline__ void ref_write_coef(const RefParams& p, int n, double mean,
                                               double invstd) {
  using P = typename Spec::P;
  const double gamma = p.gamma ? to_float(static_cast<const P*>(p.gamma)[n]) : 1.0;
  const double beta = p.beta ? to_float(static_cast<const P*>(p.beta)[n]) : 0.0;
  p.col_mean[n] = static_cast<float>(mean);
  p.col_mul[n] = static_cast<float>(invstd * gamma);
  p.col_add[n] = static_cast<float>(beta);
}

// Train, the end of a column's statistics: the biased variance the batch is normalized with,
// the running-stat update (with the unbiased variance), the saved stats, the coefficients and
// G's mean (for saved's c).
template <class Spec>
__device__ void ref_finish_column(const RefParams& p, int n, double mean, double m2, double gmean) {
  using P = typename Spec::P;
  const double rows = static_cast<double>(p.M);
  const double var = m2 / rows;
  if (p.running_mean) {
    // Every column reads num_batches_tracked; ref_apply (a later launch) increments it.
    const double factor =
        p.cumulative ? 1.0 / static_cast<double>(*p.num_batches_tracked + 1) : p.momentum;
    P* rm = static_cast<P*>(p.running_mean);
    P* rv = static_cast<P*>(p.running_var);
    const double unbiased = var * rows / (rows - 1.0);
    rm[n] = from_float<P>(static_cast<float>((1.0 - factor) * to_float(rm[n]) + factor * mean));
    rv[n] = from_float<P>(static_cast<float>((1.0 - factor) * to_float(rv[n]) + factor * unbiased));
  }
  const double invstd = 1.0 / sqrt(var + p.eps);
  if (p.save_mean) p.save_mean[n] = static_cast<float>(mean);
  if (p.save_invstd) p.save_invstd[n] = static_cast<float>(invstd);
  p.col_gmean[n] = static_cast<float>(gmean);
  ref_write_coef<Spec>(p, n, mean, invstd);
}

// One past the last row of chunk k of ref_stats: chunks of p.chunk_rows, the last one shorter.
__device__ __forceinline__ long long ref_chunk_end(const RefParams& p, long long k) {
  const long long end = (k + 1) * p.chunk_rows;
  return end < p.M ? end : p.M;
}

// Train: the mean and sum of squared deviations of z, and the mean of G, over one chunk of rows
// (blockIdx.y; p.chunk_rows each, the last one shorter) of 32 columns (blockIdx.x), in float64
// and in two passes over the chunk (no cancellation). Chunks let a tall, narrow layer fill the
// GPU: one block per 32 columns walking every row took ~6-8 ns a row (H200, N <= 768). With one
// chunk this block finishes its columns; else ref_stats_merge does. G's mean sits beside z's
// because saved's c = G - mean G must not depend on scale (which may be 0) and must keep the
// digits of a column whose mean is far above its spread.
template <class Spec>
__device__ void ref_stats(const RefParams& p) {
  __shared__ double part[kRefStatsRowGroups][kRefStatsCols];
  __shared__ double gpart[kRefStatsRowGroups][kRefStatsCols];
  __shared__ double col_mean[kRefStatsCols];
  const int c = threadIdx.x % kRefStatsCols;
  const int g = threadIdx.x / kRefStatsCols;
  const int n = blockIdx.x * kRefStatsCols + c;
  const bool live = n < p.N;
  const long long first = static_cast<long long>(blockIdx.y) * p.chunk_rows;
  const long long end = ref_chunk_end(p, blockIdx.y);
  const double rows = static_cast<double>(end - first);

  double sum = 0.0, gsum = 0.0;
  if (live)
    for (long long m = first + g; m < end; m += kRefStatsRowGroups) {
      sum += ref_z<Spec>(p, m, n);
      gsum += p.g[m * p.ldg + n];
    }
  part[g][c] = sum;
  gpart[g][c] = gsum;
  __syncthreads();
  if (g == 0) {
    double t = 0.0;
    for (int k = 0; k < kRefStatsRowGroups; ++k) t += part[k][c];
    col_mean[c] = t / rows;
  }
  __syncthreads();
  const double mean = col_mean[c];

  double sq = 0.0;
  if (live) {
    for (long long m = first + g; m < end; m += kRefStatsRowGroups) {
      const double d = static_cast<double>(ref_z<Spec>(p, m, n)) - mean;
      sq += d * d;
    }
  }
  // Group 0 finished reading `part` before the barrier above, so it can be reused.
  part[g][c] = sq;
  __syncthreads();
  if (g != 0 || !live) return;
  double m2 = 0.0, tg = 0.0;
  for (int k = 0; k < kRefStatsRowGroups; ++k) m2 += part[k][c], tg += gpart[k][c];
  const double gmean = tg / rows;
  if (gridDim.y == 1) {
    ref_finish_column<Spec>(p, n, mean, m2, gmean);
    return;
  }
  double* out = p.chunk_stats + 3 * static_cast<long long>(blockIdx.y) * p.N;
  out[n] = mean;
  out[p.N + n] = m2;
  out[2 * p.N + n] = gmean;
}

// Train with several chunks: each column's chunks merged in order (Chan, Golub and LeVeque's
// pairwise update of count, mean and sum of squared deviations, in float64), then finished.
// One thread per column.
template <class Spec>
__device__ void ref_stats_merge(const RefParams& p) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= p.N) return;
  double count = 0.0, mean = 0.0, m2 = 0.0, gmean = 0.0;
  for (int k = 0; k < p.chunks; ++k) {
    const double* in = p.chunk_stats + 3 * static_cast<long long>(k) * p.N;
    const double rows = static_cast<double>(ref_chunk_end(p, k) - k * p.chunk_rows);
    const double total = count + rows;
    const double delta = in[n] - mean;
    mean += delta * rows / total;
    m2 += in[p.N + n] + delta * delta * count * rows / total;
    gmean += (in[2 * p.N + n] - gmean) * rows / total;
    count = total;
  }
  ref_finish_column<Spec>(p, n, mean, m2, gmean);
}

// Eval: the column coefficients from the running stats. One thread per column.
template <class Spec>
__device__ void ref_eval_coef(const RefParams& p) {
  using P = typename Spec::P;
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= p.N) return;
  const double rm = to_float(static_cast<const P*>(p.running_mean)[n]);
  const double rv = to_float(static_cast<const P*>(p.running_var)[n]);
  ref_write_coef<Spec>(p, n, rm, 1.0 / sqrt(rv + p.eps));
}

// y = (z - mean) * (invstd * gamma) + beta for every element, and saved when asked for;
// grid-stride over M x N. In train mode one thread also counts the batch: this launch runs
// after ref_stats and ref_stats_merge, its last readers. G may alias y: each element is read before
// it is written.
template <class Spec>
__device__ void ref_apply(const RefParams& p) {
  using T = typename Spec::T;
  using P = typename Spec::P;
  if (p.train && p.num_batches_tracked && blockIdx.x == 0 && threadIdx.x == 0)
    *p.num_batches_tracked += 1;
  T* y = static_cast<T*>(p.y);
  T* saved = static_cast<T*>(p.saved);
  const long long total = p.M * p.N;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const long long m = i / p.N;
    const int n = static_cast<int>(i - m * p.N);
    const float g = p.g[m * p.ldg + n];
    const float z = ref_z<Spec>(p, m, n);
    if (saved) {
      // eval's u is a + bias: G already holds the bias unless it is added here.
      const float shift = p.train  ? -p.col_gmean[n]
                          : p.bias ? to_float(static_cast<const P*>(p.bias)[n])
                                   : 0.f;
      saved[m * p.ldy + n] = from_float<T>(g + shift);
    }
    y[m * p.ldy + n] = from_float<T>((z - p.col_mean[n]) * p.col_mul[n] + p.col_add[n]);
  }
}

}  // namespace fj
