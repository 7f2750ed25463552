#include "fusejit/codegen/codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "fusejit/codegen/embedded_templates.hpp"

namespace fusejit {

namespace {

const char* math_name(DType d) {
  switch (d) {
    case DType::fp32:
      return "fj::kMathSimtFp32";
    case DType::tf32:
      return "fj::kMathTf32";
    case DType::fp16:
      return "fj::kMathFp16";
    case DType::bf16:
      return "fj::kMathBf16";
  }
  return "?";
}

const char* b(bool v) {
  return v ? "true" : "false";
}

}  // namespace

KernelSchedule schedule(const Problem& p, const KernelConfig& c) {
  KernelSchedule s;
  s.kernels.push_back("fj_gemm");
  s.split_k = c.variant == Variant::tiled && c.split_k > 1;
  if (s.split_k) s.kernels.push_back("fj_splitk_reduce");
  if (p.mode != Mode::train) return s;
  s.single_pass = p.M <= c.bm;
  // With few row tiles, each fj_apply block re-merging its columns' partials costs less than a
  // separate finalize launch (which runs alone, between the GEMM and the apply pass).
  constexpr std::int64_t kFoldMaxRowTiles = 8;
  s.fold_finalize = !s.single_pass && (p.M + c.bm - 1) / c.bm <= kFoldMaxRowTiles;
  if (!s.single_pass && !s.fold_finalize) s.kernels.push_back("fj_finalize");
  if (!s.single_pass) s.kernels.push_back("fj_apply");
  // momentum=None: every reader of num_batches_tracked must finish before it is bumped.
  if ((s.single_pass || s.fold_finalize) && !p.momentum) s.kernels.push_back("fj_bump");
  return s;
}

const std::vector<std::pair<std::string, std::string>>& template_headers() {
  static const auto headers = [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& f : embedded_templates()) out.emplace_back(f.name, f.text);
    return out;
  }();
  return headers;
}

KernelSource generate(const Problem& p, const KernelConfig& c) {
  const KernelSchedule sched = schedule(p, c);
  const bool ws = c.variant == Variant::warpspec;
  KernelSource src;
  src.name =
      fmt::format("fj.{}.{}.{}.{}", name(p.dtype), name(p.mode), format_shape(p.shape()), c.key());
  std::string& t = src.text;
  t += fmt::format("// fusejit generated kernel: {}\n// problem: {}\n", src.name, p.key());
  t += "#include \"common/types.cuh\"\n#include \"common/math_kind.cuh\"\n";
  t += "struct Spec {\n";
  t += fmt::format("  using T = {};\n  using P = {};\n", template_type_name(p.dtype),
                   template_type_name(p.param_dtype));
  t += fmt::format("  static constexpr int MATH = {};\n", math_name(p.dtype));
  t += fmt::format("  static constexpr int M = {}, N = {}, K = {};\n", p.M, p.N, p.K);
  t += fmt::format("  static constexpr int LDX = {}, LDW = {}, LDY = {};\n", p.lda_x(), p.lda_w(),
                   p.lda_y());
  t += fmt::format("  static constexpr int BM = {}, BN = {}, BK = {}, STAGES = {}, GROUP_M = {};\n",
                   c.bm, c.bn, c.bk, c.stages, c.group_m);
  if (ws)
    t += fmt::format(
        "  static constexpr int CONSUMERS = {}, CLUSTER_M = {};\n"
        "  static constexpr bool PERSISTENT = {}, PINGPONG = {}, TMA_STORE = {};\n"
        // The host's count: WarpspecGemm static_asserts that its SharedStorage matches it.
        "  static constexpr int SMEM_BYTES = {};\n",
        c.warps_m, c.cluster_m, b(c.persistent), b(c.pingpong), b(c.tma_store), c.smem_bytes(p));
  else
    t += fmt::format("  static constexpr int WARPS_M = {}, WARPS_N = {}, SPLIT_K = {};\n",
                     c.warps_m, c.warps_n, c.split_k);
  t += fmt::format("  static constexpr int THREADS = {};\n", c.threads());
  t += fmt::format("  static constexpr int VEC_BYTES = {};\n",
                   std::min(p.effective_alignment(), 16));
  t += fmt::format(
      "  static constexpr bool TRAIN = {}, SINGLE_PASS = {}, FOLD_FINALIZE = {}, CUMULATIVE = {};\n"
      "  static constexpr bool HAS_BIAS = {}, HAS_SCALE = {}, HAS_AFFINE = {};\n",
      b(p.mode == Mode::train), b(sched.single_pass), b(sched.fold_finalize), b(!p.momentum),
      b(p.has_bias), b(p.has_scale), b(p.has_affine));
  t += "};\n";
  const char* gemm = ws ? "fj::WarpspecGemm<Spec>" : "fj::TiledGemm<Spec>";
  t += ws ? "#include \"kernels/warpspec_gemm.cuh\"\n" : "#include \"kernels/tiled_gemm.cuh\"\n";
  if (sched.split_k) t += "#include \"kernels/splitk_reduce.cuh\"\n";
  // The BatchNorm passes (fj_finalize, fj_apply, fj_bump) live in bn_apply.cuh.
  const bool bn_passes = std::any_of(sched.kernels.begin(), sched.kernels.end(), [](const auto& k) {
    return k == "fj_finalize" || k == "fj_apply" || k == "fj_bump";
  });
  if (bn_passes) t += "#include \"kernels/bn_apply.cuh\"\n";
  // The host reads the exact dynamic shared memory size and the launch shapes of the BatchNorm
  // passes from the module: the templates are their one source of truth.
  t += fmt::format("extern \"C\" __device__ const int fj_smem_bytes = {}::kSmemBytes;\n", gemm);
  for (const auto& k : sched.kernels) {
    if (k == "fj_splitk_reduce")
      t += "extern \"C\" __device__ const int fj_splitk_reduce_smem_bytes =\n"
           "    fj::SplitKReduce<Spec>::kSmemBytes;\n"
           "extern \"C\" __device__ const int fj_splitk_reduce_launch[3] = {\n"
           "    fj::SplitKReduce<Spec>::kGridX, 1, fj::SplitKReduce<Spec>::kThreads};\n";
    if (k == "fj_finalize")
      t += "extern \"C\" __device__ const int fj_finalize_launch[3] = {\n"
           "    fj::FinalizeShape<Spec>::kGridX, 1, fj::FinalizeShape<Spec>::kThreads};\n";
    if (k == "fj_apply")
      t += "extern \"C\" __device__ const int fj_apply_launch[3] = {\n"
           "    fj::ApplyShape<Spec>::kBlocks, 1, fj::kApplyThreads};\n";
  }
  for (const auto& k : sched.kernels) {
    if (k == "fj_gemm" && ws) {
      t += fmt::format(
          "extern \"C\" __global__ void __launch_bounds__(Spec::THREADS, 1)\n"
          "fj_gemm(const __grid_constant__ fj::Params p, const __grid_constant__ fj::TmaDescriptor "
          "tx,\n"
          "        const __grid_constant__ fj::TmaDescriptor tw,\n"
          "        const __grid_constant__ fj::TmaDescriptor ty) {{ {}::run(p, tx, tw, &ty); }}\n",
          gemm);
    } else if (k == "fj_gemm") {
      t += fmt::format(
          "extern \"C\" __global__ void __launch_bounds__(Spec::THREADS)\n"
          "fj_gemm(const fj::Params p) {{ {}::run(p); }}\n",
          gemm);
    } else if (k == "fj_splitk_reduce") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::SplitKReduce<Spec>::kThreads)\n"
           "fj_splitk_reduce(const fj::Params p) { fj::SplitKReduce<Spec>::run(p); }\n";
    } else if (k == "fj_finalize") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::FinalizeShape<Spec>::kThreads)\n"
           "fj_finalize(const fj::Params p) { fj::bn_finalize<Spec>(p); }\n";
    } else if (k == "fj_apply") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kApplyThreads)\n"
           "fj_apply(const fj::Params p) { fj::bn_apply<Spec>(p); }\n";
    } else if (k == "fj_bump") {
      t += "extern \"C\" __global__ void fj_bump(const fj::Params p) { fj::bump_batches(p); }\n";
    }
  }
  src.kernels = sched.kernels;
  src.options = {"--std=c++17", "-DNDEBUG", "--extra-device-vectorization"};
  src.headers = template_headers();
  return src;
}

}  // namespace fusejit
