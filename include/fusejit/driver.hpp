// The CUDA driver as fusejit loads it: at run time, so programs that link fusejit start on
// machines without libcuda.so.1 (compiling kernels needs no GPU). An application that wants
// the same property calls the driver through fusejit instead of linking libcuda:
//
//   #define CU(fn) FUSEJIT_DRIVER_FUNCTION(fn)
//   fusejit::check(CU(cuMemAlloc)(&ptr, bytes), "cuMemAlloc");
#pragma once
#include <cuda.h>

#include <string>

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

// True when the driver loaded and initialised (cuInit); otherwise *why_not says why. Never
// throws.
bool driver_available(std::string* why_not = nullptr);

// Throws CudaError naming `what` and the driver's error name when `r` is not CUDA_SUCCESS.
void check(CUresult r, const char* what);

// The address of the driver's exported `symbol` (the exact, versioned name, e.g.
// "cuMemAlloc_v2"). Throws UnsupportedDevice without a driver and InvalidArgument("symbol")
// when the driver exports no such symbol.
void* driver_symbol(const char* symbol);

template <class Fn>
Fn driver_function(const char* symbol) {
  return reinterpret_cast<Fn>(driver_symbol(symbol));
}

}  // namespace fusejit
#pragma GCC visibility pop

// The driver function `fn` (a name as cuda.h spells it) with the signature cuda.h gives it: the
// header maps names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2), expanded here first.
#define FUSEJIT_DRIVER_SYMBOL_TEXT(fn) #fn
#define FUSEJIT_DRIVER_SYMBOL(fn) FUSEJIT_DRIVER_SYMBOL_TEXT(fn)
#define FUSEJIT_DRIVER_FUNCTION(fn) \
  (::fusejit::driver_function<decltype(&::fn)>(FUSEJIT_DRIVER_SYMBOL(fn)))
