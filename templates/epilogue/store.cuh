// Writes an output laid out like y ([M][LDY], T) from the fp32 accumulator tile: y = A[c] tile(r,
// c)
// + B[c], or the forward's `saved` (tile(r, c) + B[c]), rounded to T, with the widest stores the
// alignment allows.
#pragma once
#include "common/tile.cuh"
#include "common/types.cuh"

namespace fj {

// VEC consecutive values of T as one aligned store (VEC * sizeof(T) bytes: 2..16).
template <class T, int VEC>
__device__ __forceinline__ void store_vec(T* dst, const float (&v)[VEC]) {
  if constexpr (sizeof(T) == 4) {
    if constexpr (VEC == 4) {
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (VEC == 2) {
      *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
    } else {
      *reinterpret_cast<float*>(dst) = v[0];
    }
  } else {
    if constexpr (VEC == 1) {
      *dst = from_float<T>(v[0]);
    } else {
      unsigned w[VEC / 2];
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) w[i] = pack2<T>(v[2 * i], v[2 * i + 1]);
      if constexpr (VEC == 8) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else if constexpr (VEC == 4) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
      } else {
        *reinterpret_cast<unsigned*>(dst) = w[0];
      }
    }
  }
}

// out[m0 + r][n0 + c] = coef_a[c] * tile(r, c) + coef_b[c] for r < rows, c < cols; UNIT_SCALE:
// tile(r, c) + coef_b[c] (coef_a unused, may be null), so `saved` needs no array of ones.
template <class Spec, int NT, bool UNIT_SCALE = false>
__device__ __forceinline__ void store_affine_tile(void* out, AccTile<Spec::BM, Spec::BN> tile,
                                                  const float* coef_a, const float* coef_b, int m0,
                                                  int n0, int rows, int cols, int tid) {
  using T = typename Spec::T;
  constexpr int VEC = Spec::VEC_BYTES / static_cast<int>(sizeof(T)) > 0
                          ? Spec::VEC_BYTES / static_cast<int>(sizeof(T))
                          : 1;
  constexpr int kChunksPerRow = Spec::BN / VEC;
  static_assert(Spec::BN % VEC == 0, "BN must be a multiple of the store width");
  T* y = static_cast<T*>(out);
  for (int i = tid; i < Spec::BM * kChunksPerRow; i += NT) {
    const int r = i / kChunksPerRow;
    const int c = (i % kChunksPerRow) * VEC;
    if (r >= rows || c >= cols) continue;
    T* dst = y + static_cast<long long>(m0 + r) * Spec::LDY + n0 + c;
    float v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if constexpr (UNIT_SCALE)
        v[j] = tile(r, c + j) + coef_b[c + j];
      else
        v[j] = coef_a[c + j] * tile(r, c + j) + coef_b[c + j];
    }
    if (c + VEC <= cols) {
      store_vec<T, VEC>(dst, v);
    } else {
      for (int j = 0; j < cols - c; ++j) dst[j] = from_float<T>(v[j]);
    }
  }
}

}  // namespace fj
