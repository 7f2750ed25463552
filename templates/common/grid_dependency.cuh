// Programmatic dependent launch (sm_90+): the host may launch a kernel (the forward's BatchNorm
// passes, every backward kernel) before the previous one has finished, so its launch latency
// hides behind that one's tail; it then waits here until the previous grid has completed and its
// writes are visible. Without such a launch (or before sm_90) this returns at once.
#pragma once

namespace fj {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next programmatic dependent launch start once every CTA of this grid has called this
// (or exited), instead of when the last one exits: its CTAs then run up to wait_for_prior_grid,
// which still waits for this whole grid and its writes. Calling it early is safe as long as the
// dependent, before its wait, touches only memory that neither this grid nor any later one writes
// (recompute's affine GEMM loads x and W there; every other dependent waits first); it decides
// when the dependent's CTAs may take SM resources. No-op before sm_90.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A kernel of a chain of programmatic dependent launches (the backward pass's kernels,
// plan/backward_core.cpp): waits for the previous grid, then lets the next one launch. Every
// thread waits before it touches memory, so no grid of the chain completes before the one ahead
// of it, and each sees all earlier grids' writes. Triggering after the wait, not before, keeps at
// most one waiting grid resident beside a running one. Every thread calls it.
// A kernel that runs beside the grid before it (GemmParams::beside_prior) calls it as its last
// step instead, after its last memory access: neither of the two may then write what the other
// reads or writes, and what it reads was finished by earlier grids (the grid before it passed its
// own wait before it let this one launch). Waiting there keeps "a grid completes after the one
// ahead of it", which the next kernel's wait and the stream's later work rely on.
__device__ __forceinline__ void join_launch_chain() {
  wait_for_prior_grid();
  allow_dependent_launch();
}

}  // namespace fj
