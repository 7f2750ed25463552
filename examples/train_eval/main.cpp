// A host application using fusejit as a layer would: a few training steps (batch statistics,
// running stats updated in place), then inference with the running stats. It checks the
// running stats against a CPU computation and prints what it did.
#include <fusejit/fusejit.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// The driver through fusejit, which loads it at run time: this program starts on machines
// without one and says so (below) instead of failing to load.
#define CHECK_CU(fn, ...) fusejit::check(FUSEJIT_DRIVER_FUNCTION(fn)(__VA_ARGS__), #fn)

namespace {

struct DeviceArray {
  CUdeviceptr ptr = 0;
  std::size_t count = 0;
  explicit DeviceArray(const std::vector<float>& host) : count(host.size()) {
    CHECK_CU(cuMemAlloc, &ptr, count * 4);
    CHECK_CU(cuMemcpyHtoD, ptr, host.data(), count * 4);
  }
  ~DeviceArray() { FUSEJIT_DRIVER_FUNCTION(cuMemFree)(ptr); }
  std::vector<float> get() const {
    std::vector<float> v(count);
    CHECK_CU(cuMemcpyDtoH, v.data(), ptr, count * 4);
    return v;
  }
  void* p() const { return reinterpret_cast<void*>(ptr); }
};

}  // namespace

int main() {
  const int M = 256, N = 512, K = 1024, steps = 3;
  std::string why;
  if (!fusejit::driver_available(&why)) {
    std::printf(
        "train_eval: no GPU here (%s).\nOn a GPU it would run %d training steps of "
        "y = BatchNorm1d(scale * (x W^T + b)) for a %dx%dx%d layer (fp32), check the running "
        "stats against a CPU computation, then run inference with them.\n",
        why.c_str(), steps, M, N, K);
    return 0;
  }
  try {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal;
    auto random = [&](std::size_t n, float s, float o) {
      std::vector<float> v(n);
      for (auto& x : v) x = o + s * normal(rng);
      return v;
    };
    std::vector<float> w = random(std::size_t(N) * K, 1.f / std::sqrt(float(K)), 0),
                       b = random(N, 0.1f, 0), scale = random(N, 0.2f, 1),
                       gamma = random(N, 0.1f, 1), beta = random(N, 0.1f, 0);
    std::vector<float> rm(N, 0.f), rv(N, 1.f);
    DeviceArray dw(w), db(b), ds(scale), dg(gamma), dbeta(beta), drm(rm), drv(rv),
        dy(std::vector<float>(std::size_t(M) * N));

    fusejit::Problem train;
    train.M = M, train.N = N, train.K = K, train.dtype = fusejit::DType::fp32;
    train.mode = fusejit::Mode::train;
    fusejit::Plan train_plan(train);
    std::printf("train plan: %s (%s)\n", train_plan.config().key().c_str(),
                train_plan.cache_hit() ? "from cache" : "compiled");
    std::vector<double> ref_rm(rm.begin(), rm.end()), ref_rv(rv.begin(), rv.end());
    for (int step = 0; step < steps; ++step) {
      std::vector<float> x = random(std::size_t(M) * K, 1, 0.5f);
      DeviceArray dx(x);
      fusejit::Tensors t;
      t.x = dx.p(), t.w = dw.p(), t.y = dy.p(), t.bias = db.p(), t.scale = ds.p();
      t.gamma = dg.p(), t.beta = dbeta.p(), t.running_mean = drm.p(), t.running_var = drv.p();
      train_plan.run(nullptr, t);
      // The same running-stat update on the CPU, in float64.
      for (int n = 0; n < N; ++n) {
        double mean = 0, m2 = 0;
        std::vector<double> z(M);
        for (int m = 0; m < M; ++m) {
          double a = 0;
          for (int k = 0; k < K; ++k)
            a += double(x[std::size_t(m) * K + k]) * w[std::size_t(n) * K + k];
          z[m] = (a + b[n]) * scale[n];
          mean += z[m];
        }
        mean /= M;
        for (int m = 0; m < M; ++m) m2 += (z[m] - mean) * (z[m] - mean);
        ref_rm[n] = 0.9 * ref_rm[n] + 0.1 * mean;
        ref_rv[n] = 0.9 * ref_rv[n] + 0.1 * m2 / (M - 1);
      }
      CHECK_CU(cuCtxSynchronize);
      std::printf("train step %d done\n", step + 1);
    }
    double worst = 0;
    const auto got_rm = drm.get(), got_rv = drv.get();
    for (int n = 0; n < N; ++n) {
      worst = std::max(worst, std::abs(got_rm[n] - ref_rm[n]) / (std::abs(ref_rm[n]) + 1e-3));
      worst = std::max(worst, std::abs(got_rv[n] - ref_rv[n]) / ref_rv[n]);
    }
    std::printf("running stats after %d steps: worst relative difference to CPU %.2e\n", steps,
                worst);

    fusejit::Problem eval = train;
    eval.mode = fusejit::Mode::eval;
    fusejit::Plan eval_plan(eval);
    DeviceArray dx(random(std::size_t(M) * K, 1, 0.5f));
    fusejit::Tensors t;
    t.x = dx.p(), t.w = dw.p(), t.y = dy.p(), t.bias = db.p(), t.scale = ds.p();
    t.gamma = dg.p(), t.beta = dbeta.p(), t.running_mean = drm.p(), t.running_var = drv.p();
    eval_plan.run(nullptr, t);
    CHECK_CU(cuCtxSynchronize);
    const auto y = dy.get();
    double sum = 0;
    for (float v : y) sum += v;
    std::printf("eval plan: %s; mean of y over %dx%d outputs: %.4f\n",
                eval_plan.config().key().c_str(), M, N, sum / double(y.size()));
    if (worst > 1e-4) {
      std::printf("FAILED: running stats differ from the CPU computation\n");
      return 1;
    }
    std::printf("OK\n");
    return 0;
  } catch (const fusejit::Error& e) {
    std::fprintf(stderr, "train_eval: %s\n", e.what());
    return 1;
  }
}
