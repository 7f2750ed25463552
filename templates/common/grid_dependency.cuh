// Programmatic dependent launch (sm_90+): the host may launch the BatchNorm passes before the
// GEMM has finished, so their launch latency hides behind its tail; they then wait here until
// the previous grid has completed and its writes are visible. Without such a launch (or before
// sm_90) this returns at once.
#pragma once

namespace fj {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace fj
