#include <doctest/doctest.h>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"

using namespace fusejit;

namespace {

Problem problem() {
  Problem p;
  p.M = 1000, p.N = 200, p.K = 64;
  return p;
}

KernelConfig config() {
  return KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8");
}

}  // namespace

TEST_CASE("codegen is deterministic and specializes the prelude, not the templates") {
  const KernelSource a = generate(problem(), config());
  const KernelSource b = generate(problem(), config());
  CHECK(a.text == b.text);
  CHECK(a.name == b.name);
  CHECK(a.options == b.options);
  CHECK(a.text.find("static constexpr int M = 1000, N = 200, K = 64;") != std::string::npos);
  CHECK(a.text.find("using T = fj::bf16_t;") != std::string::npos);
  CHECK(a.text.find("#include \"kernels/tiled_gemm.cuh\"") != std::string::npos);
  // The templates travel as headers, byte for byte as embedded.
  CHECK(!a.headers.empty());
  bool has_epilogue = false;
  for (const auto& [name, text] : a.headers) has_epilogue |= name == "epilogue/bn_epilogue.cuh";
  CHECK(has_epilogue);
}

TEST_CASE("the kernel schedule follows the mode and whether M fits one tile") {
  Problem p = problem();
  // 8 row tiles: fj_apply merges the partials itself.
  CHECK(schedule(p, config()).fold_finalize);
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm", "fj_apply"});
  p.momentum = std::nullopt;
  CHECK(schedule(p, config()).kernels ==
        std::vector<std::string>{"fj_gemm", "fj_apply", "fj_bump"});
  // 9 row tiles: a finalize kernel merges them once per column.
  p.M = 8 * 128 + 1;
  CHECK(!schedule(p, config()).fold_finalize);
  CHECK(schedule(p, config()).kernels ==
        std::vector<std::string>{"fj_gemm", "fj_finalize", "fj_apply"});
  p.momentum = 0.1;
  CHECK(schedule(p, config()).kernels ==
        std::vector<std::string>{"fj_gemm", "fj_finalize", "fj_apply"});
  p.M = 128;
  CHECK(schedule(p, config()).single_pass);
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm"});
  p.momentum = std::nullopt;
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm", "fj_bump"});
  p.mode = Mode::eval;
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm"});
  const KernelSource src = generate(p, config());
  CHECK(src.kernels == std::vector<std::string>{"fj_gemm"});
}

TEST_CASE("the cache key changes when any one input changes, and only then") {
  const KernelSource src = generate(problem(), config());
  const std::string k = cache_key(src, "sm_90a", "13.0");
  CHECK(k.size() == 32);
  CHECK(cache_key(src, "sm_90a", "13.0") == k);
  CHECK(cache_key(generate(problem(), config()), "sm_90a", "13.0") == k);
  KernelSource s2 = src;
  s2.text += " ";
  CHECK(cache_key(s2, "sm_90a", "13.0") != k);
  KernelSource s3 = src;
  s3.options.push_back("-lineinfo");
  CHECK(cache_key(s3, "sm_90a", "13.0") != k);
  KernelSource s4 = src;
  s4.headers.back().second += "\n";
  CHECK(cache_key(s4, "sm_90a", "13.0") != k);
  CHECK(cache_key(src, "sm_80", "13.0") != k);
  CHECK(cache_key(src, "sm_90a", "13.1") != k);
  // The name is a label, not an input of the binary.
  KernelSource s5 = src;
  s5.name = "renamed";
  CHECK(cache_key(s5, "sm_90a", "13.0") == k);
}
