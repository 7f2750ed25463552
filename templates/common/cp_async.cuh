// Asynchronous global -> shared copies (sm_80+ cp.async) and their group bookkeeping, as inline
// PTX so the templates stay header-free under NVRTC.
#pragma once

namespace fj {

// Shared-memory address of a generic pointer, as the 32-bit offset that PTX shared-state-space
// instructions (cp.async, ldmatrix, st.shared) take.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// Copies BYTES (4, 8 or 16) from global `src` to shared `dst`, of which only the first
// `src_bytes` are read and the rest zero-filled: that is how tails are predicated without a
// branch. `src` must be BYTES-aligned even when src_bytes == 0 (then nothing is read).
// 16-byte copies bypass L1 (.cg): operands are re-read through L2 by other CTAs, never by this
// SM soon enough for L1 to help. Smaller copies must use .ca (PTX allows .cg only for 16).
template <int BYTES>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, int src_bytes) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(BYTES),
                 "r"(src_bytes)
                 : "memory");
  }
}

// Closes the current group of cp.async operations (an empty group is legal and keeps the
// group count in step with the pipeline stage count).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight. Only orders this
// thread's copies: a __syncthreads() must follow before other threads read the data.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16-byte shared store of four 32-bit words (used where cp.async cannot be: the loads are
// synchronous and the data is assembled in registers first).
__device__ __forceinline__ void st_shared_v4(unsigned dst, unsigned a, unsigned b, unsigned c,
                                             unsigned d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// 8-byte shared store of two 32-bit words by shared-window address (a swizzled destination).
__device__ __forceinline__ void st_shared_v2(unsigned dst, unsigned a, unsigned b) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(dst), "r"(a), "r"(b) : "memory");
}

// 4-byte shared store by shared-window address (where the address is computed, e.g. swizzled,
// rather than taken from a C++ object).
__device__ __forceinline__ void st_shared_b32(unsigned dst, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
}

}  // namespace fj
