// Every kernel variant compiles with NVRTC for every architecture fusejit supports: sm_80,
// sm_86, sm_89, sm_90a and each newer arch this NVRTC lists. No GPU needed.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "test_nvrtc_jobs.hpp"
#include "tools/sweep.hpp"

using namespace fusejit;

namespace {

// One problem per schedule: eval, train two-pass, train single-pass, single-pass cumulative,
// synchronized; odd sizes so the tail paths are instantiated too.
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
  // Synchronized statistics (fj_rank_stats, fj_rank_finalize, fj_bump), with M below a row
  // tile (still two-pass) and momentum=None; one 16-bit and the SIMT mainloop are enough for
  // the BatchNorm kernels, which do not depend on the math.
  if (d == DType::bf16 || d == DType::fp32) {
    Problem synced;
    synced.dtype = d, synced.M = 50, synced.N = 200, synced.K = 72, synced.stat_ranks = 3;
    synced.momentum = std::nullopt;
    out.push_back(synced);
  }
  return out;
}

// Split-K configs (tiled) with problems for every epilogue after the reduce kernel; K is not a
// multiple of S x BK, so some splits are a tile shorter and the last tile is partial. The SIMT
// (fp32) and mma (bf16) mainloops get every schedule, tf32 and fp16 one each.
struct SplitJob {
  const char* sweep_line;  // the problem, in sweep-file syntax (check/sweep.hpp)
  const char* config;
};
constexpr SplitJob kSplitJobs[] = {
    // 128-row tiles, M = 128: single-pass train, cumulative momentum (fj_bump after the reduce).
    {"128x512x1000 fp32 train momentum=none", "tiled.128x128x16.w4x2.s3.g8.k4"},
    {"128x512x1000 bf16 train momentum=none", "tiled.128x128x64.w2x2.s3.g8.k2"},
    // 64-row tiles: eval, and two-pass train with 19 row tiles (fj_finalize, fj_apply).
    {"300x72x999 fp32 eval", "tiled.64x64x16.w2x1.s3.g8.k3"},
    {"300x72x999 bf16 eval", "tiled.64x64x64.w2x2.s3.g8.k3"},
    {"300x72x999 tf32 eval", "tiled.64x64x32.w2x2.s3.g8.k5"},
    {"1200x64x1000 fp32 train", "tiled.64x64x16.w2x1.s3.g8.k3"},
    {"1200x64x1000 bf16 train", "tiled.64x64x64.w2x2.s3.g8.k3"},
    {"1200x64x1000 fp16 train", "tiled.64x64x64.w2x2.s3.g8.k3"},
};

}  // namespace

TEST_CASE("every variant compiles for every supported architecture") {
  const std::vector<std::string> archs = fusejit::test::supported_archs();
  for (const char* must : {"sm_80", "sm_86", "sm_89", "sm_90a"})
    REQUIRE(std::find(archs.begin(), archs.end(), std::string(must)) != archs.end());
  std::vector<fusejit::test::CompileJob> jobs;
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
    for (const SplitJob& j : kSplitJobs) {
      const Problem p = parse_sweep_line(j.sweep_line).problem;
      const KernelConfig c = KernelConfig::parse(j.config);
      CAPTURE(arch);
      CAPTURE(j.sweep_line);
      CAPTURE(j.config);
      REQUIRE(c.split_k > 1);
      CHECK(c.why_invalid(p, dev) == "");
      jobs.push_back({arch, generate(p, c)});
    }
  }
  MESSAGE(jobs.size() << " kernel sets over " << archs.size() << " architectures");
  const std::string failures = fusejit::test::compile_jobs(jobs, fusejit::test::Coverage::sampled);
  CHECK_MESSAGE(failures.empty(), failures);
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
