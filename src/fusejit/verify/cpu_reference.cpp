#include "fusejit/verify/cpu_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <thread>

#include "fusejit/error.hpp"

namespace fusejit {

namespace {

// Output tiles of kTileM x kTileN are independent tasks; K is walked in chunks of kChunkK so a
// tile's rows of x and W (2 x 64 x 256 doubles) stay in L2 across the tile's micro-kernels.
constexpr std::int64_t kTileM = 64, kTileN = 64, kChunkK = 256;

// acc[i][j] += sum_k x[i][k] * w[j][k] over one K chunk, 4 x 4 at a time: 16 independent
// accumulators keep the FP pipes busy without relying on the compiler to reassociate sums.
void tile_chunk(const double* x, const double* w, std::int64_t K, std::int64_t k0, std::int64_t kc,
                std::int64_t mr, std::int64_t nr, double* acc) {
  std::int64_t i = 0;
  for (; i + 4 <= mr; i += 4) {
    const double* x0 = x + (i + 0) * K + k0;
    const double* x1 = x + (i + 1) * K + k0;
    const double* x2 = x + (i + 2) * K + k0;
    const double* x3 = x + (i + 3) * K + k0;
    std::int64_t j = 0;
    for (; j + 4 <= nr; j += 4) {
      const double* w0 = w + (j + 0) * K + k0;
      const double* w1 = w + (j + 1) * K + k0;
      const double* w2 = w + (j + 2) * K + k0;
      const double* w3 = w + (j + 3) * K + k0;
      double c[4][4] = {};
      for (std::int64_t k = 0; k < kc; ++k) {
        const double a[4] = {x0[k], x1[k], x2[k], x3[k]};
        const double b[4] = {w0[k], w1[k], w2[k], w3[k]};
        for (int r = 0; r < 4; ++r)
          for (int s = 0; s < 4; ++s) c[r][s] += a[r] * b[s];
      }
      for (int r = 0; r < 4; ++r)
        for (int s = 0; s < 4; ++s) acc[(i + r) * kTileN + j + s] += c[r][s];
    }
    for (; j < nr; ++j) {
      const double* wj = w + j * K + k0;
      double c[4] = {};
      for (std::int64_t k = 0; k < kc; ++k) {
        c[0] += x0[k] * wj[k];
        c[1] += x1[k] * wj[k];
        c[2] += x2[k] * wj[k];
        c[3] += x3[k] * wj[k];
      }
      for (int r = 0; r < 4; ++r) acc[(i + r) * kTileN + j] += c[r];
    }
  }
  for (; i < mr; ++i) {
    const double* xi = x + i * K + k0;
    for (std::int64_t j = 0; j < nr; ++j) {
      const double* wj = w + j * K + k0;
      double c = 0;
      for (std::int64_t k = 0; k < kc; ++k) c += xi[k] * wj[k];
      acc[i * kTileN + j] += c;
    }
  }
}

void require_size(const std::vector<double>& v, std::size_t n, const char* arg, bool optional) {
  if (optional && v.empty()) return;
  if (v.size() != n)
    throw InvalidArgument(arg, fmt::format("expected {} elements; got {}", n, v.size()));
}

void validate(const ReferenceInputs& in) {
  if (in.M < 1) throw InvalidArgument("M", fmt::format("expected M >= 1; got {}", in.M));
  if (in.N < 1) throw InvalidArgument("N", fmt::format("expected N >= 1; got {}", in.N));
  if (in.K < 1) throw InvalidArgument("K", fmt::format("expected K >= 1; got {}", in.K));
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N),
             K = static_cast<std::size_t>(in.K);
  require_size(in.x, M * K, "x", false);
  require_size(in.w, N * K, "w", false);
  require_size(in.bias, N, "bias", true);
  require_size(in.scale, N, "scale", true);
  require_size(in.gamma, N, "gamma", true);
  require_size(in.beta, N, "beta", true);
  require_size(in.running_mean, N, "running_mean", true);
  require_size(in.running_var, N, "running_var", true);
  if (in.running_mean.empty() != in.running_var.empty())
    throw InvalidArgument(in.running_mean.empty() ? "running_mean" : "running_var",
                          "running_mean and running_var go together (both or neither)");
}

}  // namespace

ReferenceSettings reference_settings(const Problem& p, std::int64_t num_batches_tracked) {
  ReferenceSettings s;
  s.mode = p.mode;
  s.eps = p.eps;
  s.momentum = p.momentum;
  s.num_batches_tracked = num_batches_tracked;
  return s;
}

std::vector<double> reference_linear(const ReferenceInputs& in, unsigned threads) {
  validate(in);
  const std::int64_t M = in.M, N = in.N, K = in.K;
  const std::int64_t tiles_m = (M + kTileM - 1) / kTileM, tiles_n = (N + kTileN - 1) / kTileN;
  const std::int64_t tasks = tiles_m * tiles_n;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const auto workers = static_cast<unsigned>(std::min<std::int64_t>(threads, tasks));
  std::vector<double> z(static_cast<std::size_t>(M * N));
  std::vector<std::vector<double>> scratch(workers, std::vector<double>(kTileM * kTileN));
  std::atomic<std::int64_t> next{0};
  auto work = [&](unsigned id) {
    double* acc = scratch[id].data();
    for (std::int64_t t = next++; t < tasks; t = next++) {
      const std::int64_t m0 = t / tiles_n * kTileM, n0 = t % tiles_n * kTileN;
      const std::int64_t mr = std::min(kTileM, M - m0), nr = std::min(kTileN, N - n0);
      std::fill(acc, acc + kTileM * kTileN, 0.0);
      for (std::int64_t k0 = 0; k0 < K; k0 += kChunkK)
        tile_chunk(in.x.data() + m0 * K, in.w.data() + n0 * K, K, k0, std::min(kChunkK, K - k0), mr,
                   nr, acc);
      for (std::int64_t i = 0; i < mr; ++i) {
        for (std::int64_t j = 0; j < nr; ++j) {
          const auto n = static_cast<std::size_t>(n0 + j);
          double v = acc[i * kTileN + j];
          if (!in.bias.empty()) v += in.bias[n];
          if (!in.scale.empty()) v *= in.scale[n];
          z[static_cast<std::size_t>((m0 + i) * N) + n] = v;
        }
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers > 0 ? workers - 1 : 0);
  for (unsigned id = 1; id < workers; ++id) pool.emplace_back(work, id);
  work(0);
  for (auto& th : pool) th.join();
  return z;
}

ReferenceOutputs reference_forward(const ReferenceInputs& in, const ReferenceSettings& s) {
  validate(in);
  const bool train = s.mode == Mode::train;
  if (train && in.M < 2)
    throw InvalidArgument(
        "M", fmt::format("train mode needs more than 1 row per feature; got M={}", in.M));
  if (!train && in.running_mean.empty())
    throw InvalidArgument("running_mean", "eval mode normalizes with the running stats");
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N);
  const std::vector<double> z = reference_linear(in, s.threads);

  ReferenceOutputs out;
  out.num_batches_tracked = s.num_batches_tracked;
  std::vector<double> mean(N, 0.0), var(N, 0.0);
  if (train) {
    // Two passes (mean, then squared deviations): exact enough in float64 even when a
    // column's mean dwarfs its spread.
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t n = 0; n < N; ++n) mean[n] += z[m * N + n];
    for (std::size_t n = 0; n < N; ++n) mean[n] /= static_cast<double>(M);
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t n = 0; n < N; ++n) {
        const double d = z[m * N + n] - mean[n];
        var[n] += d * d;
      }
    for (std::size_t n = 0; n < N; ++n) var[n] /= static_cast<double>(M);  // biased
    const double factor =
        s.momentum ? *s.momentum : 1.0 / static_cast<double>(s.num_batches_tracked + 1);
    if (!in.running_mean.empty()) {
      out.running_mean.resize(N);
      out.running_var.resize(N);
      const double unbias = static_cast<double>(M) / static_cast<double>(M - 1);
      for (std::size_t n = 0; n < N; ++n) {
        out.running_mean[n] = (1 - factor) * in.running_mean[n] + factor * mean[n];
        out.running_var[n] = (1 - factor) * in.running_var[n] + factor * var[n] * unbias;
      }
    }
    out.num_batches_tracked = s.num_batches_tracked + 1;
  } else {
    mean = in.running_mean;
    var = in.running_var;
    out.running_mean = in.running_mean;
    out.running_var = in.running_var;
  }
  out.save_mean = mean;
  out.save_invstd.resize(N);
  for (std::size_t n = 0; n < N; ++n) out.save_invstd[n] = 1.0 / std::sqrt(var[n] + s.eps);
  out.y.resize(M * N);
  for (std::size_t m = 0; m < M; ++m) {
    for (std::size_t n = 0; n < N; ++n) {
      double v = (z[m * N + n] - mean[n]) * out.save_invstd[n];
      if (!in.gamma.empty()) v *= in.gamma[n];
      if (!in.beta.empty()) v += in.beta[n];
      out.y[m * N + n] = v;
    }
  }
  return out;
}

}  // namespace fusejit
