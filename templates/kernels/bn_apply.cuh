// Train mode, second pass, part 2: y holds d = a - tile_mean (see bn_epilogue.cuh); rewrite it
// in place as y = A (d + tile_mean) + B. Runs after bn_finalize in stream order, which is also
// what makes it the safe place to bump num_batches_tracked (every reader has finished).
#pragma once
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

template <class Spec>
__device__ void bn_apply(const Params& p) {
  using T = typename Spec::T;
  constexpr int VEC = Spec::VEC_BYTES / static_cast<int>(sizeof(T)) > 0
                          ? Spec::VEC_BYTES / static_cast<int>(sizeof(T))
                          : 1;
  constexpr int kChunks = (Spec::N + VEC - 1) / VEC;
  const float2* coef = reinterpret_cast<const float2*>(p.ws_coef);
  const float2* partials = reinterpret_cast<const float2*>(p.ws_partials);
  T* y = static_cast<T*>(p.y);
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.num_batches_tracked) *p.num_batches_tracked += 1;
  const long long total = static_cast<long long>(Spec::M) * kChunks;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int m = static_cast<int>(i / kChunks);
    const int c = static_cast<int>(i % kChunks) * VEC;
    const int t = m / Spec::BM;
    T* row = y + static_cast<long long>(m) * Spec::LDY;
    const int n_here = min(VEC, Spec::N - c);
    float v[VEC];
    if (n_here == VEC) {
      load_vec<T, VEC>(row + c, v);
    } else {
      for (int j = 0; j < n_here; ++j) v[j] = to_float(row[c + j]);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (j < n_here) {
        const float2 ab = coef[c + j];
        const float tile_mean = partials[static_cast<long long>(t) * Spec::N + c + j].x;
        v[j] = ab.x * (v[j] + tile_mean) + ab.y;
      }
    }
    if (n_here == VEC) {
      store_vec<T, VEC>(row + c, v);
    } else {
      for (int j = 0; j < n_here; ++j) row[c + j] = from_float<T>(v[j]);
    }
  }
}

// Single-pass train with momentum=None: the GEMM's CTAs all read num_batches_tracked, so the
// increment waits for this one-thread launch after them.
__device__ __forceinline__ void bump_batches(const Params& p) {
  if (p.num_batches_tracked) *p.num_batches_tracked += 1;
}

}  // namespace fj
