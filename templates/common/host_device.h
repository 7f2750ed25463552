// FJ_HOST_DEVICE: for the plain C++ headers the kernels and the host share (limits.h,
// split_k.h): __host__ __device__ under a CUDA compiler, nothing for the host compiler.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FJ_HOST_DEVICE __host__ __device__
#else
#define FJ_HOST_DEVICE
#endif
