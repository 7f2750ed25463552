// No config passes validation and then fails to compile: every config candidate_configs offers
// over a grid of shapes, and a deterministic sample of the keys KernelConfig::parse accepts (and
// why_invalid calls valid) over a grid of problems, compile with NVRTC for sm_80 and sm_90a.
// FUSEJIT_CONFIG_SAMPLES=N samples N accepted keys per architecture instead of the default (the
// sweep that found the templates' unmirrored static_asserts compiled 2,000).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "test_nvrtc_jobs.hpp"

using namespace fusejit;

namespace {

const char* const kArchs[] = {"sm_80", "sm_90a"};

// Shapes for every schedule: single-pass train (M <= BM), two-pass with few row tiles (folded
// finalize) and with many (fj_finalize), tails in M, N and K, a short K, a K long enough for
// split-K candidates, and N not a multiple of 8 (no TMA stores).
constexpr std::int64_t kShapes[][3] = {{100, 200, 72},   {1000, 200, 64}, {3000, 72, 1000},
                                       {128, 512, 1000}, {300, 7, 5},     {64, 64, 64}};

struct Job {
  Problem problem;
  KernelConfig config;
  std::string arch;
};

Problem make_problem(const std::int64_t (&s)[3], DType d, Mode m, int variation) {
  Problem p;
  p.M = s[0], p.N = s[1], p.K = s[2], p.dtype = d, p.mode = m;
  if (variation == 1) {
    p.momentum = std::nullopt;  // fj_bump
    p.param_dtype = storage_type(d);
  } else if (variation == 2) {
    // Padded rows at the element's own alignment: the narrowest loads and stores.
    p.alignment = static_cast<int>(storage_bytes(d));
    p.ldx = p.K + 1, p.ldw = p.K + 3, p.ldy = p.N + 1;
  }
  return p;
}

// Generates every job's kernel set (the host code, in full) and compiles them, or the sample
// FUSEJIT_TEST_STRIDE asks for; the failures, one per line.
std::string compile_all(const std::vector<Job>& jobs) {
  std::vector<fusejit::test::CompileJob> compile;
  for (const Job& j : jobs)
    compile.push_back({j.arch, generate(j.problem, j.config),
                       fmt::format("{} {}", j.problem.key(), j.config.key())});
  return fusejit::test::compile_jobs(compile, fusejit::test::Coverage::sampled);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("the keys of the issue-22 sweep that failed in NVRTC are refused, saying why") {
  const Device h100 = Device::for_arch("sm_90a");
  Problem p;
  p.M = 1000, p.N = 200, p.K = 64, p.dtype = DType::bf16, p.mode = Mode::train;
  // BnEpilogue<Spec, NT>'s static_assert: 64 threads cannot share 96 columns evenly, and the
  // warpspec kernel instantiates BnEpilogue<Spec, 128 x consumers> even with the fragment
  // epilogue, which 192 columns do not nest with.
  for (const char* key :
       {"tiled.64x96x64.w1x2.s3.g1", "warpspec.64x192x64.c2.s2.g8.cl1.p1.pp",
        "warpspec.128x192x64.c2.s4.g8.cl1.p1", "warpspec.64x192x64.c1.s4.g8.cl1.p0"}) {
    CAPTURE(key);
    CHECK(KernelConfig::parse(key).why_invalid(p, h100).find("must nest") != std::string::npos);
  }
}

TEST_CASE("every candidate config compiles for sm_80 and sm_90a over a grid of shapes") {
  // Every problem of the grid that offers each (arch, dtype, key); one of them is compiled,
  // taken in turn (the n-th key its n-th problem, cyclically), so that modes, strides and shapes
  // vary over the keys while the compile count stays that of the distinct keys.
  std::map<std::string, std::vector<Job>> offers;
  std::size_t offered = 0;
  for (const char* arch : kArchs) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16})
      for (Mode m : {Mode::train, Mode::eval})
        for (int variation = 0; variation < 3; ++variation)
          for (const auto& s : kShapes) {
            const Problem p = make_problem(s, d, m, variation);
            p.validate();
            for (const KernelConfig& c : candidate_configs(p, dev)) {
              ++offered;
              offers[fmt::format("{} {} {}", arch, name(d), c.key())].push_back(Job{p, c, arch});
            }
          }
  }
  std::vector<Job> jobs;
  for (auto& [key, js] : offers) jobs.push_back(js[jobs.size() % js.size()]);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string failures = compile_all(jobs);
  MESSAGE(offered << " candidates offered, " << jobs.size()
                  << " distinct keys compiled (or the FUSEJIT_TEST_STRIDE sample) in "
                  << seconds_since(t0) << " s");
  CHECK_MESSAGE(failures.empty(), failures);
}

TEST_CASE("a deterministic sample of the keys parse and why_invalid accept compiles") {
  int per_arch = 40;
  if (const char* env = std::getenv("FUSEJIT_CONFIG_SAMPLES")) per_arch = std::atoi(env);
  REQUIRE(per_arch >= 0);
  // Field values around and between the valid ones, so that every rule of why_invalid is both
  // met and missed: odd multiples of 8 and 16, non-powers of two, warps that do not divide.
  const int tiles[] = {16, 24, 32, 48, 64, 96, 128, 192, 256};
  const int bks[] = {4, 8, 16, 24, 32, 64, 128, 256};
  const int warps[] = {1, 2, 3, 4, 8};
  std::mt19937 rng(22);
  auto pick = [&](const auto& pool) {
    return pool[std::uniform_int_distribution<std::size_t>(0, std::size(pool) - 1)(rng)];
  };
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Job> jobs;
  std::size_t tried = 0;
  for (const char* arch : kArchs) {
    const Device dev = Device::for_arch(arch);
    int accepted = 0;
    // Bounded, in case a rule change makes acceptance rare: the count check below then fails.
    for (int attempt = 0; attempt < 200000 && accepted < per_arch; ++attempt) {
      // One draw per statement: the order of evaluation of function arguments is unspecified,
      // and the sample must be the same with every compiler.
      const bool ws = dev.cc() == 90 && uniform(0, 1) == 1;
      const int bm = pick(tiles), bn = pick(tiles), bk = pick(bks);
      const int stages = uniform(2, ws ? 8 : 5);
      const int group = pick(std::array{1, 8, 16});
      std::string key;
      if (ws) {
        const int consumers = uniform(1, 2), cluster = uniform(1, 2), persistent = uniform(0, 1);
        const char* suffix = pick(std::array{"", "", ".pp", ".ts"});
        key = fmt::format("warpspec.{}x{}x{}.c{}.s{}.g{}.cl{}.p{}{}", bm, bn, bk, consumers, stages,
                          group, cluster, persistent, suffix);
      } else {
        const int wm = pick(warps), wn = pick(warps), split = uniform(1, 4);
        key = fmt::format("tiled.{}x{}x{}.w{}x{}.s{}.g{}{}", bm, bn, bk, wm, wn, stages, group,
                          split > 1 ? fmt::format(".k{}", split) : "");
      }
      const KernelConfig c = KernelConfig::parse(key);
      const DType dtype =
          std::array{DType::fp32, DType::tf32, DType::fp16, DType::bf16}[uniform(0, 3)];
      const Mode mode = uniform(0, 1) ? Mode::train : Mode::eval;
      const auto& shape = kShapes[uniform(0, static_cast<int>(std::size(kShapes)) - 1)];
      const Problem p = make_problem(shape, dtype, mode, uniform(0, 2));
      ++tried;
      if (!c.valid_for(p, dev)) continue;
      CHECK(KernelConfig::parse(c.key()).key() == c.key());
      jobs.push_back({p, c, arch});
      ++accepted;
    }
    CHECK(accepted == per_arch);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string failures = compile_all(jobs);
  MESSAGE(tried << " keys tried, " << jobs.size()
                << " accepted and compiled (or the FUSEJIT_TEST_STRIDE sample) in "
                << seconds_since(t0) << " s");
  CHECK_MESSAGE(failures.empty(), failures);
}
