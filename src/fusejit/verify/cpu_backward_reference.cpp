#include "fusejit/verify/cpu_backward_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "fusejit/error.hpp"

namespace fusejit {

namespace {

void require_present(bool wanted, const std::vector<double>& v, std::size_t n, const char* arg) {
  const std::size_t expected = wanted ? n : 0;
  if (v.size() != expected)
    throw InvalidArgument(arg, fmt::format("the problem {} it: expected {} elements; got {}",
                                           wanted ? "has" : "does not have", expected, v.size()));
}

void validate(const Problem& p, const ReferenceInputs& in, const std::vector<double>& dy) {
  if (p.M != in.M || p.N != in.N || p.K != in.K)
    throw InvalidArgument("in", fmt::format("inputs are {}x{}x{}; the problem is {}x{}x{}", in.M,
                                            in.N, in.K, p.M, p.N, p.K));
  if (in.M < 1 || in.N < 1 || in.K < 1)
    throw InvalidArgument("in", fmt::format("expected sizes >= 1; got {}x{}x{}", in.M, in.N, in.K));
  const bool train = p.mode == Mode::train;
  if (train && in.M < 2)
    throw InvalidArgument(
        "M", fmt::format("train mode needs more than 1 row per feature; got M={}", in.M));
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N),
             K = static_cast<std::size_t>(in.K);
  if (in.x.size() != M * K)
    throw InvalidArgument("x", fmt::format("expected {} elements; got {}", M * K, in.x.size()));
  if (in.w.size() != N * K)
    throw InvalidArgument("w", fmt::format("expected {} elements; got {}", N * K, in.w.size()));
  if (dy.size() != M * N)
    throw InvalidArgument("dy", fmt::format("expected {} elements; got {}", M * N, dy.size()));
  require_present(p.has_bias, in.bias, N, "bias");
  require_present(p.has_scale, in.scale, N, "scale");
  require_present(p.has_affine, in.gamma, N, "gamma");
  require_present(p.has_affine, in.beta, N, "beta");
  if (!train) {
    require_present(true, in.running_mean, N, "running_mean");
    require_present(true, in.running_var, N, "running_var");
  }
}

}  // namespace

BackwardReferenceOutputs backward_reference(const Problem& p, const ReferenceInputs& in,
                                            const std::vector<double>& dy) {
  validate(p, in, dy);
  const bool train = p.mode == Mode::train;
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N),
             K = static_cast<std::size_t>(in.K);
  const double Md = static_cast<double>(M);

  // a = x W^T, without bias or scale: both the saved tensor and dscale are stated in terms of it.
  std::vector<double> a(M * N, 0.0);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      double acc = 0;
      for (std::size_t k = 0; k < K; ++k) acc += in.x[m * K + k] * in.w[n * K + k];
      a[m * N + n] = acc;
    }

  BackwardReferenceOutputs out;
  out.saved.resize(M * N);
  out.dx.assign(M * K, 0.0);
  out.dw.assign(N * K, 0.0);
  out.dx_natural.assign(M * K, 0.0);
  out.dw_natural.assign(N * K, 0.0);
  std::vector<double> da(M * N), da_natural(M * N);
  std::vector<double> zh(M), dz(M);
  for (std::size_t n = 0; n < N; ++n) {
    const double b = p.has_bias ? in.bias[n] : 0.0;
    const double s = p.has_scale ? in.scale[n] : 1.0;
    const double g = p.has_affine ? in.gamma[n] : 1.0;

    double invstd;
    if (train) {
      // The statistics of z = s (a + b) as reference_forward computes them: two passes, biased.
      double mean_z = 0;
      for (std::size_t m = 0; m < M; ++m) mean_z += s * (a[m * N + n] + b);
      mean_z /= Md;
      double var = 0;
      for (std::size_t m = 0; m < M; ++m) {
        const double d = s * (a[m * N + n] + b) - mean_z;
        var += d * d;
      }
      var /= Md;
      invstd = 1.0 / std::sqrt(var + p.eps);
      // zh from the centred c, not from z - mean_z: the form the kernels use, and exact however
      // large the column mean is against its spread.
      double mean_a = 0;
      for (std::size_t m = 0; m < M; ++m) mean_a += a[m * N + n];
      mean_a /= Md;
      for (std::size_t m = 0; m < M; ++m) {
        const double c = a[m * N + n] - mean_a;
        out.saved[m * N + n] = c;
        zh[m] = s * invstd * c;
      }
    } else {
      invstd = 1.0 / std::sqrt(in.running_var[n] + p.eps);
      for (std::size_t m = 0; m < M; ++m) {
        const double u = a[m * N + n] + b;
        out.saved[m * N + n] = u;
        zh[m] = (s * u - in.running_mean[n]) * invstd;
      }
    }

    double dbeta = 0, dgamma = 0;
    for (std::size_t m = 0; m < M; ++m) {
      dbeta += dy[m * N + n];
      dgamma += dy[m * N + n] * zh[m];
    }
    // dz_natural: the magnitude of dz's terms. With M = 2 in train, zh = +-sqrt(var / (var + eps))
    // and dz is eps / var of its terms: every gradient downstream of it is measured against these.
    std::vector<double> dz_natural(M);
    for (std::size_t m = 0; m < M; ++m) {
      const double d = dy[m * N + n];
      dz[m] = train ? g * invstd / Md * (Md * d - dbeta - zh[m] * dgamma) : g * d * invstd;
      da[m * N + n] = s * dz[m];
      dz_natural[m] = train ? std::abs(g) * invstd / Md *
                                  (Md * std::abs(d) + std::abs(dbeta) + std::abs(zh[m] * dgamma))
                            : std::abs(dz[m]);
      const double terms = std::abs(s) * dz_natural[m];
      da_natural[m * N + n] = da[m * N + n] < 0 ? -terms : terms;
    }
    if (p.has_affine) {
      out.dgamma.push_back(dgamma);
      out.dbeta.push_back(dbeta);
    }
    if (p.has_bias) {
      double sum = 0, mag = 0;
      for (std::size_t m = 0; m < M; ++m) {
        sum += da[m * N + n];
        mag += std::abs(da_natural[m * N + n]);
      }
      out.dbias.push_back(sum);
      out.dbias_scale.push_back(mag);
    }
    if (p.has_scale) {
      // train: sum dz (a + b) = sum dz c + (mean_a + b) sum dz, and sum dz = 0 (the batch mean
      // absorbs any shift of z), so the centred form is the same gradient without the
      // cancellation against a large column mean. eval: saved is a + b itself.
      double sum = 0, mag = 0, terms = 0;
      for (std::size_t m = 0; m < M; ++m) {
        sum += dz[m] * out.saved[m * N + n];
        mag += dz_natural[m] * std::abs(out.saved[m * N + n]);
        terms += std::abs(dy[m * N + n] * out.saved[m * N + n]);
      }
      out.dscale.push_back(sum);
      // train: the kernels take the closed form g eps invstd^3 sum dy c (bn_backward_coef), whose
      // terms are its natural scale; eval: those of sum dz u.
      // (At least |dscale| itself: the closed form and the sum round differently.)
      out.dscale_scale.push_back(
          train ? std::max(std::abs(g) * p.eps * invstd * invstd * invstd * terms, std::abs(sum))
                : mag);
    }
  }

  // dx = da W ([M][N] x [N][K]), dW = da^T x ([N][M] x [M][K]).
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      const double d = da[m * N + n], dn = da_natural[m * N + n];
      for (std::size_t k = 0; k < K; ++k) {
        out.dx[m * K + k] += d * in.w[n * K + k];
        out.dw[n * K + k] += d * in.x[m * K + k];
        out.dx_natural[m * K + k] += dn * in.w[n * K + k];
        out.dw_natural[n * K + k] += dn * in.x[m * K + k];
      }
    }
  return out;
}

}  // namespace fusejit
