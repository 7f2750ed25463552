// Shared-memory transaction barriers (sm_90 mbarrier) as inline PTX. The warpspec pipeline uses
// two per stage: `full` completes when the producer's TMA bytes have landed, `empty` when every
// consumer warp has finished reading the stage (3xTF32 adds a third, `split`: W's small parts
// written). Waits go by phase parity: a barrier's phase flips each time its pending count
// reaches zero, and waiting on parity P returns once the phase with parity P has completed (so
// waiting on the parity before the first phase returns at once).
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

// One barrier by its 32-bit shared-window address (what the PTX takes), so kernels name their
// barriers instead of computing addresses. A plain value: it lives in a register, or folds into
// the instructions' address offsets.
struct Mbarrier {
  unsigned addr;
  __device__ __forceinline__ void init(unsigned arrivals) const { mbar_init(addr, arrivals); }
  __device__ __forceinline__ void arrive() const { mbar_arrive(addr); }
  __device__ __forceinline__ void arrive_cluster(unsigned cta) const {
    mbar_arrive_cluster(addr, cta);
  }
  __device__ __forceinline__ void arrive_expect_tx(unsigned bytes) const {
    mbar_arrive_expect_tx(addr, bytes);
  }
  __device__ __forceinline__ void wait(unsigned parity) const { mbar_wait(addr, parity); }
};

// The 8 bytes one barrier occupies in a shared-memory layout struct.
struct alignas(8) MbarrierSlot {
  unsigned long long state;
};

// N barriers stored back to back (an MbarrierSlot[N] member), indexed like the array.
template <int N>
struct MbarrierArray {
  unsigned addr;  // of barrier 0
  __device__ __forceinline__ Mbarrier operator[](unsigned i) const {
    return {addr + static_cast<unsigned>(sizeof(MbarrierSlot)) * i};
  }
};

// Where a producer is in a STAGES-deep ring it fills in order: the stage and the parity of the
// lap around the ring, which is the phase parity of that stage's barriers.
template <int STAGES>
struct PipelineState {
  int index = 0;
  unsigned phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == STAGES) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// The same position kept as a count of stages consumed since the start, for a consumer that
// skips whole runs of stages (skip(n)) and releases the stage before the current one. The count
// must not wrap (KernelConfig::why_invalid bounds it for persistent CTAs).
template <int STAGES>
struct PipelineCounter {
  unsigned count = 0;
  __device__ __forceinline__ unsigned index() const { return count % STAGES; }
  __device__ __forceinline__ unsigned phase() const { return (count / STAGES) & 1u; }
  __device__ __forceinline__ unsigned previous_index() const { return (count - 1) % STAGES; }
  __device__ __forceinline__ void advance() { ++count; }
  __device__ __forceinline__ void skip(unsigned n) { count += n; }
};

}  // namespace fj
