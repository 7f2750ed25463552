// Shared-memory transaction barriers (sm_90 mbarrier) as inline PTX. The warpspec pipeline uses
// two per stage: `full` completes when the producer's TMA bytes have landed, `empty` when every
// consumer warp has finished reading the stage. Waits go by phase parity: a barrier's phase
// flips each time its pending count reaches zero, and waiting on parity P returns once the phase
// with parity P has completed (so waiting on the parity before the first phase returns at once).
#pragma once

namespace fj {

// The 32-bit shared-window address of a generic pointer to shared memory.
__device__ __forceinline__ unsigned shared_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes initialized barriers visible to the other threads of the cluster and to the async
// proxy (TMA completes transactions on them) before anyone uses them.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on a barrier of CTA `cta` in this cluster (the address is this CTA's offset; mapa
// translates it to the peer's shared window). Default (.release.cta) semantics on purpose: the
// stage releases this is used for order only asynchronous-proxy reads that wgmma.wait_group has
// already retired, and a .release.cluster arrive costs a full memory barrier (MEMBAR) per call,
// which halved the mainloop's speed when every consumer warp paid it once per k-slice.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
  asm volatile(
      "{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [r]; }\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// One arrival that also announces `bytes` more transaction bytes the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{ .reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p; }\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Spins until the phase with parity `parity` has completed. try_wait itself suspends the thread
// for a while before answering false, so the loop does not hammer the barrier.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

}  // namespace fj
