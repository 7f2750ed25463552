// KernelConfig::smem_bytes is what the planner prunes configs with before compiling anything;
// the kernels' own kSmemBytes (exported as fj_smem_bytes) is what they launch with. The two
// must agree exactly, or configs get pruned that fit, or pass pruning and fail to launch. The
// same holds for split-K's reduce kernel (splitk_reduce_smem_bytes, fj_splitk_reduce_smem_bytes).
// NVRTC compiles each candidate to PTX (no GPU needed), where the exported values are literals.
// Warpspec kernels also get the host's count as Spec::SMEM_BYTES, which WarpspecGemm
// static_asserts against sizeof(SharedStorage) + its alignment: a mismatch does not compile.
#include <doctest/doctest.h>
#include <nvrtc.h>

#include <algorithm>
#include <cctype>
#include <future>
#include <string>
#include <vector>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/config/candidates.hpp"
#include "test_stride.hpp"

using namespace fusejit;

namespace {

struct Exported {
  long gemm = -1, splitk_reduce = -1;  // -1: not found (or the compile failed)
  std::string log;                     // NVRTC's log
};

// `src` with Spec::SMEM_BYTES = bytes (replacing the value where codegen already emits one).
KernelSource with_smem_bytes(KernelSource src, long bytes) {
  std::string& t = src.text;
  const std::string field = "static constexpr int SMEM_BYTES = ";
  const std::string spec = "struct Spec {\n";
  if (const auto at = t.find(field); at != std::string::npos) {
    const auto value = at + field.size();
    t.replace(value, t.find(';', value) - value, std::to_string(bytes));
  } else if (const auto open = t.find(spec); open != std::string::npos) {
    t.insert(open + spec.size(), "  " + field + std::to_string(bytes) + ";\n");
  }
  return src;
}

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
  const nvrtcResult compiled =
      nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data());
  if (std::size_t log_size = 0; nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS) {
    value.log.assign(log_size, '\0');
    if (nvrtcGetProgramLog(prog, value.log.data()) != NVRTC_SUCCESS) value.log.clear();
  }
  if (compiled == NVRTC_SUCCESS && nvrtcGetPTXSize(prog, &size) == NVRTC_SUCCESS) {
    std::string ptx(size, '\0');
    if (nvrtcGetPTX(prog, ptx.data()) == NVRTC_SUCCESS) {
      // "<symbol> = <digits>;" at a word start. Not std::regex: building one in several
      // threads at once races in libstdc++'s ctype cache (a ThreadSanitizer report).
      auto literal = [&ptx](const char* symbol) {
        const std::string key = std::string(symbol) + " = ";
        for (auto at = ptx.find(key); at != std::string::npos; at = ptx.find(key, at + 1)) {
          const char before = at == 0 ? ' ' : ptx[at - 1];
          if (std::isalnum(static_cast<unsigned char>(before)) || before == '_') continue;
          std::size_t end = at + key.size();
          while (end < ptx.size() && std::isdigit(static_cast<unsigned char>(ptx[end]))) ++end;
          if (end > at + key.size() && end < ptx.size() && ptx[end] == ';')
            return std::stol(ptx.substr(at + key.size(), end - at - key.size()));
        }
        return -1L;
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
  // The FUSEJIT_TEST_STRIDE sample (test_stride.hpp) of the cases, each compiled to read its
  // exported sizes.
  std::vector<Case> sample;
  for (std::size_t i = 0; i < cases.size(); ++i)
    if (fusejit::test::in_sample(cases[i].config.key() + " " + cases[i].problem.key()))
      sample.push_back(cases[i]);
  cases = std::move(sample);
  REQUIRE(!cases.empty());
  std::vector<std::future<Exported>> got;
  for (const Case& c : cases)
    got.push_back(std::async(std::launch::async, [&c] {
      KernelSource src = generate(c.problem, c.config);
      // The kernel checks the host's count itself (and fails to compile on a mismatch).
      if (c.config.variant == Variant::warpspec)
        src = with_smem_bytes(std::move(src), c.config.smem_bytes(c.problem));
      return exported_smem(src, c.compute);
    }));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].config.key());
    CAPTURE(cases[i].problem.key());
    const Exported e = got[i].get();
    INFO("NVRTC log:\n" << e.log);
    CHECK(e.gemm == cases[i].config.smem_bytes(cases[i].problem));
    if (cases[i].config.split_k > 1)
      CHECK(e.splitk_reduce == cases[i].config.splitk_reduce_smem_bytes());
    else
      CHECK(e.splitk_reduce == -1);
  }
}

TEST_CASE("a warpspec Spec whose SMEM_BYTES disagrees with the kernel's layout does not compile") {
  Problem p;
  p.M = 4096, p.N = 1000, p.K = 1000, p.dtype = DType::bf16, p.mode = Mode::eval;
  const auto cs = candidate_configs(p, Device::for_arch("sm_90a"));
  const auto ws = std::find_if(
      cs.begin(), cs.end(), [](const KernelConfig& c) { return c.variant == Variant::warpspec; });
  REQUIRE(ws != cs.end());
  CAPTURE(ws->key());
  const long host = ws->smem_bytes(p);
  const KernelSource src = generate(p, *ws);
  const Exported right = exported_smem(with_smem_bytes(src, host), "compute_90a");
  INFO("NVRTC log:\n" << right.log);
  CHECK(right.gemm == host);
  // 16 bytes off: the smallest step the layout's members could be off by.
  const Exported wrong = exported_smem(with_smem_bytes(src, host + 16), "compute_90a");
  CHECK(wrong.gemm == -1);
  CHECK(wrong.log.find("SMEM_BYTES") != std::string::npos);
}
