// Train mode, second pass, part 2: y holds d = a - tile_mean (see bn_epilogue.cuh); rewrite it
// in place as y = A (d + tile_mean) + B. Runs after bn_finalize in stream order, which is also
// what makes it the safe place to bump num_batches_tracked (every reader has finished).
#pragma once
#include "common/grid_dependency.cuh"
#include "common/params.h"
#include "common/types.cuh"
#include "epilogue/store.cuh"

namespace fj {

template <class T, int VEC>
__device__ __forceinline__ void load_vec(const T* src, float (&v)[VEC]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = src[i];
  } else {
    T tmp[VEC];
    if constexpr (VEC == 8) {
      *reinterpret_cast<uint4*>(tmp) = *reinterpret_cast<const uint4*>(src);
    } else if constexpr (VEC == 4) {
      *reinterpret_cast<uint2*>(tmp) = *reinterpret_cast<const uint2*>(src);
    } else if constexpr (VEC == 2) {
      *reinterpret_cast<unsigned*>(tmp) = *reinterpret_cast<const unsigned*>(src);
    } else {
      tmp[0] = src[0];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = to_float(tmp[i]);
  }
}

// Rows one block rewrites; BM is a multiple of it, so a block sees one row tile's mean. Few
// rows per thread with every load issued before the first use: enough bytes in flight to cover
// memory latency, and enough blocks to fill every SM.
constexpr int kApplyRows = 8;
constexpr int kApplyThreads = 128;

// Grid: x over column chunks (VEC columns per thread), y over kApplyRows-row slabs, walked from
// the bottom up: the GEMM wrote the last row tiles last, so they are the likeliest to still be
// in L2 when the first blocks of this kernel run.
template <class Spec>
__device__ void bn_apply(const Params& p) {
  using T = typename Spec::T;
  constexpr int VEC = Spec::VEC_BYTES / static_cast<int>(sizeof(T)) > 0
                          ? Spec::VEC_BYTES / static_cast<int>(sizeof(T))
                          : 1;
  static_assert(Spec::BM % kApplyRows == 0, "a slab must not straddle two row tiles");
  wait_for_prior_grid();
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && p.num_batches_tracked)
    *p.num_batches_tracked += 1;
  const int c = (blockIdx.x * kApplyThreads + threadIdx.x) * VEC;
  if (c >= Spec::N) return;
  const int r0 = (gridDim.y - 1 - blockIdx.y) * kApplyRows;
  const int n_here = min(VEC, Spec::N - c);
  const float2* coef = reinterpret_cast<const float2*>(p.ws_coef);
  const float2* tile_stats = reinterpret_cast<const float2*>(p.ws_partials) +
                             static_cast<long long>(r0 / Spec::BM) * Spec::N;
  // y = A (d + tile_mean) + B = A d + (A tile_mean + B): one FMA per element.
  float a[VEC], b[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int n = j < n_here ? c + j : c;
    const float2 ab = coef[n];
    a[j] = ab.x;
    b[j] = ab.x * tile_stats[n].x + ab.y;
  }
  T* y = static_cast<T*>(p.y) + static_cast<long long>(r0) * Spec::LDY + c;
  const int rows = min(kApplyRows, Spec::M - r0);
  float v[kApplyRows][VEC];
#pragma unroll
  for (int r = 0; r < kApplyRows; ++r) {
    if (r >= rows) break;
    if (n_here == VEC) {
      load_vec<T, VEC>(y + r * Spec::LDY, v[r]);
    } else {
      for (int j = 0; j < n_here; ++j) v[r][j] = to_float(y[r * Spec::LDY + j]);
    }
  }
#pragma unroll
  for (int r = 0; r < kApplyRows; ++r) {
    if (r >= rows) break;
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[r][j] = a[j] * v[r][j] + b[j];
    if (n_here == VEC) {
      store_vec<T, VEC>(y + r * Spec::LDY, v[r]);
    } else {
      for (int j = 0; j < n_here; ++j) y[r * Spec::LDY + j] = from_float<T>(v[r][j]);
    }
  }
}

// Single-pass train with momentum=None: the GEMM's CTAs all read num_batches_tracked, so the
// increment waits for this one-thread launch after them.
__device__ __forceinline__ void bump_batches(const Params& p) {
  wait_for_prior_grid();
  if (p.num_batches_tracked) *p.num_batches_tracked += 1;
}

}  // namespace fj
