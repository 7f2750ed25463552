// Storage types and conversions. fp16/bf16 are plain 16-bit payloads converted with PTX, so the
// templates need no cuda_fp16.h / cuda_bf16.h (keeps NVRTC compiles fast and header-free).
#pragma once

namespace fj {

struct half_t {
  unsigned short bits;
};
struct bf16_t {
  unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(half_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}

template <class T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ half_t from_float<half_t>(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
  bf16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

// Two floats packed into one 32-bit register of two 16-bit values (lower address = lo).
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi);
template <>
__device__ __forceinline__ unsigned pack2<half_t>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ unsigned pack2<bf16_t>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// pack2's inverse: the pair's two 16-bit values as floats (x: the lower address).
template <class T>
__device__ __forceinline__ float2 unpack2(unsigned w) {
  return make_float2(to_float(T{static_cast<unsigned short>(w & 0xffffu)}),
                     to_float(T{static_cast<unsigned short>(w >> 16)}));
}

// Element i of a [N] parameter vector as float; `fallback` when the vector is absent.
template <class P>
__device__ __forceinline__ float load_param(const void* p, int i, float fallback) {
  return p ? to_float(static_cast<const P*>(p)[i]) : fallback;
}

}  // namespace fj
