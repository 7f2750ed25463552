#include "fusejit/device/driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "fusejit/error.hpp"

namespace fusejit {

namespace {

struct Loaded {
  void* lib = nullptr;
  Driver driver;
  std::string error;  // empty when loaded
};

Loaded load() {
  Loaded out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    out.error = "no GPU driver: libcuda.so.1 could not be loaded (" + std::string(dlerror()) +
                "); fusejit can still generate and compile kernels (fusejit compile)";
    return out;
  }
  out.lib = lib;
  Driver& d = out.driver;
  // dlsym the exact symbol the header maps each name to (cuMemAlloc -> cuMemAlloc_v2), so every
  // pointer has precisely the signature we call it with. (cuGetProcAddress by base name would
  // return the newest ABI, e.g. cuCtxSynchronize_v2(CUcontext) under CUDA 13, which differs.)
#define FUSEJIT_SYMBOL_NAME(fn) #fn
#define FUSEJIT_EXPANDED_NAME(fn) FUSEJIT_SYMBOL_NAME(fn)
#define FUSEJIT_RESOLVE(fn)                                                          \
  d.fn = reinterpret_cast<decltype(d.fn)>(dlsym(lib, FUSEJIT_EXPANDED_NAME(fn)));    \
  if (!d.fn) {                                                                       \
    out.error = "GPU driver too old: libcuda.so.1 lacks " FUSEJIT_EXPANDED_NAME(fn); \
    return out;                                                                      \
  }
  FUSEJIT_DRIVER_FUNCTIONS(FUSEJIT_RESOLVE)
#undef FUSEJIT_RESOLVE
#undef FUSEJIT_EXPANDED_NAME
#undef FUSEJIT_SYMBOL_NAME
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    const char* n = nullptr;
    d.cuGetErrorName(r, &n);
    out.error = std::string("no usable GPU: cuInit failed with ") + (n ? n : "?");
    return out;
  }
  d.cuDriverGetVersion(&d.version);
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw UnsupportedDevice(l.error);
  return l.driver;
}

bool driver_available(std::string* why_not) {
  const Loaded& l = loaded();
  if (why_not) *why_not = l.error;
  return l.error.empty();
}

void* driver_symbol(const char* symbol) {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw UnsupportedDevice(l.error);
  void* address = symbol != nullptr ? dlsym(l.lib, symbol) : nullptr;
  if (address == nullptr)
    throw InvalidArgument("symbol", std::string("the CUDA driver exports no '") +
                                        printable(symbol != nullptr ? symbol : "") + "'");
  return address;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* n = nullptr;
  const char* s = nullptr;
  driver().cuGetErrorName(r, &n);
  driver().cuGetErrorString(r, &s);
  throw CudaError(std::string(what) + " failed: " + (n ? n : "?") + " (" + (s ? s : "") + ")",
                  static_cast<int>(r));
}

}  // namespace fusejit
