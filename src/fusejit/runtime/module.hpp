// A compiled kernel set loaded into a CUDA context, with its functions ready to launch.
// Loaded modules are cached in-process by (context, cache key): a second plan of the same
// kernels costs no load. The cache is bounded (least recently used dropped first) so a
// long-running process that plans ever new shapes does not keep every module loaded.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusejit/compile/compiler.hpp"

namespace fusejit {

class Module {
 public:
  // Loads `compiled` into the current context and resolves `kernels`. Throws CudaError.
  Module(const CompiledKernel& compiled, const std::vector<std::string>& kernels);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  CUfunction function(const std::string& name) const;  // throws InvalidArgument("kernel", ...)
  // The values of an `extern "C" __device__ const int` (or int[count]) the generated source
  // defines. Reads device memory: for plan time, never a hot path.
  int read_int(const char* symbol) const { return read_ints(symbol, 1)[0]; }
  std::vector<int> read_ints(const char* symbol, std::size_t count) const;

  // The cached module for (current context, key), loading it on first use. Thread-safe.
  static std::shared_ptr<const Module> get(const std::string& key, const CompiledKernel& compiled,
                                           const std::vector<std::string>& kernels);
  // Whether get() would hit without compiling (lets callers skip codegen + disk cache).
  static std::shared_ptr<const Module> find(const std::string& key);

  // At most `count` modules are kept by the cache (over all contexts); past that the least
  // recently used (by get/find) are dropped from it. Dropping only releases the cache's
  // reference: a module a live plan holds stays loaded until that plan goes. 0 restores the
  // default: FUSEJIT_MAX_KERNEL_SETS when it is a positive integer, else 256. Applies at once.
  static void set_max_loaded(std::size_t count);
  static std::size_t max_loaded();
  // How many modules the cache holds now (for tests and diagnostics).
  static std::size_t loaded_count();
  // How many modules are loaded in this process now: the cache's and those only plans (and
  // the cores and plan recipes that serve them) still hold.
  static std::size_t live_count();

 private:
  CUmodule module_ = nullptr;
  std::map<std::string, CUfunction> functions_;
};

}  // namespace fusejit
