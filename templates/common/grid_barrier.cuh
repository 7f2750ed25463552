// A barrier across every CTA of a cooperative launch (CU_LAUNCH_ATTRIBUTE_COOPERATIVE: the
// driver starts the grid only if all of its CTAs can be resident at once, so none waits for an
// SM that a waiting CTA holds).
//
// The barrier counts on the word the driver gives each cooperative launch, not on one in the
// plan's workspace: callers pass workspaces fresh from their allocators (fusejit.torch does, on
// every call), and the protocol below needs a word whose low 31 bits start at zero, which a
// workspace word would only have after a memset per run (one more node in every step). The
// driver publishes the word's block in %envreg1 (address bits 63..32) and %envreg2 (31..0) as
// {u32 size; u32 barrier;}: the ABI that CUDA's cooperative_groups header compiles grid.sync()
// into user binaries with, so a driver must keep it for those binaries to work.
//
// Protocol: each CTA adds to the word once per barrier; CTA 0 adds 2^31 - (ctas - 1) and every
// other CTA 1, so one barrier's adds total 2^31: bit 31 flips when the last CTA arrives, and the
// low bits are zero again for the next barrier.
#pragma once

namespace fj {

__device__ __forceinline__ unsigned* cooperative_barrier_word() {
  unsigned hi, lo;
  asm volatile("mov.u32 %0, %%envreg1;" : "=r"(hi));
  asm volatile("mov.u32 %0, %%envreg2;" : "=r"(lo));
  const unsigned long long block = (static_cast<unsigned long long>(hi) << 32) | lo;
  // Not a cooperative launch: no word to count on, and waiting would never end.
  if (block == 0ull) __trap();
  return reinterpret_cast<unsigned*>(block) + 1;
}

// Called by one thread of each CTA once the CTA's writes that others must see are ordered
// before it (a CTA barrier); returns when every CTA of the grid has called it, with their writes
// visible to this thread (release by each arrival, acquire by the wait) and, after the caller's
// next CTA barrier, to its whole CTA.
__device__ __forceinline__ void grid_barrier_arrive_and_wait() {
  unsigned* word = cooperative_barrier_word();
  const unsigned ctas = gridDim.x * gridDim.y * gridDim.z;
  const bool first = (blockIdx.x | blockIdx.y | blockIdx.z) == 0u;
  const unsigned add = first ? 0x80000000u - (ctas - 1u) : 1u;
  unsigned before, now;
  asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;"
               : "=r"(before)
               : "l"(word), "r"(add)
               : "memory");
  do {
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
  } while (((before ^ now) & 0x80000000u) == 0u);
}

// A counter in global memory that some CTAs of a cooperative grid add to when they have
// published something and others wait on: a wait for the CTAs it depends on only, not for the
// whole grid. The counter must be zero before any add and ordered before it (the kernel zeroes
// it before a grid barrier that every adder passes first). Called by one thread of a CTA after a
// CTA barrier that orders the CTA's writes before it.
__device__ __forceinline__ void counter_release_add(unsigned* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" : : "l"(counter) : "memory");
}

// Returns once `counter` has reached `target`, with the writes its adders ordered before their
// adds visible to this thread (and, after the caller's next CTA barrier, to its whole CTA).
__device__ __forceinline__ void counter_wait_at_least(const unsigned* counter, unsigned target) {
  unsigned now;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(counter) : "memory");
  } while (now < target);
}

}  // namespace fj
