// KernelConfig::smem_bytes is what the planner prunes configs with before compiling anything;
// the kernels' own kSmemBytes (exported as fj_smem_bytes) is what they launch with. The two
// must agree exactly, or configs get pruned that fit, or pass pruning and fail to launch. The
// same holds for split-K's reduce kernel (splitk_reduce_smem_bytes, fj_splitk_reduce_smem_bytes).
// NVRTC compiles each candidate to PTX (no GPU needed), where the exported values are literals.
#include <doctest/doctest.h>
#include <nvrtc.h>

#include <algorithm>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/config/candidates.hpp"

using namespace fusejit;

namespace {

struct Exported {
  long gemm = -1, splitk_reduce = -1;  // -1: not found (or the compile failed)
};

// The fj_smem_bytes and fj_splitk_reduce_smem_bytes literals of `src` compiled to PTX for
// compute_XY.
Exported exported_smem(const KernelSource& src, const std::string& compute) {
  std::vector<const char*> names, texts;
  for (const auto& [n, t] : src.headers) {
    names.push_back(n.c_str());
    texts.push_back(t.c_str());
  }
  nvrtcProgram prog = nullptr;
  if (nvrtcCreateProgram(&prog, src.text.c_str(), "k.cu", static_cast<int>(texts.size()),
                         texts.data(), names.data()) != NVRTC_SUCCESS)
    return {};
  std::vector<std::string> opts = src.options;
  opts.push_back("--gpu-architecture=" + compute);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  Exported value;
  std::size_t size = 0;
  if (nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data()) == NVRTC_SUCCESS &&
      nvrtcGetPTXSize(prog, &size) == NVRTC_SUCCESS) {
    std::string ptx(size, '\0');
    if (nvrtcGetPTX(prog, ptx.data()) == NVRTC_SUCCESS) {
      auto literal = [&ptx](const char* symbol) {
        std::smatch m;
        const std::regex re(std::string(R"(\b)") + symbol + R"( = (\d+);)");
        return std::regex_search(ptx, m, re) ? std::stol(m[1]) : -1L;
      };
      value.gemm = literal("fj_smem_bytes");
      value.splitk_reduce = literal("fj_splitk_reduce_smem_bytes");
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
  auto add = [&](DType d, Mode m, std::int64_t M, const char* arch, const char* compute,
                 std::int64_t N = 1000) {
    Problem p;
    p.M = M, p.N = N, p.K = 1000, p.dtype = d, p.mode = m;
    for (const auto& c : candidate_configs(p, Device::for_arch(arch)))
      cases.push_back({p, c, compute});
  };
  // Every warpspec shape (cooperative and pingpong, thread and TMA stores) in both epilogue
  // modes, every tiled math kind on sm_80.
  add(DType::bf16, Mode::train, 4096, "sm_90a", "compute_90a");
  add(DType::fp16, Mode::eval, 4096, "sm_90a", "compute_90a");
  add(DType::tf32, Mode::eval, 4096, "sm_90a", "compute_90a");
  add(DType::fp32, Mode::train, 4096, "sm_80", "compute_80");
  add(DType::fp16, Mode::eval, 4096, "sm_80", "compute_80");
  // Small grids: the split-K candidates and their reduce kernel's shared memory.
  add(DType::fp32, Mode::train, 128, "sm_80", "compute_80", 512);
  add(DType::tf32, Mode::eval, 128, "sm_90a", "compute_90a", 512);
  add(DType::bf16, Mode::train, 100, "sm_80", "compute_80", 512);
  REQUIRE(cases.size() >= 15);
  REQUIRE(std::count_if(cases.begin(), cases.end(),
                        [](const Case& c) { return c.config.tma_store; }) >= 4);
  REQUIRE(std::count_if(cases.begin(), cases.end(),
                        [](const Case& c) { return c.config.split_k > 1; }) >= 8);
  std::vector<std::future<Exported>> got;
  for (const Case& c : cases)
    got.push_back(std::async(std::launch::async, [&c] {
      return exported_smem(generate(c.problem, c.config), c.compute);
    }));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].config.key());
    CAPTURE(cases[i].problem.key());
    const Exported e = got[i].get();
    CHECK(e.gemm == cases[i].config.smem_bytes(cases[i].problem));
    if (cases[i].config.split_k > 1)
      CHECK(e.splitk_reduce == cases[i].config.splitk_reduce_smem_bytes());
    else
      CHECK(e.splitk_reduce == -1);
  }
}
