// The gradient GEMM kernel (templates/kernels/grad_gemm.cuh) on a GPU: the dX-shaped
// (dA W: A K-major, B MN-major, run-time rows) and dW-shaped (dA^T x: both MN-major, run-time
// reduction) GEMMs, and the forward's layout (both K-major) for reference, for every dtype,
// with tails in every dimension, C = A B (C poisoned with NaN first) and C += A B (C random),
// compared with a float64 GEMM of the same rounded inputs. One large case prints its time.
#include <doctest/doctest.h>

#include <algorithm>
#include <future>
#include <thread>

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "common/gemm_params.h"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/runtime/module.hpp"
#include "fusejit/verify/host_tensor.hpp"
#include "fusejit/verify/verification.hpp"
#include "gpu_required.hpp"
#include "grad_gemm_source.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;
using fusejit::test::GradGemmCase;

namespace {

enum class GemmShape { dx, dw, kk };

// The GEMM of a (dtype, shape, layer N x K, tiles): rows, reduction and strides as the
// backward pass has them. m is the run's and stays out of the source.
GradGemmCase make_case(DType d, GemmShape s, int n, int k, const fusejit::test::GradGemmTiles& t) {
  GradGemmCase c;
  c.dtype = d;
  c.tiles = t;
  const int m = 64;  // a placeholder: the extent it stands for is the run's (0 in the source)
  switch (s) {
    case GemmShape::dx:  // dX [m][K] = dA [m][N] . W [N][K]
      c.rows = m, c.cols = k, c.red = n, c.rows_runtime = true;
      c.a_mn = false, c.b_mn = true;
      c.lda = n, c.ldb = k, c.ldc = k;
      break;
    case GemmShape::dw:  // dW [N][K] = dA^T . x [m][K]
      c.rows = n, c.cols = k, c.red = m, c.red_runtime = true;
      c.a_mn = true, c.b_mn = true;
      c.lda = n, c.ldb = k, c.ldc = k;
      break;
    case GemmShape::kk:  // C [m][K] = dA [m][N] . (W^T stored [K][N])
      c.rows = m, c.cols = k, c.red = n, c.rows_runtime = true;
      c.a_mn = false, c.b_mn = false;
      c.lda = n, c.ldb = n, c.ldc = k;
      break;
  }
  return c;
}

struct Kernel {
  std::shared_ptr<const Module> module;
  CUfunction fn = nullptr;
  int smem = 0;
  int threads = 0;
};

// Compiles every case's kernel at once on all cores (NVRTC is thread-safe): one at a time, the
// compiles took four minutes of a GPU machine's time.
std::vector<CompiledKernel> compile_all(const std::vector<GradGemmCase>& cases) {
  const std::string arch = Device::get(0).arch();
  std::vector<std::future<CompiledKernel>> f;
  std::vector<CompiledKernel> out;
  const std::size_t width = std::max(2u, std::thread::hardware_concurrency());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (f.size() == width) {
      out.push_back(f.front().get());
      f.erase(f.begin());
    }
    f.push_back(std::async(std::launch::async, [&, i] {
      return compile(fusejit::test::grad_gemm_source(cases[i]), arch);
    }));
  }
  for (auto& x : f) out.push_back(x.get());
  return out;
}

Kernel load(const GradGemmCase& c, const CompiledKernel& bin) {
  const KernelSource src = fusejit::test::grad_gemm_source(c);
  Kernel k;
  k.module = std::make_shared<const Module>(bin, src.kernels);
  k.fn = k.module->function("fj_grad_gemm");
  k.smem = k.module->read_int("fj_grad_gemm_smem");
  k.threads = c.tiles.warps_m * c.tiles.warps_n * 32;
  FJ_CU(cuFuncSetAttribute(k.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k.smem));
  return k;
}

void launch(const Kernel& k, const GradGemmCase& c, int rows, const fj::GemmParams& p,
            CUstream stream) {
  const unsigned tiles = static_cast<unsigned>(((rows + c.tiles.bm - 1) / c.tiles.bm) *
                                               ((c.cols + c.tiles.bn - 1) / c.tiles.bn));
  void* args[] = {const_cast<fj::GemmParams*>(&p)};
  FJ_CU(cuLaunchKernel(k.fn, tiles, 1, 1, static_cast<unsigned>(k.threads), 1, 1,
                       static_cast<unsigned>(k.smem), stream, args, nullptr));
}

// One run with m rows in the batch: random A, B (and C when accumulating), C = A B or C += A B,
// against float64. Returns the relative error.
double check_run(const Kernel& k, GradGemmCase c, int m, bool accumulate) {
  if (c.rows_runtime) c.rows = m;
  if (c.red_runtime) c.red = m;
  const auto rows = static_cast<std::size_t>(c.rows), cols = static_cast<std::size_t>(c.cols),
             red = static_cast<std::size_t>(c.red);
  const std::size_t a_count = (c.a_mn ? red : rows) * static_cast<std::size_t>(c.lda);
  const std::size_t b_count = (c.b_mn ? red : cols) * static_cast<std::size_t>(c.ldb);
  const std::size_t c_count = rows * static_cast<std::size_t>(c.ldc);
  HostTensor a(c.dtype, a_count), b(c.dtype, b_count), out(c.dtype, c_count);
  fill_uniform(a, -1, 1);
  fill_uniform(b, -1, 1);
  if (accumulate)
    fill_uniform(out, -1, 1);
  else
    out.poison();
  DeviceBuffer da(a.bytes()), db(b.bytes()), dc(out.bytes());
  da.upload(a.data(), a.bytes());
  db.upload(b.data(), b.bytes());
  dc.upload(out.data(), out.bytes());
  const fj::GemmParams p{da.get(), db.get(), dc.get(), m, accumulate ? 1 : 0};
  launch(k, c, c.rows, p, nullptr);
  FJ_CU(cuCtxSynchronize());

  const std::vector<double> av = a.to_doubles(), bv = b.to_doubles(), c0 = out.to_doubles();
  std::vector<double> ref(rows * cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) {
      double s = accumulate ? c0[r * static_cast<std::size_t>(c.ldc) + j] : 0.0;
      for (std::size_t kk = 0; kk < red; ++kk) {
        const double x = c.a_mn ? av[kk * static_cast<std::size_t>(c.lda) + r]
                                : av[r * static_cast<std::size_t>(c.lda) + kk];
        const double y = c.b_mn ? bv[kk * static_cast<std::size_t>(c.ldb) + j]
                                : bv[j * static_cast<std::size_t>(c.ldb) + kk];
        s += x * y;
      }
      ref[r * cols + j] = s;
    }
  HostTensor got(c.dtype, c_count);
  dc.download(got.data(), got.bytes());
  return relative_error(got.packed(rows, cols, static_cast<std::size_t>(c.ldc)), ref);
}

double tolerance(DType d) {
  return sweep_threshold(d);
}

const char* shape_name(GemmShape s) {
  return s == GemmShape::dx ? "dX" : s == GemmShape::dw ? "dW" : "KK";
}

}  // namespace

TEST_CASE("gradient GEMMs match float64 with tails, accumulating or not") {
  primary_context(0);
  std::vector<GradGemmCase> cases;
  std::vector<GemmShape> shapes;
  for (DType d : {DType::bf16, DType::fp16, DType::tf32, DType::fp32}) {
    const auto tiles = fusejit::test::grad_gemm_tiles(d);
    for (std::size_t ti = 0; ti < tiles.size(); ++ti)
      for (GemmShape s : {GemmShape::dx, GemmShape::dw, GemmShape::kk})
        for (int n : {8, 40, 136})
          for (int kdim : {8, 40, 136}) {
            // The second tile config and the forward layout on a subset: they exercise the
            // same loaders with other tile shapes.
            if ((ti > 0 || s == GemmShape::kk) && n != kdim && n != 40) continue;
            cases.push_back(make_case(d, s, n, kdim, tiles[ti]));
            shapes.push_back(s);
          }
  }
  const std::vector<CompiledKernel> bins = compile_all(cases);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const GradGemmCase& c = cases[i];
    const GemmShape s = shapes[i];
    const DType d = c.dtype;
    CAPTURE(c.name());
    const Kernel k = load(c, bins[i]);
    for (int m : {1, 2, 37, 300})
      for (bool acc : {false, true}) {
        CAPTURE(m);
        CAPTURE(acc);
        const double e = check_run(k, c, m, acc);
        if (!(e < tolerance(d)))
          MESSAGE(shape_name(s) << " " << c.name() << " m=" << m << " acc=" << acc << ": rel err "
                                << e);
        CHECK(e < tolerance(d));
      }
  }
}

namespace {

// dX and dW of every dtype at N = n, K = kdim with the first tile config, against float64 at a
// few row counts, after checking the copy widths the strides give: da's (A, N) 16 bytes when
// `da_wide`, else its elements'; W's or x's (B) and C's (K) their elements'.
void check_narrow_strides(int n, int kdim, bool da_wide) {
  primary_context(0);
  for (DType d : {DType::bf16, DType::fp16, DType::tf32, DType::fp32})
    for (GemmShape s : {GemmShape::dx, GemmShape::dw}) {
      const GradGemmCase c = make_case(d, s, n, kdim, fusejit::test::grad_gemm_tiles(d)[0]);
      CAPTURE(c.name());
      const int eb = static_cast<int>(storage_bytes(d));
      REQUIRE(c.vec_bytes(c.lda) == (da_wide ? 16 : eb));
      REQUIRE(c.vec_bytes(c.ldb) == eb);
      REQUIRE(c.vec_bytes(c.ldc) == eb);
      const Kernel k = load(c, compile(fusejit::test::grad_gemm_source(c), Device::get(0).arch()));
      for (int m : {1, 37, 300})
        for (bool acc : {false, true}) {
          CAPTURE(m);
          CAPTURE(acc);
          CHECK(check_run(k, c, m, acc) < tolerance(d));
        }
    }
}

}  // namespace

TEST_CASE("gradient GEMMs with element-aligned strides") {
  // N = 37, K = 45: rows are only element-aligned, so the loaders take their narrow paths.
  check_narrow_strides(37, 45, false);
}

TEST_CASE("gradient GEMMs whose operands are copied at different widths") {
  // N = 40, K = 45: da's rows are 16-byte aligned, W's, x's and C's element-aligned, as in a layer
  // with an odd K: A is copied 16 bytes at a time, B and C at their elements' width.
  check_narrow_strides(40, 45, true);
}

TEST_CASE("gradient GEMMs at m = 2048, N = K = 1024: time (printed, not asserted)") {
  primary_context(0);
  const int m = 2048, n = 1024, kdim = 1024;
  for (DType d : {DType::bf16, DType::fp16, DType::tf32, DType::fp32})
    for (GemmShape s : {GemmShape::dx, GemmShape::dw}) {
      GradGemmCase c = make_case(d, s, n, kdim, fusejit::test::grad_gemm_tiles(d)[0]);
      CAPTURE(c.name());
      const Kernel k = load(c, compile(fusejit::test::grad_gemm_source(c), Device::get(0).arch()));
      // Correct at this size too (a sampled check would do, but float64 of 2 GFLOP is fine).
      const double e = check_run(k, c, m, false);
      CHECK(e < tolerance(d));
      if (c.rows_runtime) c.rows = m;
      if (c.red_runtime) c.red = m;
      const std::size_t eb = storage_bytes(d);
      DeviceBuffer da((c.a_mn ? c.red : c.rows) * static_cast<std::size_t>(c.lda) * eb);
      DeviceBuffer db((c.b_mn ? c.red : c.cols) * static_cast<std::size_t>(c.ldb) * eb);
      DeviceBuffer dc(static_cast<std::size_t>(c.rows) * static_cast<std::size_t>(c.ldc) * eb);
      da.fill_bytes(0x3c);
      db.fill_bytes(0x3c);
      const fj::GemmParams p{da.get(), db.get(), dc.get(), m, 0};
      EventTimer timer(nullptr, 20);
      std::vector<double> ms;
      timer.time([&](int, CUstream st) { launch(k, c, c.rows, p, st); }, 1, 5, 20, ms);
      const double t = median(ms);
      const double tflops = 2.0 * m * n * kdim / (t * 1e-3) / 1e12;
      MESSAGE(fmt::format("{} {}: {:.3f} ms, {:.1f} TFLOP/s (rel err {:.2e})", shape_name(s),
                          c.name(), t, tflops, e));
    }
}
