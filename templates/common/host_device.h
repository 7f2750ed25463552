// FJ_HOST_DEVICE: for the plain C++ headers the kernels and the host share (limits.h,
// split_k.h): __host__ __device__ under a CUDA compiler, nothing for the host compiler.
// FJ_HOST_DEVICE_INLINE: the same for the kernels' small helpers that the host tests also call
// (common/smem_layout.cuh, mainloop/element_passes.h), forced inline in device code as before.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FJ_HOST_DEVICE __host__ __device__
#define FJ_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define FJ_HOST_DEVICE
#define FJ_HOST_DEVICE_INLINE inline
#endif
