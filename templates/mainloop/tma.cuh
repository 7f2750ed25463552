// Bulk tensor copies (TMA, sm_90) from global memory into shared memory, completing on an
// mbarrier. The tensor map lives in kernel parameter space (__grid_constant__); its generic
// address is what the instruction takes. Out-of-bounds parts of a box are zero-filled and still
// count toward the transaction bytes, so the expected byte count is always the full box.
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

}  // namespace fj
