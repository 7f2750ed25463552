// L2 eviction priorities for data whose reuse the kernel knows about. Train mode writes y
// (pre-normalization) in the GEMM and reads it back in fj_apply right after: stored with
// evict_last priority it survives the GEMM's own streaming of x and W through L2, and the apply
// pass reads and rewrites it there instead of in DRAM.
#pragma once

namespace fj {

__device__ __forceinline__ unsigned long long l2_evict_last_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Back to normal priority (fj_apply's rewrite of y, which belongs to the caller from then on).
__device__ __forceinline__ unsigned long long l2_evict_normal_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes to global memory with an L2 eviction policy.
__device__ __forceinline__ void store16_hinted(void* dst, uint4 v, unsigned long long policy) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
               : "memory");
}

}  // namespace fj
