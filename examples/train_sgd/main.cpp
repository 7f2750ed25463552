// A host application training the layer: a few SGD steps of y = BatchNorm1d(scale * (x W^T + b))
// towards a synthetic regression target, loss = mean((y - target)^2) / 2. Each step runs the
// forward (train mode, saving what backward needs), takes dy = (y - target) / (M N) on the host,
// runs the backward (every gradient), and updates W, b, scale, gamma and beta. The same steps
// run on the CPU in float64; the program prints both losses per step and fails unless the loss
// falls and the two agree.
#include <fusejit/fusejit.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#define CHECK_CU(fn, ...) fusejit::check(FUSEJIT_DRIVER_FUNCTION(fn)(__VA_ARGS__), #fn)

namespace {

constexpr int M = 128, N = 64, K = 96, kSteps = 8;
constexpr double kLearningRate = 0.5;

struct DeviceArray {
  CUdeviceptr ptr = 0;
  std::size_t count = 0;
  explicit DeviceArray(std::size_t n) : count(n) { CHECK_CU(cuMemAlloc, &ptr, count * 4); }
  ~DeviceArray() { FUSEJIT_DRIVER_FUNCTION(cuMemFree)(ptr); }
  void put(const std::vector<double>& host) const {
    std::vector<float> f(host.begin(), host.end());
    CHECK_CU(cuMemcpyHtoD, ptr, f.data(), count * 4);
  }
  std::vector<double> get() const {
    std::vector<float> f(count);
    CHECK_CU(cuMemcpyDtoH, f.data(), ptr, count * 4);
    return {f.begin(), f.end()};
  }
  void* p() const { return reinterpret_cast<void*>(ptr); }
};

struct Params {
  std::vector<double> w, b, s, g, beta;
};
struct Grads {
  std::vector<double> w, b, s, g, beta;
};

// The layer's forward and backward on the CPU, in float64: the yardstick for fusejit's steps.
double cpu_step(const std::vector<double>& x, const std::vector<double>& target, Params& p) {
  std::vector<double> u(M * N), zh(M * N), y(M * N), dy(M * N);
  std::vector<double> mean(N), invstd(N);
  for (int n = 0; n < N; ++n) {
    for (int m = 0; m < M; ++m) {
      double a = p.b[n];
      for (int k = 0; k < K; ++k) a += x[m * K + k] * p.w[n * K + k];
      u[m * N + n] = a;
    }
    double mu = 0, var = 0;
    for (int m = 0; m < M; ++m) mu += p.s[n] * u[m * N + n];
    mu /= M;
    for (int m = 0; m < M; ++m) var += std::pow(p.s[n] * u[m * N + n] - mu, 2);
    var /= M;
    mean[n] = mu;
    invstd[n] = 1 / std::sqrt(var + 1e-5);
    for (int m = 0; m < M; ++m) {
      zh[m * N + n] = (p.s[n] * u[m * N + n] - mu) * invstd[n];
      y[m * N + n] = p.g[n] * zh[m * N + n] + p.beta[n];
    }
  }
  double loss = 0;
  for (int i = 0; i < M * N; ++i) {
    loss += 0.5 * std::pow(y[i] - target[i], 2) / (M * N);
    dy[i] = (y[i] - target[i]) / (M * N);
  }
  Grads gr{std::vector<double>(N * K), std::vector<double>(N), std::vector<double>(N),
           std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double dbeta = 0, dgamma = 0;
    for (int m = 0; m < M; ++m) {
      dbeta += dy[m * N + n];
      dgamma += dy[m * N + n] * zh[m * N + n];
    }
    gr.beta[n] = dbeta;
    gr.g[n] = dgamma;
    for (int m = 0; m < M; ++m) {
      const double dz =
          p.g[n] * invstd[n] / M * (M * dy[m * N + n] - dbeta - zh[m * N + n] * dgamma);
      const double da = p.s[n] * dz;
      gr.s[n] += dz * u[m * N + n];
      gr.b[n] += da;
      for (int k = 0; k < K; ++k) gr.w[n * K + k] += da * x[m * K + k];
    }
  }
  for (int i = 0; i < N * K; ++i) p.w[i] -= kLearningRate * gr.w[i];
  for (int n = 0; n < N; ++n) {
    p.b[n] -= kLearningRate * gr.b[n];
    p.s[n] -= kLearningRate * gr.s[n];
    p.g[n] -= kLearningRate * gr.g[n];
    p.beta[n] -= kLearningRate * gr.beta[n];
  }
  return loss;
}

}  // namespace

int main() {
  std::string why;
  if (!fusejit::driver_available(&why)) {
    std::printf(
        "train_sgd: no GPU here (%s).\nOn a GPU it would train a %dx%dx%d layer (fp32) for %d "
        "SGD steps with fusejit's forward and backward, beside the same steps on the CPU.\n",
        why.c_str(), M, N, K, kSteps);
    return 0;
  }
  try {
    std::mt19937 rng(7);
    std::normal_distribution<double> normal;
    auto random = [&](std::size_t n, double scale, double offset) {
      std::vector<double> v(n);
      for (auto& e : v) e = static_cast<float>(offset + scale * normal(rng));  // fp32 values
      return v;
    };
    // The target: a fixed random layer's output plus noise, so there is something to learn.
    const std::vector<double> x = random(std::size_t(M) * K, 1, 0);
    std::vector<double> target = random(std::size_t(M) * N, 1, 0);
    Params cpu{random(std::size_t(N) * K, 1 / std::sqrt(double(K)), 0), random(N, 0.1, 0),
               random(N, 0.2, 1), random(N, 0.1, 1), random(N, 0.1, 0)};
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double a = 0;
        for (int k = 0; k < 8; ++k) a += x[m * K + k];
        target[m * N + n] = 0.5 * target[m * N + n] + 0.3 * a * ((n % 3) - 1.0);
      }
    Params gpu = cpu;

    fusejit::Problem p;
    p.M = M, p.N = N, p.K = K, p.dtype = fusejit::DType::fp32, p.mode = fusejit::Mode::train;
    const fusejit::Plan forward(p);
    const fusejit::BackwardPlan backward(p);
    std::printf("forward %s; backward %s\n", forward.config().key().c_str(),
                backward.config_key().c_str());
    DeviceArray dx(x.size()), dw(gpu.w.size()), db(N), ds(N), dg(N), dbeta(N), drm(N), drv(N),
        y(std::size_t(M) * N), saved(std::size_t(M) * N), save_mean(N), save_invstd(N),
        dy(std::size_t(M) * N), gw(gpu.w.size()), gb(N), gs(N), gg(N), gbeta(N);
    dx.put(x);
    drm.put(std::vector<double>(N, 0.0));
    drv.put(std::vector<double>(N, 1.0));
    bool falling = true, agree = true;
    double first = 0, last = 0;
    for (int step = 0; step < kSteps; ++step) {
      dw.put(gpu.w), db.put(gpu.b), ds.put(gpu.s), dg.put(gpu.g), dbeta.put(gpu.beta);
      fusejit::Tensors t;
      t.x = dx.p(), t.w = dw.p(), t.y = y.p(), t.bias = db.p(), t.scale = ds.p();
      t.gamma = dg.p(), t.beta = dbeta.p(), t.running_mean = drm.p(), t.running_var = drv.p();
      t.save_mean = static_cast<float*>(save_mean.p());
      t.save_invstd = static_cast<float*>(save_invstd.p());
      t.saved = saved.p();
      forward.run(nullptr, t);
      const std::vector<double> yv = y.get();
      std::vector<double> g(yv.size());
      double loss = 0;
      for (std::size_t i = 0; i < yv.size(); ++i) {
        loss += 0.5 * (yv[i] - target[i]) * (yv[i] - target[i]) / (M * N);
        g[i] = (yv[i] - target[i]) / (M * N);
      }
      dy.put(g);
      fusejit::BackwardTensors bt;
      bt.dy = dy.p(), bt.x = dx.p(), bt.w = dw.p(), bt.saved = saved.p(), bt.scale = ds.p();
      bt.gamma = dg.p(), bt.save_mean = t.save_mean, bt.save_invstd = t.save_invstd;
      bt.dw = gw.p(), bt.dbias = gb.p(), bt.dscale = gs.p(), bt.dgamma = gg.p();
      bt.dbeta = gbeta.p();
      backward.run(nullptr, bt);
      auto sgd = [](std::vector<double>& v, const DeviceArray& grad) {
        const std::vector<double> d = grad.get();
        for (std::size_t i = 0; i < v.size(); ++i) v[i] -= kLearningRate * d[i];
      };
      sgd(gpu.w, gw), sgd(gpu.b, gb), sgd(gpu.s, gs), sgd(gpu.g, gg), sgd(gpu.beta, gbeta);
      const double cpu_loss = cpu_step(x, target, cpu);
      const double diff = std::abs(loss - cpu_loss) / cpu_loss;
      std::printf("step %d: loss %.6f (CPU float64 %.6f, relative difference %.1e)\n", step + 1,
                  loss, cpu_loss, diff);
      if (step == 0) first = loss;
      if (step > 0 && loss > last) falling = false;
      last = loss;
      agree &= diff < 1e-3;
    }
    double wdiff = 0, wnorm = 0;
    for (std::size_t i = 0; i < gpu.w.size(); ++i) {
      wdiff += std::pow(gpu.w[i] - cpu.w[i], 2);
      wnorm += cpu.w[i] * cpu.w[i];
    }
    std::printf("after %d steps: loss %.6f -> %.6f; W differs from the CPU's by %.1e (relative)\n",
                kSteps, first, last, std::sqrt(wdiff / wnorm));
    if (!falling || !agree || std::sqrt(wdiff / wnorm) > 1e-3) {
      std::printf("FAILED: the loss must fall every step and match the CPU steps\n");
      return 1;
    }
    std::printf("OK\n");
    return 0;
  } catch (const fusejit::Error& e) {
    std::fprintf(stderr, "train_sgd: %s\n", e.what());
    return 1;
  }
}
