// For the CPU tests that NVRTC-compile many kernel sets for every architecture: the
// architectures fusejit supports here, and one parallel compile of a list of (arch, source).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/compile/compiler.hpp"

namespace fusejit::test {

// sm_80 and up as NVRTC lists them, sm_90 as sm_90a (where wgmma lives).
inline std::vector<std::string> supported_archs() {
  std::vector<std::string> archs;
  for (int cc : nvrtc_supported_archs())
    if (cc >= 80) archs.push_back(cc == 90 ? "sm_90a" : fmt::format("sm_{}", cc));
  return archs;
}

struct CompileJob {
  std::string arch;
  KernelSource src;
};

// Compiles every job on all cores; returns one line per failure (empty: all compiled).
inline std::string compile_jobs(const std::vector<CompileJob>& jobs) {
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  std::vector<std::future<std::string>> futures;
  std::atomic<std::size_t> next{0};
  for (unsigned w = 0; w < workers; ++w)
    futures.push_back(std::async(std::launch::async, [&] {
      std::string failures;
      for (std::size_t i = next++; i < jobs.size(); i = next++) {
        try {
          if (compile(jobs[i].src, jobs[i].arch).binary.empty())
            failures += jobs[i].src.name + " " + jobs[i].arch + ": empty\n";
        } catch (const std::exception& e) {
          failures += jobs[i].src.name + " " + jobs[i].arch + ": " + e.what() + "\n";
        }
      }
      return failures;
    }));
  std::string failures;
  for (auto& f : futures) failures += f.get();
  return failures;
}

}  // namespace fusejit::test
