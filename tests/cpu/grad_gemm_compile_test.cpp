// The gradient GEMM kernel (templates/kernels/grad_gemm.cuh) compiles with NVRTC for every
// dtype, operand layout pair (KK, KM, MM), run-time rows or run-time reduction, a couple of tile
// configurations and odd strides, for every architecture fusejit supports. No GPU needed.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "fusejit/compile/compiler.hpp"
#include "grad_gemm_source.hpp"
#include "test_nvrtc_jobs.hpp"

using namespace fusejit;
using fusejit::test::GradGemmCase;

namespace {

// The strides of cases(): 16-byte aligned rows; element-aligned ones; and da's rows (N) 16-byte
// aligned where the layer's (K) are element-aligned, so that A is copied wider than B and C.
enum class Strides { aligned, odd, mixed };

// Every (layout pair, which extent is the run's) for one dtype and tile config. Shapes have
// tails in every dimension.
std::vector<GradGemmCase> cases(DType d, const fusejit::test::GradGemmTiles& t, Strides strides) {
  std::vector<GradGemmCase> out;
  // The layer's N (features) and K (inputs).
  const int n = strides == Strides::aligned ? 136 : strides == Strides::odd ? 37 : 40;
  const int k = strides == Strides::aligned ? 40 : 45;
  for (int layout = 0; layout < 3; ++layout) {
    for (bool rows_runtime : {true, false}) {
      GradGemmCase c;
      c.dtype = d;
      c.tiles = t;
      c.a_mn = layout == 2;
      c.b_mn = layout >= 1;
      if (layout == 2) {
        // dW [N][K] = dA^T x: reduction over the run's rows.
        c.rows = n, c.cols = k, c.red = 300;
        c.rows_runtime = !rows_runtime;  // one variant with run-time rows too
        c.red_runtime = true;
        c.lda = n, c.ldb = k, c.ldc = k;
      } else {
        // KM: dX [m][K] = dA W; KK: the same with W^T stored [K][N].
        c.rows = 300, c.cols = k, c.red = n;
        c.rows_runtime = rows_runtime;
        c.red_runtime = !rows_runtime;
        c.lda = n, c.ldb = layout == 1 ? k : n, c.ldc = k;
      }
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the gradient GEMM compiles for every dtype, layout and architecture") {
  const std::vector<std::string> archs = fusejit::test::supported_archs();
  for (const char* must : {"sm_80", "sm_86", "sm_89", "sm_90a"})
    REQUIRE(std::find(archs.begin(), archs.end(), std::string(must)) != archs.end());
  std::vector<fusejit::test::CompileJob> jobs;
  for (const auto& arch : archs)
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
      const auto tiles = fusejit::test::grad_gemm_tiles(d);
      for (std::size_t t = 0; t < tiles.size(); ++t)
        for (Strides strides : {Strides::aligned, Strides::odd, Strides::mixed}) {
          // Odd and mixed strides with the first tile config only: the loaders' narrow copies do
          // not depend on the tile shape; mixed ones on sm_90a alone. The templates hold nothing
          // arch-specific below sm_90a's own paths, so the other archs get the first config
          // alone (keeps this test to minutes on a small machine).
          // Elsewhere one mainloop of each kind (mma: bf16; FFMA: fp32) and the two backward
          // layouts (KM, MM) with the first config: the CI machine compiles on two cores.
          const bool every = arch == "sm_80" || arch == "sm_90a";
          const bool narrow = strides != Strides::aligned;
          if ((narrow || t > 0) && !every) continue;
          if (narrow && t > 0) continue;
          if (strides == Strides::mixed && arch != "sm_90a") continue;
          if (!every && d != DType::bf16 && d != DType::fp32) continue;
          for (const GradGemmCase& c : cases(d, tiles[t], strides)) {
            const bool dx = !c.a_mn && c.b_mn && c.rows_runtime && !c.red_runtime;
            const bool dw = c.a_mn && c.b_mn && !c.rows_runtime && c.red_runtime;
            if (every || dx || dw) jobs.push_back({arch, fusejit::test::grad_gemm_source(c)});
          }
        }
    }
  MESSAGE(jobs.size() << " kernels over " << archs.size() << " architectures");
  const std::string failures = fusejit::test::compile_jobs(jobs, fusejit::test::Coverage::sampled);
  CHECK_MESSAGE(failures.empty(), failures);
}
