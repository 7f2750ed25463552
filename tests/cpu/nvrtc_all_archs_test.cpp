// Every kernel variant compiles with NVRTC for every architecture fusejit supports: sm_80,
// sm_86, sm_89, sm_90a and each newer arch this NVRTC lists. No GPU needed.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/kernel_config.hpp"
#include "fusejit/error.hpp"

using namespace fusejit;

namespace {

// One problem per schedule: eval, train two-pass, train single-pass, single-pass cumulative;
// odd sizes so the tail paths are instantiated too.
std::vector<Problem> problems(DType d) {
  std::vector<Problem> out;
  for (int i = 0; i < 4; ++i) {
    Problem p;
    p.dtype = d;
    p.M = i == 1 ? 1000 : 100;
    p.N = 200;
    p.K = 72;
    p.mode = i == 0 ? Mode::eval : Mode::train;
    if (i == 3) p.momentum = std::nullopt;
    if (i == 2) p.param_dtype = storage_type(d);
    out.push_back(p);
  }
  Problem odd;  // 2-byte aligned rows: the non-cp.async load path
  odd.dtype = d, odd.M = 100, odd.N = 7, odd.K = 5, odd.mode = Mode::eval;
  odd.alignment = static_cast<int>(storage_bytes(d));
  out.push_back(odd);
  return out;
}

// ptxas's report (-v) for `src` compiled to cubin for `arch`, or "nvrtc failed: <log>".
std::string ptxas_report(const KernelSource& src, const std::string& arch) {
  std::vector<const char*> names, texts;
  for (const auto& [n, t] : src.headers) {
    names.push_back(n.c_str());
    texts.push_back(t.c_str());
  }
  nvrtcProgram prog = nullptr;
  if (nvrtcCreateProgram(&prog, src.text.c_str(), "k.cu", static_cast<int>(texts.size()),
                         texts.data(), names.data()) != NVRTC_SUCCESS)
    return "nvrtc failed: nvrtcCreateProgram";
  std::vector<std::string> opts = compile_options(src, arch);
  opts.push_back("--ptxas-options=-v");
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  const bool ok =
      nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data()) == NVRTC_SUCCESS;
  std::size_t size = 0;
  std::string log;
  if (nvrtcGetProgramLogSize(prog, &size) == NVRTC_SUCCESS) {
    log.assign(size, '\0');
    if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) log.clear();
  }
  nvrtcDestroyProgram(&prog);
  return ok ? log : "nvrtc failed: " + log;
}

}  // namespace

TEST_CASE("every variant compiles for every supported architecture") {
  std::vector<std::string> archs;
  for (int cc : nvrtc_supported_archs())
    if (cc >= 80) archs.push_back(cc == 90 ? "sm_90a" : fmt::format("sm_{}", cc));
  for (const char* must : {"sm_80", "sm_86", "sm_89", "sm_90a"})
    REQUIRE(std::find(archs.begin(), archs.end(), std::string(must)) != archs.end());
  struct Job {
    std::string arch;
    KernelSource src;
  };
  std::vector<Job> jobs;
  for (const auto& arch : archs) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
      for (const Problem& p : problems(d)) {
        // Every variant that can run this problem here: the heuristic's tiled pick, and on
        // sm_90a the warpspec pick.
        for (Variant v : {Variant::tiled, Variant::warpspec}) {
          KernelConfig c;
          try {
            c = default_config(p, dev, v);
          } catch (const InvalidArgument&) {
            continue;  // variant not available for this problem/arch (checked in config_test)
          }
          jobs.push_back({arch, generate(p, c)});
        }
      }
    }
  }
  MESSAGE(jobs.size() << " kernel sets over " << archs.size() << " architectures");
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  std::vector<std::future<std::string>> futures;
  std::atomic<std::size_t> next{0};
  for (unsigned w = 0; w < workers; ++w)
    futures.push_back(std::async(std::launch::async, [&] {
      std::string failures;
      for (std::size_t i = next++; i < jobs.size(); i = next++) {
        try {
          const CompiledKernel k = compile(jobs[i].src, jobs[i].arch);
          if (k.binary.empty()) failures += jobs[i].src.name + " " + jobs[i].arch + ": empty\n";
        } catch (const std::exception& e) {
          failures += jobs[i].src.name + " " + jobs[i].arch + ": " + e.what() + "\n";
        }
      }
      return failures;
    }));
  std::string failures;
  for (auto& f : futures) failures += f.get();
  CHECK_MESSAGE(failures.empty(), failures);
}

TEST_CASE("strict fp32's 8x16 lane-block candidates compile for sm_80 and sm_90a without spills") {
  // 128 accumulators a lane sit close to the 255-register cap of a 128-thread CTA: a spill would
  // put local memory into the FFMA loop.
  struct Job {
    Problem problem;
    KernelConfig config;
    std::string arch;
  };
  std::vector<Job> jobs;
  for (const char* arch : {"sm_80", "sm_90a"}) {
    for (int i = 0; i < 3; ++i) {
      Problem p;
      p.dtype = DType::fp32;
      p.M = i < 2 ? 1024 : 1000;  // the target shape, then tails in every dimension
      p.N = i < 2 ? 8192 : 200;
      p.K = i < 2 ? 8192 : 72;
      p.mode = i == 1 ? Mode::eval : Mode::train;
      for (const auto& c : candidate_configs(p, Device::for_arch(arch)))
        if (c.bm * c.bn / c.threads() == 128) jobs.push_back({p, c, arch});
    }
  }
  REQUIRE(jobs.size() >= 2 * 3 * 4);
  std::vector<std::string> logs(jobs.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < std::max(2u, std::thread::hardware_concurrency()); ++w)
    workers.emplace_back([&] {
      for (std::size_t i = next++; i < jobs.size(); i = next++)
        logs[i] = ptxas_report(generate(jobs[i].problem, jobs[i].config), jobs[i].arch);
    });
  for (auto& w : workers) w.join();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(jobs[i].problem.key());
    CAPTURE(jobs[i].config.key());
    CAPTURE(jobs[i].arch);
    INFO(logs[i]);
    CHECK(logs[i].rfind("nvrtc failed", 0) == std::string::npos);
    CHECK(logs[i].find("Function properties for fj_gemm") != std::string::npos);
    CHECK_FALSE(std::regex_search(logs[i], std::regex(R"([1-9]\d* bytes spill)")));
  }
}

TEST_CASE("a compile error carries the log, the options and the offending line") {
  KernelSource src;
  src.name = "broken";
  src.text = "extern \"C\" __global__ void k() {\n  int x = ;\n}\n";
  src.options = {"--std=c++17"};
  try {
    compile(src, "sm_80");
    FAIL("compile() accepted invalid source");
  } catch (const CompileError& e) {
    CHECK(e.log().find("error") != std::string::npos);
    CHECK(e.options().find("--gpu-architecture=sm_80") != std::string::npos);
    CHECK(std::string(e.what()).find("int x = ;") != std::string::npos);
  }
}

TEST_CASE("an architecture newer than NVRTC knows gets PTX for the newest it knows") {
  const int newest = nvrtc_supported_archs().back();
  KernelSource src;
  src.name = "tiny";
  src.text = "extern \"C\" __global__ void k(int* p) { *p = 1; }\n";
  const CompiledKernel k = compile(src, fmt::format("sm_{}", newest + 10));
  CHECK(k.is_ptx);
  const std::string text(k.binary.begin(), k.binary.end());
  CHECK(text.find(fmt::format(".target sm_{}", newest)) != std::string::npos);
}
