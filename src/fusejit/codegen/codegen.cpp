#include "fusejit/codegen/codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "fusejit/codegen/embedded_templates.hpp"

namespace fusejit {

const char* template_math_name(DType d) {
  switch (d) {
    case DType::fp32:
      return "fj::kMathSimtFp32";
    case DType::tf32:
      return "fj::kMathTf32";
    case DType::fp16:
      return "fj::kMathFp16";
    case DType::bf16:
      return "fj::kMathBf16";
    case DType::tf32x3:
      return "fj::kMathTf32x3";
  }
  return "?";
}

namespace {

const char* b(bool v) {
  return v ? "true" : "false";
}

}  // namespace

KernelSchedule schedule_flags(const Problem& p, const KernelConfig& c, std::int64_t rows,
                              unsigned resident_tiles) {
  KernelSchedule s;
  s.split_k = c.variant == Variant::tiled && c.split_k > 1;
  s.pad = c.pad_operands;
  if (p.mode != Mode::train) return s;
  s.single_pass = single_pass_class(p, c);
  if (p.stat_ranks > 0) {
    // The merge happens in fj_rank_finalize; a rank with no rows has no GEMM and no y to
    // apply to, so fj_bump counts its batch.
    s.exchange = true;
    s.gemm = rows > 0;
    s.pad = s.pad && s.gemm;
    s.apply = rows > 0;
    s.bump = rows == 0;
    return s;
  }
  s.fold_finalize = !s.single_pass && !c.recompute && (rows + c.bm - 1) / c.bm <= kFoldMaxRowTiles;
  s.finalize = !s.single_pass && !s.fold_finalize;
  s.apply = !s.single_pass && !c.recompute;
  // The affine GEMM runs after fj_finalize, the last reader of the counter (a dependent launch
  // that waits for the finalize before it bumps), so it bumps it itself.
  s.affine = !s.single_pass && c.recompute;
  s.input_stats = s.affine && c.input_stats;
  if (s.affine && resident_grid(c, p.N, rows, resident_tiles) > 0) {
    s.grid_sync = true;
    s.finalize = s.affine = false;
  }
  // momentum=None: every reader of num_batches_tracked must finish before it is bumped, which
  // the GEMM's (single-pass) or fj_apply_fold's own increment cannot promise.
  s.bump = (s.single_pass || s.fold_finalize) && !p.momentum;
  if (c.overlap_apply && !s.single_pass) {
    // The GEMM merges, applies and bumps (its last panel's merge is the counter's last reader).
    s.overlap = true;
    s.fold_finalize = s.finalize = s.apply = s.bump = false;
  }
  return s;
}

KernelSchedule schedule(const Problem& p, const KernelConfig& c, std::int64_t rows,
                        unsigned resident_tiles) {
  KernelSchedule s = schedule_flags(p, c, rows, resident_tiles);
  if (s.pad) s.kernels.push_back("fj_pad_operands");
  if (s.input_stats) s.kernels.push_back("fj_input_stats");
  if (s.gemm) s.kernels.push_back("fj_gemm");
  if (s.gemm && s.split_k) s.kernels.push_back("fj_splitk_reduce");
  // The all-gather between them is NCCL's kernel, not one of the set's.
  if (s.exchange) s.kernels.insert(s.kernels.end(), {"fj_rank_stats", "fj_rank_finalize"});
  if (s.finalize) s.kernels.push_back("fj_finalize");
  if (s.affine) s.kernels.push_back("fj_gemm_affine");
  if (s.apply) s.kernels.push_back(s.fold_finalize ? "fj_apply_fold" : "fj_apply");
  if (s.bump) s.kernels.push_back("fj_bump");
  return s;
}

std::vector<std::string> kernel_set(const Problem& p, const KernelConfig& c) {
  const bool synced = p.stat_ranks > 0;
  // A recompute set runs the same kernels whatever the rows (it never folds the finalize).
  if (!synced && (c.exact_m || c.recompute || p.mode != Mode::train || single_pass_class(p, c))) {
    std::vector<std::string> k = schedule(p, c).kernels;
    // overlap_apply keeps what a run whose cooperative launch the driver refuses falls back to
    // (launch.cpp): fj_finalize and the unfolded fj_apply, which bumps the counter itself.
    if (schedule_flags(p, c, p.M).overlap) k.insert(k.end(), {"fj_finalize", "fj_apply"});
    return k;
  }
  // Two-pass over any rows: the GEMM (and split-K's reduce) as schedule_flags decides, then every
  // pass a run may pick. Unsynchronized: both apply paths, the finalize and (cumulative) the
  // bump; synchronized: the exchange's two kernels, the apply and the bump of an empty rank.
  std::vector<std::string> k;
  if (c.pad_operands) k.push_back("fj_pad_operands");
  k.push_back("fj_gemm");
  if (schedule_flags(p, c, p.M).split_k) k.push_back("fj_splitk_reduce");
  if (synced) {
    k.insert(k.end(), {"fj_rank_stats", "fj_rank_finalize", "fj_apply", "fj_bump"});
    return k;
  }
  k.insert(k.end(), {"fj_finalize", "fj_apply"});
  if (c.overlap_apply) return k;  // its fallback never folds nor bumps apart
  k.push_back("fj_apply_fold");
  if (!p.momentum) k.push_back("fj_bump");
  return k;
}

std::string kernel_set_problem_key(const Problem& p, const KernelConfig& c) {
  const std::string k = p.key();
  return c.exact_m ? k : "M" + k.substr(k.find('x'));
}

const std::vector<std::pair<std::string, std::string>>& template_headers() {
  static const auto headers = [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& f : embedded_templates()) out.emplace_back(f.name, f.text);
    return out;
  }();
  return headers;
}

std::vector<std::string> kernel_compile_options() {
  // Not --split-compile=0 yet (NVRTC optimizes a program's functions on all cores: plan time
  // 3.56 -> 1.95 s for 4096^3 bf16's forward and backward sets on 16 cores, kernel times the same;
  // docs/performance.md, "NVRTC's --split-compile"): its kernels are other code, and the GPU tests
  // have not run on them.
  return {"--std=c++17", "-DNDEBUG", "--extra-device-vectorization"};
}

KernelSource generate(const Problem& p, const KernelConfig& c) {
  const std::vector<std::string> kernels = kernel_set(p, c);
  const bool single_pass = single_pass_class(p, c);
  const bool ws = c.variant == Variant::warpspec;
  KernelSource src;
  const std::string rows = c.exact_m ? std::to_string(p.M) : std::string("M");
  src.name = fmt::format("fj.{}.{}.{}x{}x{}.{}{}{}", name(p.dtype), name(p.mode), rows, p.N, p.K,
                         c.key(), p.mode != Mode::train ? "" : (single_pass ? ".1pass" : ".2pass"),
                         p.stat_ranks ? fmt::format(".ranks{}", p.stat_ranks) : std::string());
  std::string& t = src.text;
  t += fmt::format("// fusejit generated kernel: {}\n// problem: {}\n", src.name,
                   kernel_set_problem_key(p, c));
  t += "#include \"common/types.cuh\"\n#include \"common/math_kind.cuh\"\n";
  t += "struct Spec {\n";
  t += fmt::format("  using T = {};\n  using P = {};\n", template_type_name(p.dtype),
                   template_type_name(p.param_dtype));
  t += fmt::format("  static constexpr int MATH = {};\n", template_math_name(p.dtype));
  // M = 0: the run's row count, from fj::Params::m (common/rows.cuh).
  t += fmt::format("  static constexpr int M = {}, N = {}, K = {};\n", c.exact_m ? p.M : 0, p.N,
                   p.K);
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
  // y's store width, and x's and W's copy widths (the tiled mainloops'): one promise covers all
  // three (Problem::alignment).
  const int vec = std::min(p.effective_alignment(), 16);
  t += fmt::format("  static constexpr int VEC_BYTES = {}, A_VEC_BYTES = {}, B_VEC_BYTES = {};\n",
                   vec, vec, vec);
  t += fmt::format(
      "  static constexpr bool TRAIN = {}, SINGLE_PASS = {}, CUMULATIVE = {};\n"
      "  static constexpr bool HAS_BIAS = {}, HAS_SCALE = {}, HAS_AFFINE = {};\n",
      b(p.mode == Mode::train), b(single_pass), b(!p.momentum), b(p.has_bias), b(p.has_scale),
      b(p.has_affine));
  // Only synchronized sets name it: the others' text, hence their cache keys, stay as they were.
  if (p.stat_ranks > 0) t += fmt::format("  static constexpr int RANKS = {};\n", p.stat_ranks);
  // Likewise only recompute sets name STATS_ONLY (fj_gemm stores no y) and SpecAffine, the
  // second pass: eval mode's GEMM with the finalize's coefficients (WS_AFFINE).
  if (c.recompute) t += "  static constexpr bool STATS_ONLY = true;\n";
  // And only grid_sync sets name GRID_SYNC: their fj_gemm may finish a run alone.
  if (c.grid_sync) t += "  static constexpr bool GRID_SYNC = true;\n";
  // And only overlap_apply sets name OVERLAP_APPLY: their fj_gemm applies y itself.
  if (c.overlap_apply) t += "  static constexpr bool OVERLAP_APPLY = true;\n";
  // Only padded sets name KP, the padded rows' length in elements (LDX and LDW stay the
  // caller's: the copy kernel reads them; the GEMM's tensor maps carry KP).
  if (c.pad_operands) t += fmt::format("  static constexpr int KP = {};\n", padded_row_elements(p));
  t += "};\n";
  if (c.recompute) {
    t += "struct SpecAffine : Spec {\n"
         "  static constexpr bool TRAIN = false, SINGLE_PASS = false, STATS_ONLY = false;\n"
         "  static constexpr bool WS_AFFINE = true;\n";
    if (c.grid_sync) t += "  static constexpr bool GRID_SYNC = false;\n";
    if (ws)
      t += fmt::format("  static constexpr int SMEM_BYTES = {};\n",
                       c.smem_bytes(recompute_affine_problem(p)));
    t += "};\n";
  }
  const char* gemm = ws ? "fj::WarpspecGemm<Spec>" : "fj::TiledGemm<Spec>";
  t += ws ? "#include \"kernels/warpspec_gemm.cuh\"\n" : "#include \"kernels/tiled_gemm.cuh\"\n";
  const auto has = [&](std::string_view k) {
    return std::find(kernels.begin(), kernels.end(), k) != kernels.end();
  };
  if (has("fj_splitk_reduce")) t += "#include \"kernels/splitk_reduce.cuh\"\n";
  // The BatchNorm passes (fj_finalize, fj_apply, fj_bump) live in bn_apply.cuh.
  const bool bn_passes =
      has("fj_finalize") || has("fj_apply") || has("fj_apply_fold") || has("fj_bump");
  if (bn_passes) t += "#include \"kernels/bn_apply.cuh\"\n";
  if (has("fj_rank_stats")) t += "#include \"kernels/bn_ranks.cuh\"\n";
  if (has("fj_pad_operands")) t += "#include \"kernels/pad_operands.cuh\"\n";
  if (has("fj_input_stats")) t += "#include \"kernels/input_stats.cuh\"\n";
  // The host reads the exact dynamic shared memory size and the launch shapes of the BatchNorm
  // passes from the module: the templates are their one source of truth. Grids that grow with
  // M are given per unit (launch[0]): the split-K reduce's per output tile, fj_apply's per slab
  // of kApplyBlockRows rows; the host multiplies by the run's count.
  t += fmt::format("extern \"C\" __device__ const int fj_smem_bytes = {}::kSmemBytes;\n", gemm);
  const char* gemm_affine = ws ? "fj::WarpspecGemm<SpecAffine>" : "fj::TiledGemm<SpecAffine>";
  if (has("fj_gemm_affine"))
    t += fmt::format(
        "extern \"C\" __device__ const int fj_gemm_affine_smem_bytes = {}::kSmemBytes;\n",
        gemm_affine);
  if (has("fj_splitk_reduce"))
    t += "extern \"C\" __device__ const int fj_splitk_reduce_smem_bytes =\n"
         "    fj::SplitKReduce<Spec>::kSmemBytes;\n"
         "extern \"C\" __device__ const int fj_splitk_reduce_launch[3] = {\n"
         "    1, 1, fj::SplitKReduce<Spec>::kThreads};\n";
  // fj_rank_stats runs on fj_finalize's grid (it merges the row tiles the same way).
  if (has("fj_finalize") || has("fj_rank_stats"))
    t += "extern \"C\" __device__ const int fj_finalize_launch[3] = {\n"
         "    fj::FinalizeShape<Spec>::kGridX, 1, fj::FinalizeShape<Spec>::kThreads};\n";
  if (has("fj_rank_finalize"))
    t += "extern \"C\" __device__ const int fj_rank_finalize_launch[3] = {\n"
         "    fj::RankFinalizeShape<Spec>::kGridX, 1, fj::RankFinalizeShape<Spec>::kThreads};\n";
  if (has("fj_apply") || has("fj_apply_fold"))
    t += "extern \"C\" __device__ const int fj_apply_launch[3] = {\n"
         "    fj::ApplyShape<Spec>::kStrips, 1, fj::kApplyThreads};\n";
  // A GEMM kernel (fj_gemm, or recompute's fj_gemm_affine) running `type`: warpspec takes the
  // TMA descriptors of x, W and y beside the parameters.
  const auto gemm_kernel = [&](const std::string& name, const char* type) {
    if (!ws)
      return fmt::format(
          "extern \"C\" __global__ void __launch_bounds__(Spec::THREADS)\n"
          "{}(const fj::Params p) {{ {}::run(p); }}\n",
          name, type);
    const std::string indent(name.size() + 1, ' ');
    return fmt::format(
        "extern \"C\" __global__ void __launch_bounds__(Spec::THREADS, 1)\n"
        "{}(const __grid_constant__ fj::Params p, const __grid_constant__ fj::TmaDescriptor tx,\n"
        "{}const __grid_constant__ fj::TmaDescriptor tw,\n"
        "{}const __grid_constant__ fj::TmaDescriptor ty) {{ {}::run(p, tx, tw, &ty); }}\n",
        name, indent, indent, type);
  };
  for (const auto& k : kernels) {
    if (k == "fj_gemm" || k == "fj_gemm_affine") {
      t += gemm_kernel(k, k == "fj_gemm" ? gemm : gemm_affine);
    } else if (k == "fj_splitk_reduce") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::SplitKReduce<Spec>::kThreads)\n"
           "fj_splitk_reduce(const fj::Params p) { fj::SplitKReduce<Spec>::run(p); }\n";
    } else if (k == "fj_rank_stats") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::FinalizeShape<Spec>::kThreads)\n"
           "fj_rank_stats(const fj::Params p) { fj::bn_rank_stats<Spec>(p); }\n";
    } else if (k == "fj_rank_finalize") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::RankFinalizeShape<Spec>::kThreads)\n"
           "fj_rank_finalize(const fj::Params p) { fj::bn_rank_finalize<Spec>(p); }\n";
    } else if (k == "fj_finalize") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::FinalizeShape<Spec>::kThreads)\n"
           "fj_finalize(const fj::Params p) { fj::bn_finalize<Spec>(p); }\n";
    } else if (k == "fj_apply") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kApplyThreads)\n"
           "fj_apply(const fj::Params p) { fj::bn_apply<Spec, false>(p); }\n";
    } else if (k == "fj_apply_fold") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kApplyThreads)\n"
           "fj_apply_fold(const fj::Params p) { fj::bn_apply<Spec, true>(p); }\n";
    } else if (k == "fj_pad_operands") {
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kPadThreads)\n"
           "fj_pad_operands(const fj::Params p) { fj::pad_operands<Spec>(p); }\n";
    } else if (k == "fj_input_stats") {
      // The affine GEMM's type: in tf32 the statistics take x and W rounded as its products do.
      t += fmt::format(
          "extern \"C\" __global__ void __launch_bounds__(fj::kInputStatsThreads, 1)\n"
          "fj_input_stats(const fj::Params p) {{ fj::InputStats<Spec, {}>::run(p); }}\n",
          gemm_affine);
    } else if (k == "fj_bump") {
      t += "extern \"C\" __global__ void fj_bump(const fj::Params p) { fj::bump_batches(p); }\n";
    }
  }
  src.kernels = kernels;
  src.options = kernel_compile_options();
  src.headers = template_headers();
  return src;
}

}  // namespace fusejit
