#include "fusejit/codegen/backward_codegen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "common/tma_store_box.h"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/error.hpp"

namespace fusejit {

namespace {

const char* b(bool v) {
  return v ? "true" : "false";
}

// One gradient GEMM's Spec: C [ROWS][LDC] = sum over RED of A(r, k) B(c, k)
// (kernels/grad_gemm.cuh, and kernels/grad_wgmma.cuh for the warpspec variant, which reads
// CONSUMERS = warps_m and PERSISTENT, and its operands through tensor maps: LDA and LDB are the
// tiled kernel's, 0 for an operand read from a copy).
std::string gemm_spec(const char* name, const Problem& p, const KernelConfig& c, int rows, int cols,
                      int red, bool a_mn, bool b_mn, std::int64_t lda, std::int64_t ldb,
                      std::int64_t ldc, GradGemmVecBytes vec) {
  return fmt::format(
      "struct {} {{\n"
      "  using T = {};\n"
      "  static constexpr int MATH = {};\n"
      "  static constexpr int ROWS = {}, COLS = {}, RED = {};\n"
      "  static constexpr bool A_MN_MAJOR = {}, B_MN_MAJOR = {};\n"
      "  static constexpr int LDA = {}, LDB = {}, LDC = {};\n"
      "  static constexpr int BM = {}, BN = {}, BK = {}, WARPS_M = {}, WARPS_N = {};\n"
      "  static constexpr int STAGES = {}, GROUP_M = {}, THREADS = {};\n"
      "  static constexpr int VEC_BYTES = {}, A_VEC_BYTES = {}, B_VEC_BYTES = {};\n"
      "  static constexpr int CONSUMERS = {}, SPLIT_K = {};\n"
      "  static constexpr bool PERSISTENT = {}, TMA_STORE = {};\n"
      "  static constexpr int SMEM_BYTES = {};\n"
      "}};\n",
      name, template_type_name(p.dtype), template_math_name(grad_gemm_dtype(p.dtype)), rows, cols,
      red, b(a_mn), b(b_mn), lda, ldb, ldc, c.bm, c.bn, c.bk, c.warps_m, c.warps_n, c.stages,
      c.group_m, c.threads(), vec.layer, vec.da, vec.layer, c.warps_m, c.split_k, b(c.persistent),
      b(c.tma_store),
      c.variant == Variant::warpspec ? grad_wgmma_smem_bytes(c, grad_gemm_dtype(p.dtype)) : -1);
}

// The kernel template of a gradient GEMM's config.
const char* gemm_template(const KernelConfig& c) {
  return c.variant == Variant::warpspec ? "fj::GradWgmma" : "fj::GradGemm";
}

// fj_bwd_dx / fj_bwd_dw: the tiled kernel takes the parameters; the warpspec one also the
// operands' and C's tensor maps (plan/backward_core.cpp), by value in parameter space.
std::string gemm_kernel(const char* name, const char* spec, const KernelConfig& c) {
  if (c.variant == Variant::warpspec)
    return fmt::format(
        "extern \"C\" __global__ void __launch_bounds__({0}::THREADS, 1)\n"
        "{1}(const __grid_constant__ fj::GemmParams p,\n"
        "    const __grid_constant__ fj::TmaDescriptor ta,\n"
        "    const __grid_constant__ fj::TmaDescriptor tb,\n"
        "    const __grid_constant__ fj::TmaDescriptor tc) {{ fj::GradWgmma<{0}>::run(p, ta, tb, "
        "tc); "
        "}}\n",
        spec, name);
  return fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({0}::THREADS)\n"
      "{1}(const fj::GemmParams p) {{ fj::GradGemm<{0}>::run(p); }}\n",
      spec, name);
}

}  // namespace

int grad_wgmma_smem_bytes(const KernelConfig& c, DType d) {
  // kernels/grad_wgmma.cuh's SharedStorage: the ring of A and B tiles (1024-byte aligned), a
  // full and an empty barrier per stage, the TMA store's two boxes per consumer warp
  // (1024-byte aligned), and the 1024 bytes run() may skip to align the base.
  auto up = [](int v, int a) { return (v + a - 1) / a * a; };
  const int ring = c.stages * (c.bm + c.bn) * c.bk * static_cast<int>(storage_bytes(d));
  int bytes = ring + 16 * c.stages;
  if (c.tma_store) bytes = up(bytes, 1024) + 4 * c.warps_m * fj::kTmaStoreWarpBytes;
  return up(bytes, 1024) + 1024;
}

std::string BackwardConfig::dx_key() const {
  return dx_cublaslt ? std::string(kCublasLtGemmKey) : dx.key();
}
std::string BackwardConfig::dw_key() const {
  return dw_cublaslt ? std::string(kCublasLtGemmKey) : dw.key();
}
std::string BackwardConfig::key() const {
  return fmt::format("dx.{}.dw.{}", dx_key(), dw_key());
}

BackwardConfig BackwardConfig::parse(std::string_view key, const char* arg) {
  const std::size_t dw = key.find(".dw.");
  if (!key.starts_with("dx.") || dw == std::string_view::npos)
    throw InvalidArgument(arg, fmt::format("expected dx.<config key>.dw.<config key>, as "
                                           "BackwardPlan::config_key() prints it (a key may be "
                                           "'{}'); got '{}'",
                                           kCublasLtGemmKey, key));
  try {
    BackwardConfig c;
    const std::string_view dx_key = key.substr(3, dw - 3), dw_key = key.substr(dw + 4);
    c.dx_cublaslt = dx_key == kCublasLtGemmKey;
    c.dw_cublaslt = dw_key == kCublasLtGemmKey;
    if (!c.dx_cublaslt) c.dx = KernelConfig::parse(dx_key);
    if (!c.dw_cublaslt) c.dw = KernelConfig::parse(dw_key);
    return c;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(arg, fmt::format("'{}': {}", key, e.what()));
  }
}

DType grad_gemm_dtype(DType d) {
  // tf32x3's gradient GEMMs run strict fp32 (FFMA), as exact as 3xTF32 or more and faster here:
  // the warpspec gradient GEMMs have no three-product split (tf32's read K-major copies with one
  // product each: grad_gemm_reads_copies), and the tiled mma.sync kernel with the split measured
  // 1.13x the strict kernels' time (H200, 1024x8192x8192 and 4096^3 train backward: 7.16-7.23 ms
  // against 6.32).
  return d == DType::tf32x3 ? DType::fp32 : d;
}

bool grad_gemm_layer_reads_copies(const Problem& p) {
  return grad_gemm_dtype(p.dtype) == DType::tf32 ||
         (storage_bytes(p.dtype) == 2 && p.effective_alignment() < 16);
}

bool grad_gemm_reads_copies(const Problem& p, const KernelConfig& c) {
  return c.variant == Variant::warpspec && grad_gemm_layer_reads_copies(p);
}

bool grad_gemm_reads_da_copy(const Problem& p, const KernelConfig& c) {
  return grad_gemm_reads_copies(p, c) && grad_gemm_dtype(p.dtype) == DType::tf32;
}

std::int64_t grad_row_elements(std::int64_t elements, DType d) {
  const auto per16 = static_cast<std::int64_t>(16 / storage_bytes(d));
  return (elements + per16 - 1) / per16 * per16;
}

std::int64_t grad_da_row_elements(const Problem& p) {
  return grad_row_elements(p.N, p.dtype);
}

GradGemmVecBytes grad_gemm_vec_bytes(const Problem& p) {
  // da's region starts 256-byte aligned (backward_workspace), so its row stride decides.
  const auto es = static_cast<std::int64_t>(storage_bytes(p.dtype));
  return {natural_alignment(0, grad_da_row_elements(p) * es),
          std::min(p.effective_alignment(), 16)};
}

Problem dx_gemm_problem(const Problem& p) {
  Problem g = p;
  g.dtype = grad_gemm_dtype(p.dtype);
  g.M = p.M;
  g.N = p.K;
  g.K = p.N;
  g.ldx = 0;
  g.ldw = 0;
  g.ldy = 0;
  g.mode = Mode::eval;
  return g;
}

Problem dw_gemm_problem(const Problem& p) {
  Problem g = dx_gemm_problem(p);
  g.M = p.N;
  g.N = p.K;
  g.K = p.M;
  return g;
}

std::vector<std::string> backward_kernel_set(const Problem& p, const BackwardConfig& c) {
  std::vector<std::string> k{"fj_bwd_reduce"};
  if (p.mode == Mode::train)
    k.insert(k.end(), {"fj_bwd_coef", "fj_bwd_da", "fj_bwd_resident", "fj_bwd_resident_shared"});
  else
    k.push_back("fj_bwd_params");
  // A GEMM on cuBLASLt has no kernel here (and reads no copies: it takes any layout).
  if ((!c.dx_cublaslt && grad_gemm_reads_copies(p, c.dx)) ||
      (!c.dw_cublaslt && grad_gemm_reads_copies(p, c.dw)))
    k.push_back("fj_bwd_transpose");
  if (!c.dx_cublaslt) {
    k.push_back("fj_bwd_dx");
    if (c.dx.split_k > 1) k.push_back("fj_bwd_dx_sum");
  }
  if (!c.dw_cublaslt) {
    k.push_back("fj_bwd_dw");
    if (c.dw.split_k > 1) k.push_back("fj_bwd_dw_sum");
  }
  return k;
}

KernelSource generate_backward(const Problem& p, const BackwardConfig& c) {
  KernelSource src;
  src.kernels = backward_kernel_set(p, c);
  src.name =
      fmt::format("fj.{}.{}.backward.Mx{}x{}.{}", name(p.dtype), name(p.mode), p.N, p.K, c.key());
  std::string& t = src.text;
  Problem keyed = p;
  keyed.M = 1;  // the source names no M
  // Nor momentum, which no backward kernel reads: one binary (one cache key) for every momentum,
  // as the tuning database files backward entries (backward_entry_problem).
  keyed.momentum = Problem{}.momentum;
  t += fmt::format("// fusejit generated kernel: {}\n// problem: M{}\n", src.name,
                   keyed.key().substr(keyed.key().find('x')));
  t += "#include \"common/types.cuh\"\n#include \"common/math_kind.cuh\"\n";
  // The BatchNorm side: the forward's Spec fields the backward kernels read (dy and saved are
  // laid out like y).
  const int vec = std::min(p.effective_alignment(), 16);
  t += "struct Spec {\n";
  t += fmt::format("  using T = {};\n  using P = {};\n", template_type_name(p.dtype),
                   template_type_name(p.param_dtype));
  t += fmt::format("  static constexpr int N = {}, K = {}, LDY = {}, LDDA = {}, VEC_BYTES = {};\n",
                   p.N, p.K, p.lda_y(), grad_da_row_elements(p), vec);
  t += fmt::format(
      "  static constexpr bool TRAIN = {}, HAS_BIAS = {}, HAS_SCALE = {}, HAS_AFFINE = {};\n",
      b(p.mode == Mode::train), b(p.has_bias), b(p.has_scale), b(p.has_affine));
  t += "};\n";
  const GradGemmVecBytes gemm_vec = grad_gemm_vec_bytes(p);
  // An operand read from a copy is K-major (grad_gemm_reads_copies, grad_gemm_reads_da_copy).
  // A GEMM on cuBLASLt (BackwardConfig::dx_cublaslt, dw_cublaslt) has no Spec or kernel here.
  const bool fused_dx = !c.dx_cublaslt, fused_dw = !c.dw_cublaslt;
  const bool dx_copies = fused_dx && grad_gemm_reads_copies(p, c.dx),
             dw_copies = fused_dw && grad_gemm_reads_copies(p, c.dw),
             dw_da_copy = fused_dw && grad_gemm_reads_da_copy(p, c.dw);
  const std::int64_t ld_da = grad_da_row_elements(p);
  if (fused_dx)
    t += gemm_spec("DxSpec", p, c.dx, 0, static_cast<int>(p.K), static_cast<int>(p.N), false,
                   !dx_copies, ld_da, dx_copies ? 0 : p.lda_w(), p.lda_x(), gemm_vec);
  if (fused_dw)
    t += gemm_spec("DwSpec", p, c.dw, static_cast<int>(p.N), static_cast<int>(p.K), 0, !dw_da_copy,
                   !dw_copies, dw_da_copy ? 0 : ld_da, dw_copies ? 0 : p.lda_x(), p.lda_w(),
                   gemm_vec);
  t += "#include \"kernels/bn_backward.cuh\"\n";
  if (fused_dx || fused_dw) t += "#include \"kernels/grad_gemm.cuh\"\n";
  if (dx_copies || dw_copies) t += "#include \"kernels/transpose.cuh\"\n";
  if ((fused_dx && c.dx.split_k > 1) || (fused_dw && c.dw.split_k > 1))
    t += "#include \"kernels/grad_split_sum.cuh\"\n";
  // sm_90a-only instructions: included only when a config asks for them (KernelConfig::why_invalid
  // keeps warpspec to Hopper).
  if ((fused_dx && c.dx.variant == Variant::warpspec) ||
      (fused_dw && c.dw.variant == Variant::warpspec))
    t += "#include \"kernels/grad_wgmma.cuh\"\n";
  // Launch shapes from the module, the templates being their one source of truth: the
  // elementwise kernels' grid is strips x slabs (the host multiplies by the run's slabs).
  t += "extern \"C\" __device__ const int fj_bwd_strips = fj::BackwardShape<Spec>::kStrips;\n"
       "extern \"C\" __device__ const int fj_bwd_column_blocks =\n"
       "    fj::BackwardShape<Spec>::kColumnBlocks;\n";
  if (fused_dx)
    t += fmt::format(
        "extern \"C\" __device__ const int fj_bwd_dx_smem_bytes = {}<DxSpec>::kSmemBytes;\n",
        gemm_template(c.dx));
  if (fused_dw)
    t += fmt::format(
        "extern \"C\" __device__ const int fj_bwd_dw_smem_bytes = {}<DwSpec>::kSmemBytes;\n",
        gemm_template(c.dw));
  for (const auto& k : src.kernels) {
    if (k == "fj_bwd_reduce")
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kBackwardThreads)\n"
           "fj_bwd_reduce(const fj::BackwardParams p) { fj::bn_backward_reduce<Spec>(p); }\n";
    else if (k == "fj_bwd_coef")
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kBackwardColumnThreads)\n"
           "fj_bwd_coef(const fj::BackwardParams p) { fj::bn_backward_coef<Spec>(p); }\n";
    else if (k == "fj_bwd_da")
      t += "extern \"C\" __global__ void\n"
           "__launch_bounds__(fj::kBackwardThreads, fj::BackwardShape<Spec>::kDaBlocksPerSm)\n"
           "fj_bwd_da(const fj::BackwardParams p) { fj::bn_backward_da<Spec>(p); }\n";
    else if (k == "fj_bwd_resident")
      t += "extern \"C\" __global__ void\n"
           "__launch_bounds__(fj::kBackwardThreads, fj::kBackwardResidentBlocksPerSm)\n"
           "fj_bwd_resident(const fj::BackwardParams p) { fj::bn_backward_resident<Spec>(p); }\n";
    else if (k == "fj_bwd_resident_shared")
      t += "extern \"C\" __global__ void\n"
           "__launch_bounds__(fj::kBackwardThreads, fj::kBackwardResidentBlocksPerSm)\n"
           "fj_bwd_resident_shared(const fj::BackwardParams p) {\n"
           "  fj::bn_backward_resident_shared<Spec>(p);\n"
           "}\n";
    else if (k == "fj_bwd_params")
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kBackwardColumnThreads)\n"
           "fj_bwd_params(const fj::BackwardParams p) { fj::bn_backward_params<Spec>(p); }\n";
    else if (k == "fj_bwd_transpose")
      t += "extern \"C\" __global__ void __launch_bounds__(fj::kTransposeThreads)\n"
           "fj_bwd_transpose(const fj::TransposeParams p) {\n"
           "  fj::transpose_tile<sizeof(Spec::T)>(p);\n"
           "}\n";
    else if (k == "fj_bwd_dx")
      t += gemm_kernel("fj_bwd_dx", "DxSpec", c.dx);
    else if (k == "fj_bwd_dw")
      t += gemm_kernel("fj_bwd_dw", "DwSpec", c.dw);
    else if (k == "fj_bwd_dx_sum" || k == "fj_bwd_dw_sum")
      t += fmt::format(
          "extern \"C\" __global__ void __launch_bounds__(fj::GradSplitSum<{0}>::kThreads)\n"
          "{1}(const fj::GemmParams p) {{ fj::GradSplitSum<{0}>::run(p); }}\n",
          k == "fj_bwd_dx_sum" ? "DxSpec" : "DwSpec", k);
  }
  src.options = kernel_compile_options();
  src.headers = template_headers();
  return src;
}

}  // namespace fusejit
