// The CUDA driver API, loaded at run time. Machines without a GPU have no libcuda.so.1, and a
// binary linked against it would not even start there; loading it lazily lets the CPU-side
// pipeline (codegen, NVRTC, disk cache, `fusejit compile`) run anywhere.
#pragma once
#include <cuda.h>

#include <string>

#include "fusejit/driver.hpp"

namespace fusejit {

// Every driver entry point fusejit uses, resolved through cuGetProcAddress at the ABI of the
// CUDA headers we were built with (so cuMemAlloc means cuMemAlloc_v2, and so on).
// One entry a line: clang-format cannot lay out an X-macro list.
// clang-format off
#define FUSEJIT_DRIVER_FUNCTIONS(X) \
  X(cuInit) \
  X(cuDriverGetVersion) \
  X(cuGetErrorName) \
  X(cuGetErrorString) \
  X(cuDeviceGetCount) \
  X(cuDeviceGet) \
  X(cuDeviceGetName) \
  X(cuDeviceGetAttribute) \
  X(cuDeviceTotalMem) \
  X(cuDeviceGetUuid) \
  X(cuDevicePrimaryCtxRetain) \
  X(cuDevicePrimaryCtxRelease) \
  X(cuCtxGetCurrent) \
  X(cuCtxSetCurrent) \
  X(cuCtxGetDevice) \
  X(cuCtxSynchronize) \
  X(cuModuleLoadData) \
  X(cuModuleUnload) \
  X(cuModuleGetFunction) \
  X(cuFuncSetAttribute) \
  X(cuFuncGetAttribute) \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuLaunchKernel) \
  X(cuLaunchKernelEx) \
  X(cuMemAlloc) \
  X(cuMemFree) \
  X(cuMemcpyHtoD) \
  X(cuMemcpyDtoH) \
  X(cuMemcpyDtoD) \
  X(cuMemsetD8) \
  X(cuMemsetD32) \
  X(cuMemsetD8Async) \
  X(cuMemcpyHtoDAsync) \
  X(cuMemcpyDtoHAsync) \
  X(cuMemGetInfo) \
  X(cuStreamCreate) \
  X(cuStreamDestroy) \
  X(cuStreamSynchronize) \
  X(cuStreamGetCtx) \
  X(cuStreamBeginCapture) \
  X(cuStreamEndCapture) \
  X(cuGraphInstantiate) \
  X(cuGraphLaunch) \
  X(cuGraphExecDestroy) \
  X(cuGraphDestroy) \
  X(cuEventCreate) \
  X(cuEventDestroy) \
  X(cuEventRecord) \
  X(cuEventSynchronize) \
  X(cuEventElapsedTime) \
  X(cuTensorMapEncodeTiled) \
  X(cuPointerGetAttribute) \
  X(cuModuleGetGlobal) \
  X(cuFuncGetName)
// clang-format on

struct Driver {
#define FUSEJIT_DECLARE(fn) decltype(&::fn) fn = nullptr;
  FUSEJIT_DRIVER_FUNCTIONS(FUSEJIT_DECLARE)
#undef FUSEJIT_DECLARE
  int version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The loaded driver, initialised once (cuInit). Throws UnsupportedDevice("no GPU driver ...")
// when libcuda.so.1 is missing or cuInit fails (for example: no GPU visible).
const Driver& driver();
}  // namespace fusejit

// Checks a driver call made through fusejit::driver(): FJ_CU(cuMemAlloc(&p, n)).
#define FJ_CU(call) ::fusejit::check(::fusejit::driver().call, #call)
