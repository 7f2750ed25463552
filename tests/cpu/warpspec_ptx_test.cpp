// The warpspec kernel really is a Hopper kernel: nvcc compiles a translation unit shaped like
// codegen's output (a Spec prelude, templates/kernels/warpspec_gemm.cuh, the extern "C" entry
// point) to sm_90a PTX, and the PTX must hold the instructions the design rests on: wgmma, TMA
// bulk tensor copies completing on mbarriers, setmaxnreg, for a cluster Spec the multicast
// form, and for a TMA_STORE Spec stmatrix (16-bit y) or 8-byte shared stores (fp32 y) and
// bulk tensor stores out of shared memory. Needs
// nvcc, not a GPU; without nvcc the test says so and passes vacuously.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "test_process.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

using fusejit::test::find_nvcc;
using Run = fusejit::test::CommandResult;
Run run(const std::string& cmd) {
  return fusejit::test::run_command(cmd);
}

// A Spec prelude like codegen's, with the fields WarpspecGemm reads.
std::string spec(const std::string& name, const std::string& type, int math, bool train,
                 bool single_pass, int bn, int consumers, int cluster, bool persistent,
                 bool fragment, bool tma_store = false) {
  std::ostringstream s;
  s << "struct " << name << " {\n"
    << "  using T = " << type << ";\n  using P = float;\n"
    << "  static constexpr int MATH = " << math << ";\n"
    << "  static constexpr int M = 1000, N = 1000, K = 1000, LDX = 1000, LDW = 1000, LDY = 1000;\n"
    << "  static constexpr int BM = " << 64 * consumers << ", BN = " << bn
    << ", BK = " << (type == "float" ? 32 : 64) << ", STAGES = 4;\n"
    << "  static constexpr int CONSUMERS = " << consumers << ", THREADS = " << 128 * (consumers + 1)
    << ", CLUSTER_M = " << cluster << ";\n"
    << "  static constexpr bool PERSISTENT = " << (persistent ? "true" : "false") << ";\n"
    << "  static constexpr int GROUP_M = 8, VEC_BYTES = 16;\n"
    << "  static constexpr bool TRAIN = " << (train ? "true" : "false")
    << ", SINGLE_PASS = " << (single_pass ? "true" : "false") << ";\n"
    << "  static constexpr bool HAS_BIAS = true, HAS_SCALE = true, HAS_AFFINE = true;\n"
    << "  static constexpr bool CUMULATIVE = false;\n"
    << "  static constexpr bool FRAGMENT_EPILOGUE = " << (fragment ? "true" : "false") << ";\n"
    << "  static constexpr bool TMA_STORE = " << (tma_store ? "true" : "false") << ";\n"
    << "};\n";
  return s.str();
}

std::string entry(const std::string& name, const std::string& spec_name) {
  return "extern \"C\" __global__ void __launch_bounds__(" + spec_name + "::THREADS, 1)\n" + name +
         "(const __grid_constant__ fj::Params p, const __grid_constant__ fj::TmaDescriptor tx,\n"
         " const __grid_constant__ fj::TmaDescriptor tw,\n"
         " const __grid_constant__ fj::TmaDescriptor ty) { fj::WarpspecGemm<" +
         spec_name + ">::run(p, tx, tw, &ty); }\n";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// One entry's PTX: from its ".entry NAME(" to the next ".entry" (the device functions are
// inlined into it).
std::string entry_text(const std::string& text, const std::string& name) {
  const size_t begin = text.find(".entry " + name + "(");
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find(".entry ", begin + 1) - begin);
}

}  // namespace

TEST_CASE("the warpspec kernel compiles to wgmma, TMA, mbarrier and setmaxnreg PTX on sm_90a") {
  const char* src_env = std::getenv("FUSEJIT_SOURCE_DIR");
  REQUIRE_MESSAGE(src_env, "FUSEJIT_SOURCE_DIR is set by tests/CMakeLists.txt");
  const fs::path src(src_env);
  REQUIRE(fs::is_regular_file(src / "templates" / "kernels" / "warpspec_gemm.cuh"));
  const std::string nvcc = find_nvcc();
  if (nvcc.empty()) {
    MESSAGE("nvcc not found on PATH or in /usr/local/cuda/bin: nothing to check");
    return;
  }
  const fs::path dir =
      fs::temp_directory_path() / ("fusejit-warpspec-ptx-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path tu = dir / "warpspec.cu";
  const fs::path ptx = dir / "warpspec.ptx";
  {
    std::ofstream f(tu);
    f << "#include \"common/math_kind.cuh\"\n#include \"common/types.cuh\"\n"
      << spec("SpecBf16", "fj::bf16_t", 3, false, false, 256, 2, 1, true, true)
      << spec("SpecFp16Train", "fj::half_t", 2, true, false, 128, 2, 1, false, true)
      << spec("SpecTf32Tile", "float", 1, true, false, 128, 1, 1, false, false)
      << spec("SpecCluster", "fj::bf16_t", 3, true, false, 256, 2, 2, true, true)
      << spec("SpecTmaStore", "fj::bf16_t", 3, false, false, 256, 2, 1, true, true, true)
      << spec("SpecTf32TmaStore", "float", 1, false, false, 128, 2, 1, true, true, true)
      << "#include \"kernels/warpspec_gemm.cuh\"\n"
      << entry("fj_gemm_bf16", "SpecBf16") << entry("fj_gemm_fp16", "SpecFp16Train")
      << entry("fj_gemm_tf32", "SpecTf32Tile") << entry("fj_gemm_cluster", "SpecCluster")
      << entry("fj_gemm_tma_store", "SpecTmaStore")
      << entry("fj_gemm_tf32_tma_store", "SpecTf32TmaStore");
  }
  const std::string cmd = "'" + nvcc + "' -std=c++17 -ptx -Werror all-warnings" +
                          " -gencode arch=compute_90a,code=compute_90a -I'" +
                          (src / "templates").string() + "' '" + tu.string() + "' -o '" +
                          ptx.string() + "'";
  const Run r = run(cmd);
  INFO("command: " << cmd);
  INFO("output:\n" << r.out);
  REQUIRE(r.code == 0);
  std::ifstream in(ptx);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();

  // Every kernel: tensor-core MMAs of each input type, fed by TMA into an mbarrier ring.
  CHECK(count(text, ".entry fj_gemm_") == 6);
  CHECK(count(text, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") > 0);
  CHECK(count(text, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16") > 0);
  CHECK(count(text, "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32") > 0);
  CHECK(count(text, "wgmma.fence.sync.aligned") >= 4);
  CHECK(count(text, "wgmma.commit_group.sync.aligned") >= 4);
  CHECK(count(text, "wgmma.wait_group.sync.aligned") >= 4);
  CHECK(count(text,
              "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes") >= 4);
  CHECK(count(text, "mbarrier.arrive.expect_tx") >= 4);
  CHECK(count(text, "mbarrier.try_wait.parity") >= 4);
  // Register reallocation between producer and consumer warpgroups (two-consumer kernels).
  CHECK(count(text, "setmaxnreg.dec.sync.aligned.u32 40") >= 3);
  CHECK(count(text, "setmaxnreg.inc.sync.aligned.u32 232") >= 3);
  // The cluster kernel multicasts W and releases stages in both CTAs.
  CHECK(count(text, ".multicast::cluster") >= 1);
  CHECK(count(text, "mapa.shared::cluster") >= 1);
  CHECK(count(text, "barrier.cluster.arrive") >= 1);
  // The TMA-store kernel (only it: the others store from threads) rounds y into shared memory
  // with stmatrix, fences the async proxy, hands each box to the copy engine, waits for a
  // box's previous store to have read it before refilling it, and for all before exiting.
  CHECK(count(text, "stmatrix.sync.aligned.m8n8.x4.shared.b16") >= 1);
  CHECK(count(text, "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group") >= 1);
  CHECK(count(text, "fence.proxy.async.shared::cta") >= 1);
  CHECK(count(text, "cp.async.bulk.wait_group.read 1") >= 1);
  CHECK(count(text, "cp.async.bulk.wait_group 0") >= 1);
  // fp32 y (tf32) fills the same boxes with each lane's 8-byte pair (stmatrix moves 16-bit
  // values only): 2 x 2 stores per lane per box, 8 boxes of 16 columns per 64-row atom at
  // BN = 128, unrolled (64 in all: y's stores and the saved path's copy of them).
  const std::string tf32_ts = entry_text(text, "fj_gemm_tf32_tma_store");
  REQUIRE(!tf32_ts.empty());
  CHECK(count(tf32_ts, "stmatrix") == 0);
  CHECK(count(tf32_ts, "st.shared.v2.b32") >= 4 * 128 / 16);
  CHECK(count(tf32_ts, "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group") >= 1);
  CHECK(count(tf32_ts, "fence.proxy.async.shared::cta") >= 1);

  std::error_code ec;
  fs::remove_all(dir, ec);
}
