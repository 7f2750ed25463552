// The JIT pipeline end to end on a GPU: codegen -> NVRTC -> disk cache -> module -> launch, for
// eval and both train schedules, checked against a float64 computation done here.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "gpu_required.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;

namespace {

struct Buffer {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t n) : bytes(n) { FJ_CU(cuMemAlloc(&ptr, n)); }
  ~Buffer() { driver().cuMemFree(ptr); }
  template <class T>
  void upload(const std::vector<T>& v) {
    REQUIRE(v.size() * sizeof(T) == bytes);
    FJ_CU(cuMemcpyHtoD(ptr, v.data(), bytes));
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> v(bytes / sizeof(T));
    FJ_CU(cuMemcpyDtoH(v.data(), ptr, bytes));
    return v;
  }
  void* get() const { return reinterpret_cast<void*>(ptr); }
};

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// y, new running mean/var for fp32 inputs (float64 arithmetic).
void reference(const Problem& p, const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& b, const std::vector<float>& s,
               const std::vector<float>& g, const std::vector<float>& be, std::vector<double>& rm,
               std::vector<double>& rv, std::vector<double>& y) {
  const auto M = static_cast<std::size_t>(p.M), N = static_cast<std::size_t>(p.N),
             K = static_cast<std::size_t>(p.K);
  std::vector<double> z(M * N);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      double a = 0;
      for (std::size_t k = 0; k < K; ++k) a += double(x[m * K + k]) * double(w[n * K + k]);
      z[m * N + n] = (a + b[n]) * s[n];
    }
  y.assign(M * N, 0);
  for (std::size_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    if (p.mode == Mode::train) {
      for (std::size_t m = 0; m < M; ++m) mean += z[m * N + n];
      mean /= double(M);
      for (std::size_t m = 0; m < M; ++m) var += (z[m * N + n] - mean) * (z[m * N + n] - mean);
      var /= double(M);
      const double f = *p.momentum;
      rm[n] = (1 - f) * rm[n] + f * mean;
      rv[n] = (1 - f) * rv[n] + f * var * double(M) / double(M - 1);
    } else {
      mean = rm[n];
      var = rv[n];
    }
    const double inv = 1.0 / std::sqrt(var + p.eps);
    for (std::size_t m = 0; m < M; ++m) y[m * N + n] = (z[m * N + n] - mean) * inv * g[n] + be[n];
  }
}

void check_problem(Problem p, double tol, Variant variant) {
  CAPTURE(p.key());
  CAPTURE(name(variant));
  primary_context(0);
  std::mt19937 rng(std::random_device{}());
  const auto M = static_cast<std::size_t>(p.M), N = static_cast<std::size_t>(p.N),
             K = static_cast<std::size_t>(p.K);
  // Non-centred inputs (uniform [0,1)) as KernelBench draws them.
  auto x = random_vector(M * K, rng, 0.f, 1.f);
  auto w = random_vector(N * K, rng, -1.f / std::sqrt(float(K)), 1.f / std::sqrt(float(K)));
  auto b = random_vector(N, rng, -1, 1), s = random_vector(N, rng, 0.5f, 2),
       g = random_vector(N, rng, 0.5f, 1.5f), be = random_vector(N, rng, -1, 1),
       rm = random_vector(N, rng, -0.5f, 0.5f), rv = random_vector(N, rng, 0.5f, 2);
  Buffer dx(M * K * 4), dw(N * K * 4), dy(M * N * 4), db(N * 4), ds(N * 4), dg(N * 4), dbe(N * 4),
      drm(N * 4), drv(N * 4);
  dx.upload(x), dw.upload(w), db.upload(b), ds.upload(s), dg.upload(g), dbe.upload(be),
      drm.upload(rm), drv.upload(rv);
  FJ_CU(cuMemsetD32(dy.ptr, 0x7fc00000u, M * N));  // NaN: unwritten outputs fail
  PlanOptions opts;
  opts.variant = variant;
  Plan plan(p, opts);
  Tensors t;
  t.x = dx.get(), t.w = dw.get(), t.y = dy.get(), t.bias = db.get(), t.scale = ds.get();
  t.gamma = dg.get(), t.beta = dbe.get(), t.running_mean = drm.get(), t.running_var = drv.get();
  plan.run(nullptr, t);
  FJ_CU(cuCtxSynchronize());
  std::vector<double> rmd(rm.begin(), rm.end()), rvd(rv.begin(), rv.end()), y;
  reference(p, x, w, b, s, g, be, rmd, rvd, y);
  const double e = rel_err(dy.download<float>(), y);
  MESSAGE(p.key() << " via " << plan.config().key() << ": rel err " << e);
  CHECK(e < tol);
  CHECK(rel_err(drm.download<float>(), rmd) < tol);
  CHECK(rel_err(drv.download<float>(), rvd) < tol);
}

// Every variant this GPU can run for the problem.
std::vector<Variant> variants(const Problem& p) {
  std::vector<Variant> out;
  for (Variant v : {Variant::tiled, Variant::warpspec}) {
    try {
      default_config(p, Device::get(0), v);
      out.push_back(v);
    } catch (const InvalidArgument&) {
    }
  }
  return out;
}

}  // namespace

TEST_CASE("strict fp32 and tf32: eval, single-pass train, two-pass train") {
  primary_context(0);
  for (DType d : {DType::fp32, DType::tf32}) {
    for (auto [M, mode] : {std::pair{200, Mode::eval}, {100, Mode::train}, {1000, Mode::train}}) {
      Problem p;
      p.M = M, p.N = 96, p.K = 64, p.dtype = d, p.mode = mode;
      for (Variant v : variants(p)) check_problem(p, d == DType::fp32 ? 2e-5 : 2e-3, v);
    }
  }
}

TEST_CASE("a compiled kernel set is cached on disk and loads from there") {
  Problem p;
  p.M = 64, p.N = 64, p.K = 64, p.dtype = DType::tf32, p.mode = Mode::eval;
  const Device dev = Device::get(0);
  const KernelSource src = generate(p, default_config(p, dev, Variant::tiled));
  const CompiledKernel first = compile_cached(src, dev.arch());
  const CompiledKernel second = compile_cached(src, dev.arch());
  CHECK(second.cache_hit);
  CHECK(second.binary == first.binary);
}
