// A hand-written kernel source for templates/kernels/grad_gemm.cuh: the prelude the backward
// codegen writes (a description struct), the include and one extern "C" kernel. Shared by the
// compile test (every arch) and the GPU test (numbers).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/dtype.hpp"
#include "fusejit/problem.hpp"

namespace fusejit::test {

struct GradGemmTiles {
  int bm, bn, bk, warps_m, warps_n, stages;
};

// C [rows][ldc] = A B: A is [rows][lda] (K-major) or [red][lda] (MN-major), B [cols][ldb] or
// [red][ldb]. rows_runtime / red_runtime: the prelude says 0 (the run's m) for that extent.
struct GradGemmCase {
  DType dtype = DType::bf16;
  int rows = 0, cols = 0, red = 0;
  bool rows_runtime = false, red_runtime = false;
  bool a_mn = false, b_mn = false;
  int lda = 0, ldb = 0, ldc = 0;
  GradGemmTiles tiles{};

  // The widest copy, up to 16 bytes, that a row stride of `ld` elements allows: the tests'
  // pointers are 256-byte aligned, so each operand's (and C's) width is its stride's.
  int vec_bytes(int ld) const {
    return natural_alignment(0, static_cast<std::int64_t>(ld) * storage_bytes(dtype));
  }
  std::string name() const {
    return fmt::format("grad.{}.{}{}.{}x{}x{}{}{}.{}x{}x{}.w{}x{}.s{}", fusejit::name(dtype),
                       a_mn ? 'M' : 'K', b_mn ? 'M' : 'K', rows, cols, red,
                       rows_runtime ? ".rows0" : "", red_runtime ? ".red0" : "", tiles.bm, tiles.bn,
                       tiles.bk, tiles.warps_m, tiles.warps_n, tiles.stages);
  }
};

inline KernelSource grad_gemm_source(const GradGemmCase& c) {
  const GradGemmTiles& t = c.tiles;
  KernelSource src;
  src.name = c.name();
  std::string& s = src.text;
  s += "#include \"common/gemm_params.h\"\n#include \"common/math_kind.cuh\"\n";
  s += "#include \"common/types.cuh\"\n";
  s += "struct GradSpec {\n";
  s += fmt::format("  using T = {};\n", template_type_name(c.dtype));
  s += fmt::format("  static constexpr int MATH = {};\n", template_math_name(c.dtype));
  s += fmt::format("  static constexpr int ROWS = {}, COLS = {}, RED = {};\n",
                   c.rows_runtime ? 0 : c.rows, c.cols, c.red_runtime ? 0 : c.red);
  s += fmt::format("  static constexpr bool A_MN_MAJOR = {}, B_MN_MAJOR = {};\n",
                   c.a_mn ? "true" : "false", c.b_mn ? "true" : "false");
  s += fmt::format("  static constexpr int LDA = {}, LDB = {}, LDC = {};\n", c.lda, c.ldb, c.ldc);
  s += fmt::format(
      "  static constexpr int BM = {}, BN = {}, BK = {}, WARPS_M = {}, WARPS_N = {}, STAGES = {}, "
      "GROUP_M = 8;\n",
      t.bm, t.bn, t.bk, t.warps_m, t.warps_n, t.stages);
  s += fmt::format(
      "  static constexpr int THREADS = {}, VEC_BYTES = {}, A_VEC_BYTES = {}, B_VEC_BYTES = {};\n"
      "  static constexpr int SPLIT_K = 1;\n",
      t.warps_m * t.warps_n * 32, c.vec_bytes(c.ldc), c.vec_bytes(c.lda), c.vec_bytes(c.ldb));
  s += "};\n#include \"kernels/grad_gemm.cuh\"\n";
  s += "extern \"C\" __global__ void __launch_bounds__(GradSpec::THREADS) "
       "fj_grad_gemm(const fj::GemmParams p) {\n  fj::GradGemm<GradSpec>::run(p);\n}\n";
  s += "extern \"C\" __device__ const int fj_grad_gemm_smem = "
       "fj::GradGemm<GradSpec>::kSmemBytes;\n";
  src.options = {"--std=c++17", "-DNDEBUG", "--extra-device-vectorization"};
  src.headers = template_headers();
  src.kernels = {"fj_grad_gemm"};
  return src;
}

// Tile configurations the tests instantiate per dtype: the first a typical large tile, the second
// small with an odd number of 8-column mma tiles per warp on the tensor-core path (the x2
// ldmatrix of B). tf32's large tile has 8 warps: with 4, MN-major operands (32 four-byte copies
// per operand and k-tile per thread) push 128x128 past 255 registers.
inline std::vector<GradGemmTiles> grad_gemm_tiles(DType d) {
  switch (d) {
    case DType::fp32:
      return {{128, 128, 16, 4, 2, 3}, {64, 64, 16, 2, 1, 3}};
    case DType::tf32:
      return {{128, 128, 32, 2, 4, 3}, {64, 32, 32, 1, 4, 3}};
    default:
      return {{128, 128, 32, 2, 2, 3}, {64, 32, 64, 1, 4, 4}};
  }
}

}  // namespace fusejit::test
