// NVRTC: generated source -> cubin for one architecture (PTX when the arch is newer than this
// NVRTC knows; the driver JIT-compiles it). Thread-safe.
#pragma once
#include <string>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/compile/ptxas_report.hpp"

namespace fusejit {

struct CompiledKernel {
  std::string arch;            // what was asked for, e.g. "sm_90a"
  bool is_ptx = false;         // true: `binary` is PTX text for the driver to JIT
  std::vector<char> binary;    // cubin or PTX
  double compile_seconds = 0;  // 0 when it came from a cache
  bool cache_hit = false;
  bool stored = false;  // compile_cached: the disk cache holds it now (a hit, or stored)
  // compile() of a cubin: ptxas's account of each function (registers, spills). Empty for PTX
  // (the driver assembles it) and for cache hits (the entry keeps only the binary).
  std::vector<FunctionResources> functions;
};

// "13.0"
std::string nvrtc_version();
// Architectures (compute capabilities, e.g. 80, 90) this NVRTC can emit cubin for.
std::vector<int> nvrtc_supported_archs();

// The exact NVRTC options used for `arch` (after the source's own options). A cubin's include
// ptxas -v, whose report (CompiledKernel::functions) changes no code (only the cubin's note of
// the options it was built with), so it is not part of the cache key.
std::vector<std::string> compile_options(const KernelSource& src, const std::string& arch);

// Compiles `src` for `arch` ("sm_80", "sm_90a", ...). Throws CompileError carrying the log,
// the options and the generated source lines the log points at.
CompiledKernel compile(const KernelSource& src, const std::string& arch);

// Everything that can change the binary: fusejit's cache format version, NVRTC version,
// arch, options and every byte of source and headers. A 128-bit hash as 32 hex digits.
std::string cache_key(const KernelSource& src, const std::string& arch,
                      const std::string& nvrtc_version_text);

// Disk cache first, then NVRTC (storing the result). Never throws for cache trouble.
CompiledKernel compile_cached(const KernelSource& src, const std::string& arch,
                              const std::string& cache_dir = {});

}  // namespace fusejit
