// For the CPU tests that NVRTC-compile many kernel sets for every architecture: the
// architectures fusejit supports here, and one parallel compile of a list of (arch, source), or
// for an exhaustive enumeration the FUSEJIT_TEST_STRIDE sample of it (test_stride.hpp).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/error.hpp"
#include "test_stride.hpp"

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
  std::string what;  // how a failure names the job (default: the kernel set's name)
};

enum class Coverage {
  every,   // compile every job
  sampled  // an exhaustive enumeration: the FUSEJIT_TEST_STRIDE sample (test_stride.hpp), with
           // each arch's first job
};

// What a caller checks of each compiled job (e.g. ptxas's report): "" or failure lines.
using CompiledCheck = std::function<std::string(const CompileJob&, const CompiledKernel&)>;

// Compiles the jobs on all cores; returns one line per failure (empty: all compiled and passed
// `check`), with the first error of the NVRTC log.
inline std::string compile_jobs(const std::vector<CompileJob>& jobs,
                                Coverage coverage = Coverage::every,
                                const CompiledCheck& check = {}) {
  std::vector<const CompileJob*> sample;
  std::map<std::string, std::size_t> seen;  // arch -> jobs of that arch so far
  for (const CompileJob& j : jobs)
    if (coverage == Coverage::every || seen[j.arch]++ == 0 ||
        in_sample(j.arch + " " + j.src.name + " " + j.what))
      sample.push_back(&j);
  if (sample.size() < jobs.size())
    std::fprintf(stderr, "compile_jobs: %zu of %zu jobs (FUSEJIT_TEST_STRIDE=%zu)\n", sample.size(),
                 jobs.size(), test_stride());
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  std::vector<std::future<std::string>> futures;
  std::atomic<std::size_t> next{0};
  for (unsigned w = 0; w < workers; ++w)
    futures.push_back(std::async(std::launch::async, [&] {
      std::string failures;
      for (std::size_t i = next++; i < sample.size(); i = next++) {
        const CompileJob& j = *sample[i];
        const std::string& what = j.what.empty() ? j.src.name : j.what;
        try {
          const CompiledKernel k = compile(j.src, j.arch);
          if (k.binary.empty())
            failures += what + " " + j.arch + ": empty\n";
          else if (check)
            failures += check(j, k);
        } catch (const CompileError& e) {
          const std::string& log = e.log();
          const auto at = log.find("error");
          failures += fmt::format("{} {}: {}\n", what, j.arch,
                                  log.substr(at == std::string::npos ? 0 : at, 200));
        } catch (const std::exception& e) {
          failures += what + " " + j.arch + ": " + e.what() + "\n";
        }
      }
      return failures;
    }));
  std::string failures;
  for (auto& f : futures) failures += f.get();
  return failures;
}

}  // namespace fusejit::test
