// 3xTF32 (DType::tf32x3) without a GPU: its name, storage and tolerance, the configs offered for
// it, and that its kernels really multiply three times per k-step: nvcc compiles the generated
// sources of tf32 and tf32x3 for the same config to sm_90a PTX, and tf32x3's must hold exactly
// three times tf32's tensor-core instructions (wgmma for warpspec, mma.sync for tiled). Needs
// nvcc for that part; without it the test says so and checks the rest.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fusejit/verify/verification.hpp"
#include "test_nvrtc_jobs.hpp"
#include "test_process.hpp"
#include "test_tempdir.hpp"

using namespace fusejit;
namespace fs = std::filesystem;

namespace {

Problem problem(DType d, Mode m, std::int64_t M, std::int64_t N, std::int64_t K) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

// Occurrences of `what` in the sm_90a PTX nvcc makes of the generated source of (p, c).
std::size_t count_in_ptx(const std::string& nvcc, const fs::path& dir, const Problem& p,
                         const KernelConfig& c, const std::string& what) {
  const KernelSource src = generate(p, c);
  const fs::path here = dir / fmt::format("{}_{}", name(p.dtype), c.key());
  fs::create_directories(here / "include");
  for (const auto& [header, text] : src.headers) {
    const fs::path h = here / "include" / header;
    fs::create_directories(h.parent_path());
    std::ofstream(h) << text;
  }
  std::ofstream(here / "k.cu") << src.text;
  const auto r = fusejit::test::run_command(
      "'" + nvcc + "' -std=c++17 -arch=sm_90a --ptx -DNDEBUG -I '" + (here / "include").string() +
      "' '" + (here / "k.cu").string() + "' -o '" + (here / "k.ptx").string() + "' 2>&1");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  std::ifstream in(here / "k.ptx");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string ptx = ss.str();
  std::size_t n = 0;
  for (std::size_t at = ptx.find(what); at != std::string::npos; at = ptx.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("tf32x3: a dtype of its own, stored as fp32, held to strict fp32's tolerance") {
  CHECK(parse_dtype("tf32x3") == DType::tf32x3);
  CHECK(name(DType::tf32x3) == "tf32x3");
  CHECK(storage_type(DType::tf32x3) == DType::fp32);
  CHECK(storage_bytes(DType::tf32x3) == 4);
  CHECK(sweep_threshold(DType::tf32x3) == sweep_threshold(DType::fp32));
  // The key names it, so no tf32 or fp32 entry can serve it.
  CHECK(problem(DType::tf32x3, Mode::train, 8, 8, 8).key() !=
        problem(DType::tf32, Mode::train, 8, 8, 8).key());
  CHECK_THROWS_AS(parse_dtype("tf32x2"), InvalidArgument);
}

TEST_CASE(
    "tf32x3: warpspec with W's small parts in every stage on Hopper, tiled tensor cores "
    "elsewhere") {
  const Device h100 = Device::for_arch("sm_90a");
  const Device a100 = Device::for_arch("sm_80");
  const Problem big = problem(DType::tf32x3, Mode::eval, 1024, 8192, 8192);
  const KernelConfig ws = default_config(big, h100);
  CHECK(ws.variant == Variant::warpspec);
  CHECK(default_config(big, a100).variant == Variant::tiled);
  // The stage ring holds W's small parts too (x is split in registers): a second W tile per
  // stage over tf32's bytes for the same config, and a third mbarrier per stage (24 bytes),
  // which the layout's 1 KiB rounding may or may not absorb.
  const KernelConfig c = KernelConfig::parse("warpspec.128x128x32.c2.s3.g8.cl1.p1");
  const int ring = 3 * 128 * 32 * 4;
  const int extra =
      c.smem_bytes(big) - c.smem_bytes(problem(DType::tf32, Mode::eval, 1024, 8192, 8192));
  CHECK(extra >= ring);
  CHECK(extra <= ring + 1024);
  // Configs whose consumers would not hold the sums, a partial sum and two fragment sets are
  // refused by name (more rows per consumer, a wider tile, a deeper slice).
  for (const char* key :
       {"warpspec.128x128x32.c1.s3.g8.cl1.p1", "warpspec.128x128x32.c2.s3.g8.cl1.p1.pp",
        "warpspec.128x256x32.c2.s2.g8.cl1.p1", "warpspec.128x128x64.c2.s2.g8.cl1.p1"}) {
    CAPTURE(std::string(key));
    const std::string why = KernelConfig::parse(key).why_invalid(big, h100);
    CHECK(why.find("tf32x3") != std::string::npos);
  }
  for (const auto& k : candidate_configs(big, h100)) {
    CAPTURE(k.key());
    CHECK(k.smem_bytes(big) <= 232448);
  }
}

TEST_CASE("tf32x3 kernels compile for every supported architecture") {
  // The tiled pick of a two-pass train problem with tails everywhere on every architecture
  // (the same source for all but sm_90a), and on sm_90a the warpspec picks of train and eval.
  std::vector<fusejit::test::CompileJob> jobs;
  const Problem train = problem(DType::tf32x3, Mode::train, 1000, 200, 73);
  const Problem eval = problem(DType::tf32x3, Mode::eval, 100, 7, 5);
  for (const std::string& arch : fusejit::test::supported_archs()) {
    const Device dev = Device::for_arch(arch);
    jobs.push_back({arch, generate(train, default_config(train, dev, Variant::tiled))});
    if (dev.cc() == 90)
      for (const Problem& p : {train, eval})
        jobs.push_back({arch, generate(p, default_config(p, dev, Variant::warpspec))});
  }
  MESSAGE(jobs.size() << " kernel sets");
  const std::string failures = fusejit::test::compile_jobs(jobs);
  CHECK_MESSAGE(failures.empty(), failures);
}

TEST_CASE("tf32x3 kernels issue three tensor-core products where tf32 issues one (PTX)") {
  const std::string nvcc = fusejit::test::find_nvcc();
  if (nvcc.empty()) {
    MESSAGE("nvcc not found on PATH or in /usr/local/cuda/bin: nothing to check");
    return;
  }
  const fusejit::test::TempDir dir("fj-tf32x3-ptx");
  struct Case {
    const char* key;
    const char* instruction;
    std::int64_t K;
  };
  // Warpspec with K = 32, one slice: its 3xTF32 mainloop takes two slices per loop iteration
  // and peels the last one or two (at K = 1024 the PTX holds four slices' products), tf32's
  // does not.
  for (const Case k : {Case{"warpspec.128x128x32.c2.s3.g8.cl1.p1", "wgmma.mma_async", 32},
                       Case{"tiled.64x64x32.w2x2.s3.g8", "mma.sync.aligned.m16n8k8", 1024}}) {
    CAPTURE(std::string(k.key));
    const KernelConfig c = KernelConfig::parse(k.key);
    const std::size_t one = count_in_ptx(
        nvcc, dir.path(), problem(DType::tf32, Mode::eval, 1000, 256, k.K), c, k.instruction);
    const std::size_t three = count_in_ptx(
        nvcc, dir.path(), problem(DType::tf32x3, Mode::eval, 1000, 256, k.K), c, k.instruction);
    MESSAGE(fmt::format("{}: {} x {} for tf32, {} for tf32x3", k.key, k.instruction, one, three));
    CHECK(one > 0);
    CHECK(three == 3 * one);
  }
}
