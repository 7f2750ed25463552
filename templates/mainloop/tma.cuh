// Bulk tensor copies (TMA, sm_90). Loads go from global memory into shared memory and complete
// on an mbarrier; out-of-bounds parts of a box are zero-filled and still count toward the
// transaction bytes, so the expected byte count is always the full box. Stores go from shared
// memory to global memory as bulk async-groups of the issuing thread and skip the parts of a
// box past the tensor's bounds. The tensor map lives in kernel parameter space
// (__grid_constant__); its generic address is what the instructions take.
#pragma once
#include "common/tma_descriptor.cuh"

namespace fj {

// Pulls the descriptor into the TMA unit's cache before its first use.
__device__ __forceinline__ void tma_prefetch(const TmaDescriptor* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// Box at (c0 = innermost coordinate, c1 = row) into this CTA's shared memory at `dst`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDescriptor* map, unsigned bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%3, %4}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// Same box, written to the same shared offsets (and completing on the same barrier offset) in
// every CTA of the cluster whose bit is set in `cta_mask`.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TmaDescriptor* map,
                                                      unsigned bar, int c0, int c1,
                                                      unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// Box at (c0, c1) of the tensor from this CTA's shared memory at `src`, into the calling
// thread's current bulk async-group (close it with bulk_commit()).
__device__ __forceinline__ void tma_store_2d(const TmaDescriptor* map, unsigned src, int c0,
                                             int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
      "r"(src), "r"(c0), "r"(c1)
      : "memory");
}

// `bytes` (a multiple of 16) of global memory at `src` (16-byte aligned) into this CTA's shared
// memory at `dst`, completing `bytes` of transaction on the barrier at `bar`: a TMA copy that
// needs no tensor map, for rows of a tensor whose shape the kernel knows.
__device__ __forceinline__ void bulk_load_1d(unsigned dst, const void* src, unsigned bytes,
                                             unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Orders this thread's earlier generic-proxy accesses of global memory (e.g. an acquire that
// says another CTA's stores are done) before its later async-proxy ones (a bulk load).
__device__ __forceinline__ void fence_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Until at most N of this thread's bulk groups are incomplete (their writes performed).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// This thread's earlier shared-memory writes become visible to the async proxy (what a later
// TMA store reads); the writers fence, then synchronize with the thread that issues the store.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace fj
