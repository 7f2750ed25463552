// Warpgroup-level tensor-core plumbing (sm_90a): shared-memory matrix descriptors, the
// fence/commit/wait protocol of wgmma.mma_async, register reallocation and named barriers.
#pragma once
#include "mainloop/wgmma_ops.cuh"

namespace fj {

// Descriptor of a K-major operand tile that TMA wrote with 128-byte swizzling: rows of exactly
// 128 bytes, 8-row groups (1024 bytes, the swizzle atom) packed back to back. The leading
// offset is unused for swizzled K-major layouts; the stride offset is the 1024 bytes between
// 8-row groups. Stepping along K inside the 128-byte row is a plain address offset: the
// hardware applies the XOR pattern to the final address, which is why every tile base must be
// 1024-byte aligned (base offset field 0).
__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned smem_addr) {
  constexpr unsigned long long kLeading = 1;         // 16 bytes, ignored
  constexpr unsigned long long kStride = 1024 >> 4;  // between 8-row groups
  constexpr unsigned long long kSwizzle128 = 1;      // layout type 1: 128-byte swizzle
  return static_cast<unsigned long long>((smem_addr & 0x3FFFF) >> 4) | (kLeading << 16) |
         (kStride << 32) | (kSwizzle128 << 62);
}

// Descriptor of an MN-major operand tile (16-bit only: A read M-major, B N-major, with the
// instruction's transpose bits) that TMA wrote with 128-byte swizzling in slabs of K_ROWS rows
// along the reduction by 64 elements along M or N (one 128-byte row each): 8 reduction rows make
// one 1024-byte swizzle atom, atoms follow each other along the reduction (the stride offset,
// 1024 bytes), and the next 64 M or N elements lie one slab further (the leading offset,
// K_ROWS x 128 bytes). Stepping the reduction by 16 is an address offset of 2048 bytes, which
// keeps the 1024-byte alignment the swizzle needs.
template <int K_ROWS>
__device__ __forceinline__ unsigned long long wgmma_desc_sw128_mn(unsigned smem_addr) {
  static_assert(K_ROWS % 8 == 0 && K_ROWS * 128 / 16 < (1 << 14),
                "the leading offset is 14 bits of 16-byte units");
  constexpr unsigned long long kLeading = (K_ROWS * 128) >> 4;
  constexpr unsigned long long kStride = 1024 >> 4;
  constexpr unsigned long long kSwizzle128 = 1;
  return static_cast<unsigned long long>((smem_addr & 0x3FFFF) >> 4) | (kLeading << 16) |
         (kStride << 32) | (kSwizzle128 << 62);
}

// Orders this warpgroup's earlier register and shared-memory accesses before the wgmma that
// follow (required before the first wgmma and whenever accumulators were touched in between).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups of this warp are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across the points
// where the asynchronous wgmma may still be writing them.
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Per-warpgroup register budgets. The kernel starts with the cap __launch_bounds__(T, 1)
// implies; the producer gives registers back so the consumers can hold large accumulators.
template <int REGS>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_acquire() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Whether a producer warpgroup at PRODUCER registers a thread and CONSUMERS warpgroups at CONSUMER
// fit the registers a launch of THREADS threads, one CTA an SM, gives the CTA (ptxas's cap under
// __launch_bounds__(THREADS, 1), a multiple of 8, for every thread; for more than 256 threads,
// where that cap is below ptxas's 255): a setmaxnreg.inc beyond them waits forever for registers no
// warpgroup gave back (a gradient GEMM at 96 + 208 hung).
__host__ __device__ constexpr bool register_budgets_fit(int threads, int producer, int consumer,
                                                        int consumers) {
  return 128 * producer + 128 * consumers * consumer <= ((65536 / threads) & ~7) * threads;
}

// bar.sync on hardware barrier ID among COUNT threads (a multiple of 32): synchronizes a
// subset of the CTA, such as the consumer warpgroups, without stalling the producer.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
template <int ID, int COUNT>
struct NamedBarrier {
  __device__ __forceinline__ void operator()() const {
    asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(COUNT) : "memory");
  }
};

}  // namespace fj
