// ptxas spills nothing in the kernels a Plan and a BackwardPlan load without a tuning entry
// (the heuristic's choices) for the seed layers on Hopper, except where listed below with the
// reason; and the compiler's report of spills (compile/ptxas_report.hpp) is real: a kernel held
// to too few registers is seen spilling. No GPU needed.
//
// Why: a spill changes no result, so no correctness test sees one, and it costs the kernel
// local-memory traffic in its hottest code. Two were found this way: the resident train GEMM's
// missed-round loop (388 bytes, tf32 128x256; rewritten) and the backward's dX GEMM on 64x64 warp
// tiles with 4-byte copies (128-192 bytes; at 777x1536x2050 its backward ran 0.120 ms against
// 0.093 with the tile the heuristic then ranked first, H200). The tiled tf32 dW of rows aligned
// to 4 bytes only spilled 12-20 bytes until such layers moved to the warpspec GEMMs.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/compile/ptxas_report.hpp"
#include "fusejit/device.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "test_nvrtc_jobs.hpp"
#include "test_stride.hpp"
#include "tools/sweep.hpp"

using namespace fusejit;

namespace {

// Spills the heuristic's choices are known to have on sm_90a with NVRTC 13.0: (kernel set name
// prefix, function). Each must still occur (test_stride() == 1), so that the list stays true.
struct KnownSpill {
  const char* set_prefix;
  const char* function;
  const char* why;
};
constexpr KnownSpill kKnown[] = {
    {"fj.tf32x3.eval.", "fj_gemm",
     "3xTF32's 128x128 mainloop holds the kernel at its 168-register bound: 8 bytes, in the "
     "eval epilogue"},
    {"fj.tf32x3.train.", "fj_gemm_affine", "the same, in recompute's affine pass"},
};

const KnownSpill* known_spill(std::string_view set, std::string_view function) {
  for (const KnownSpill& k : kKnown)
    if (set.starts_with(k.set_prefix) && function == k.function) return &k;
  return nullptr;
}

}  // namespace

TEST_CASE(
    "ptxas's report: a kernel held to too few registers is seen spilling, one that fits is not; "
    "the report's lines are not logged as the compiler's words, its warnings are") {
  KernelSource src;
  src.name = "spill_probe";
  src.kernels = {"fj_spill_probe"};
  // 48 values live at once: far more than 24 registers hold.
  src.text = R"(
extern "C" __global__ void fj_spill_probe(float* p) {
  float v[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) v[i] = p[i * blockDim.x + threadIdx.x];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 48; ++i) s += v[i] * v[(i * 7 + 5) % 48];
  p[threadIdx.x] = s;
}
)";
  for (const bool starved : {false, true}) {
    CAPTURE(starved);
    KernelSource s = src;
    if (starved) s.options.push_back("--maxrregcount=24");
    const CompiledKernel k = compile(s, "sm_90a");
    REQUIRE(k.functions.size() == 1);
    const FunctionResources& f = k.functions.front();
    CHECK(f.name == "fj_spill_probe");
    CHECK(f.entry);
    CHECK(f.registers > 0);
    CHECK(f.spills() == starved);
    CHECK(describe_spills(k.functions).empty() != starved);
    if (starved) CHECK(f.registers <= 24);
  }
  // The report's lines are not what the compiler "said"; ptxas's warnings in "info" form are.
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'fj_gemm' for 'sm_90a'\n"
      "ptxas info    : Function properties for fj_gemm\n"
      "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
      "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized\n"
      "ptxas info    : Used 168 registers, used 16 barriers, 8 bytes cumulative stack size\n"
      "ptxas info    : Compile time = 1.5 ms";
  const PtxasReport report = read_ptxas_report(log);
  CHECK(report.rest ==
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized");
  const std::vector<FunctionResources>& parsed = report.functions;
  REQUIRE(parsed.size() == 1);
  CHECK(parsed[0].registers == 168);
  CHECK(parsed[0].spill_store_bytes == 12);
  CHECK(parsed[0].spill_load_bytes == 8);
  CHECK(describe_spills(parsed) == "fj_gemm 12 B stored / 8 B loaded");
  // An arch newer than NVRTC knows gets PTX, which the driver assembles later: no report.
  const CompiledKernel ptx =
      compile(src, fmt::format("sm_{}", nvrtc_supported_archs().back() + 10));
  CHECK(ptx.is_ptx);
  CHECK(ptx.functions.empty());
}

TEST_CASE("ptxas spills nothing in the heuristic's kernels for the seed layers on sm_90a") {
  const Device dev = Device::for_arch("sm_90a");
  std::vector<test::CompileJob> jobs;
  std::set<std::string> names;
  auto add = [&](KernelSource src) {
    if (names.insert(src.name).second) jobs.push_back({"sm_90a", std::move(src), {}});
  };
  const char* shapes[] = {"1024x8192x8192", "16384x4096x4096", "4096x4096x4096", "8192x12288x3072",
                          "2048x2048x512",  "65536x256x64",    "128x512x1024",   "16384x1024x256",
                          "2048x4096x4096", "777x1536x2050",   "1000x1001x1003", "4097x4095x129"};
  for (const char* shape : shapes)
    for (const char* dtype : {"bf16", "fp16", "tf32", "tf32x3", "fp32"})
      for (const char* mode : {"train", "eval"}) {
        const Problem p = parse_sweep_line(fmt::format("{} {} {}", shape, dtype, mode)).problem;
        for (KernelSource& src : plan_sources(p, choose_from_table(TuningTable{}, p, dev)))
          add(std::move(src));
        if (backward_refusal(p).empty()) add(generate_backward(p, default_backward_config(p, dev)));
      }
  std::mutex mu;
  std::set<const KnownSpill*> seen;
  std::string unlisted;  // spills not in kKnown
  const std::string failures = test::compile_jobs(
      jobs, test::Coverage::sampled,
      [&](const test::CompileJob& j, const CompiledKernel& k) -> std::string {
        if (k.functions.empty()) return j.src.name + ": no ptxas report\n";
        const std::lock_guard lock(mu);
        for (const FunctionResources& f : k.functions) {
          if (!f.spills()) continue;
          if (const KnownSpill* known = known_spill(j.src.name, f.name))
            seen.insert(known);
          else
            unlisted += fmt::format("{}: {} spills {} B stored / {} B loaded\n", j.src.name, f.name,
                                    f.spill_store_bytes, f.spill_load_bytes);
        }
        return {};
      });
  CHECK_MESSAGE(failures.empty(), failures);  // compile errors, a missing report
  // Register allocation is ptxas's: another NVRTC may spill elsewhere. The list is NVRTC 13.0's;
  // with another the spills are reported, not failed.
  if (nvrtc_version() != "13.0") {
    if (!unlisted.empty()) MESSAGE("NVRTC ", nvrtc_version(), " (the list is 13.0's):\n", unlisted);
    return;
  }
  CHECK_MESSAGE(unlisted.empty(), unlisted);
  if (test::test_stride() == 1)
    for (const KnownSpill& k : kKnown)
      CHECK_MESSAGE(seen.count(&k) == 1,
                    fmt::format("listed as spilling but did not: {} {}", k.set_prefix, k.function));
}
