// KernelConfig::smem_bytes is what the planner prunes configs with before compiling anything;
// the kernels' own kSmemBytes (exported as fj_smem_bytes) is what they launch with. The two
// must agree exactly, or configs get pruned that fit, or pass pruning and fail to launch. NVRTC
// compiles each candidate to PTX (no GPU needed), where the exported value is a literal.
#include <doctest/doctest.h>
#include <nvrtc.h>

#include <future>
#include <regex>
#include <string>
#include <vector>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/config/kernel_config.hpp"

using namespace fusejit;

namespace {

// The fj_smem_bytes literal of `src` compiled to PTX for compute_XY; -1 on failure.
long exported_smem(const KernelSource& src, const std::string& compute) {
  std::vector<const char*> names, texts;
  for (const auto& [n, t] : src.headers) {
    names.push_back(n.c_str());
    texts.push_back(t.c_str());
  }
  nvrtcProgram prog = nullptr;
  if (nvrtcCreateProgram(&prog, src.text.c_str(), "k.cu", static_cast<int>(texts.size()),
                         texts.data(), names.data()) != NVRTC_SUCCESS)
    return -1;
  std::vector<std::string> opts = src.options;
  opts.push_back("--gpu-architecture=" + compute);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  long value = -1;
  std::size_t size = 0;
  if (nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data()) == NVRTC_SUCCESS &&
      nvrtcGetPTXSize(prog, &size) == NVRTC_SUCCESS) {
    std::string ptx(size, '\0');
    if (nvrtcGetPTX(prog, ptx.data()) == NVRTC_SUCCESS) {
      std::smatch m;
      if (std::regex_search(ptx, m, std::regex(R"(fj_smem_bytes = (\d+);)")))
        value = std::stol(m[1]);
    }
  }
  nvrtcDestroyProgram(&prog);
  return value;
}

struct Case {
  Problem problem;
  KernelConfig config;
  std::string compute;
};

}  // namespace

TEST_CASE("every candidate's shared-memory formula equals the kernel's own size") {
  std::vector<Case> cases;
  auto add = [&](DType d, Mode m, std::int64_t M, const char* arch, const char* compute) {
    Problem p;
    p.M = M, p.N = 1000, p.K = 1000, p.dtype = d, p.mode = m;
    for (const auto& c : candidate_configs(p, Device::for_arch(arch)))
      cases.push_back({p, c, compute});
  };
  // Every warpspec shape (cooperative and pingpong) in both epilogue modes, every tiled math
  // kind on sm_80.
  add(DType::bf16, Mode::train, 4096, "sm_90a", "compute_90a");
  add(DType::tf32, Mode::eval, 4096, "sm_90a", "compute_90a");
  add(DType::fp32, Mode::train, 4096, "sm_80", "compute_80");
  add(DType::fp16, Mode::eval, 4096, "sm_80", "compute_80");
  REQUIRE(cases.size() >= 15);
  std::vector<std::future<long>> got;
  for (const Case& c : cases)
    got.push_back(std::async(std::launch::async, [&c] {
      return exported_smem(generate(c.problem, c.config), c.compute);
    }));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].config.key());
    CAPTURE(cases[i].problem.key());
    CHECK(got[i].get() == cases[i].config.smem_bytes(cases[i].problem));
  }
}
