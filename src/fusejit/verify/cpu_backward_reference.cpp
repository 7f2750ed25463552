#include "fusejit/verify/cpu_backward_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fusejit/error.hpp"
#include "fusejit/verify/verification.hpp"

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

// 1 / sqrt(running_var + eps) per column: eval's invstd.
std::vector<double> eval_invstd(const Problem& p, const ReferenceInputs& in) {
  std::vector<double> invstd(static_cast<std::size_t>(in.N));
  for (std::size_t n = 0; n < invstd.size(); ++n)
    invstd[n] = 1.0 / std::sqrt(in.running_var[n] + p.eps);
  return invstd;
}

// Indices into [0, bound), as sizes; InvalidArgument(arg) for one outside.
std::vector<std::size_t> checked_indices(const std::vector<std::int64_t>& idx, std::int64_t bound,
                                         const char* arg) {
  std::vector<std::size_t> out;
  out.reserve(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] < 0 || idx[i] >= bound)
      throw InvalidArgument(
          arg, fmt::format("index {} at position {} is outside [0, {})", idx[i], i, bound));
    out.push_back(static_cast<std::size_t>(idx[i]));
  }
  return out;
}

std::vector<std::size_t> all_indices(std::int64_t count) {
  std::vector<std::size_t> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

// da and da_natural, [M][N] each: what the GEMM parts read.
struct ColumnOutputs {
  std::vector<double> da, da_natural;
};

// The column part of the backward, for every column n, from what the forward saved: `saved`
// ([M][N]: train c, eval u) and the column's invstd (train the batch one, eval from the running
// variance). Appends every parameter gradient and its scale to `out`, column by column.
ColumnOutputs column_backward(const Problem& p, const ReferenceInputs& in,
                              const std::vector<double>& dy, const std::vector<double>& saved,
                              const std::vector<double>& invstds, BackwardReferenceOutputs& out) {
  const bool train = p.mode == Mode::train;
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N);
  const double Md = static_cast<double>(M);
  ColumnOutputs r;
  r.da.resize(M * N);
  r.da_natural.resize(M * N);
  std::vector<double> zh(M), dz(M), dz_natural(M);
  for (std::size_t n = 0; n < N; ++n) {
    const double s = p.has_scale ? in.scale[n] : 1.0;
    const double g = p.has_affine ? in.gamma[n] : 1.0;
    const double invstd = invstds[n];
    // train: zh from the centred c, not from z - mean_z: the form the kernels use, and exact
    // however large the column mean is against its spread.
    for (std::size_t m = 0; m < M; ++m)
      zh[m] = train ? s * invstd * saved[m * N + n]
                    : (s * saved[m * N + n] - in.running_mean[n]) * invstd;

    double dbeta = 0, dgamma = 0;
    for (std::size_t m = 0; m < M; ++m) {
      dbeta += dy[m * N + n];
      dgamma += dy[m * N + n] * zh[m];
    }
    // dz_natural: the magnitude of dz's terms. With M = 2 in train, zh = +-sqrt(var / (var + eps))
    // and dz is eps / var of its terms: every gradient downstream of it is measured against these.
    for (std::size_t m = 0; m < M; ++m) {
      const double d = dy[m * N + n];
      dz[m] = train ? g * invstd / Md * (Md * d - dbeta - zh[m] * dgamma) : g * d * invstd;
      r.da[m * N + n] = s * dz[m];
      dz_natural[m] = train ? std::abs(g) * invstd / Md *
                                  (Md * std::abs(d) + std::abs(dbeta) + std::abs(zh[m] * dgamma))
                            : std::abs(dz[m]);
      const double terms = std::abs(s) * dz_natural[m];
      r.da_natural[m * N + n] = r.da[m * N + n] < 0 ? -terms : terms;
    }
    if (p.has_affine) {
      out.dgamma.push_back(dgamma);
      out.dbeta.push_back(dbeta);
    }
    if (p.has_bias) {
      double sum = 0, mag = 0;
      for (std::size_t m = 0; m < M; ++m) {
        sum += r.da[m * N + n];
        mag += std::abs(r.da_natural[m * N + n]);
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
        sum += dz[m] * saved[m * N + n];
        mag += dz_natural[m] * std::abs(saved[m * N + n]);
        terms += std::abs(dy[m * N + n] * saved[m * N + n]);
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
  return r;
}

// The GEMM parts at the asked-for indices: dx = da W ([M][N] x [N][K]) at the columns `cols` of
// K, packed [M][cols.size()]; dW = da^T x ([N][M] x [M][K]) at the rows `rows` of N, packed
// [rows.size()][K]; dx_natural and dw_natural likewise from da_natural. Each element sums its
// terms in index order (n for dx, m for dW), whatever the subset.
void gemm_backward(const ReferenceInputs& in, const ColumnOutputs& col,
                   const std::vector<std::size_t>& cols, const std::vector<std::size_t>& rows,
                   BackwardReferenceOutputs& out) {
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N),
             K = static_cast<std::size_t>(in.K);
  const std::size_t C = cols.size(), R = rows.size();
  // W's asked-for columns, [N][C], so that the inner loops run over contiguous memory.
  std::vector<double> wc(N * C);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t j = 0; j < C; ++j) wc[n * C + j] = in.w[n * K + cols[j]];
  out.dx.assign(M * C, 0.0);
  out.dx_natural.assign(M * C, 0.0);
  out.dw.assign(R * K, 0.0);
  out.dw_natural.assign(R * K, 0.0);
  for (std::size_t m = 0; m < M; ++m) {
    for (std::size_t n = 0; n < N; ++n) {
      const double d = col.da[m * N + n], dn = col.da_natural[m * N + n];
      for (std::size_t j = 0; j < C; ++j) {
        out.dx[m * C + j] += d * wc[n * C + j];
        out.dx_natural[m * C + j] += dn * wc[n * C + j];
      }
    }
    for (std::size_t i = 0; i < R; ++i) {
      const double d = col.da[m * N + rows[i]], dn = col.da_natural[m * N + rows[i]];
      for (std::size_t k = 0; k < K; ++k) {
        out.dw[i * K + k] += d * in.x[m * K + k];
        out.dw_natural[i * K + k] += dn * in.x[m * K + k];
      }
    }
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

  // The forward's saved tensor and invstd, as the GPU's forward leaves them for the backward.
  BackwardReferenceOutputs out;
  out.saved.resize(M * N);
  std::vector<double> invstd = train ? std::vector<double>(N) : eval_invstd(p, in);
  for (std::size_t n = 0; n < N; ++n) {
    const double b = p.has_bias ? in.bias[n] : 0.0;
    if (train) {
      const double s = p.has_scale ? in.scale[n] : 1.0;
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
      invstd[n] = 1.0 / std::sqrt(var + p.eps);
      double mean_a = 0;
      for (std::size_t m = 0; m < M; ++m) mean_a += a[m * N + n];
      mean_a /= Md;
      for (std::size_t m = 0; m < M; ++m) out.saved[m * N + n] = a[m * N + n] - mean_a;
    } else {
      for (std::size_t m = 0; m < M; ++m) out.saved[m * N + n] = a[m * N + n] + b;
    }
  }

  const ColumnOutputs col = column_backward(p, in, dy, out.saved, invstd, out);
  gemm_backward(in, col, all_indices(in.K), all_indices(in.N), out);
  return out;
}

BackwardReferenceOutputs backward_reference_from_saved(const Problem& p, const ReferenceInputs& in,
                                                       const std::vector<double>& dy,
                                                       const SavedForward& f,
                                                       const std::vector<std::int64_t>& dx_cols,
                                                       const std::vector<std::int64_t>& dw_rows) {
  validate(p, in, dy);
  const bool train = p.mode == Mode::train;
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N);
  if (f.saved.size() != M * N)
    throw InvalidArgument(
        "saved", fmt::format("expected {} elements ([M][N]); got {}", M * N, f.saved.size()));
  if (train && f.save_invstd.size() != N)
    throw InvalidArgument("save_invstd", fmt::format("train mode reads the batch invstd: expected "
                                                     "{} elements; got {}",
                                                     N, f.save_invstd.size()));
  if (!train && !f.save_invstd.empty())
    throw InvalidArgument("save_invstd",
                          fmt::format("eval mode normalizes with running_var: expected no "
                                      "elements; got {}",
                                      f.save_invstd.size()));
  const std::vector<std::size_t> cols = checked_indices(dx_cols, in.K, "dx_cols");
  const std::vector<std::size_t> rows = checked_indices(dw_rows, in.N, "dw_rows");

  BackwardReferenceOutputs out;
  const ColumnOutputs col =
      column_backward(p, in, dy, f.saved, train ? f.save_invstd : eval_invstd(p, in), out);
  gemm_backward(in, col, cols, rows, out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison

double gradient_error(const std::vector<double>& got, const std::vector<double>& ref,
                      const std::vector<double>& natural) {
  double n_ref = 0, n_nat = 0;
  for (double v : ref) n_ref += v * v;
  for (double v : natural) n_nat += v * v;
  const double rel = relative_error(got, ref);
  return n_nat > n_ref && n_ref > 0 ? rel * std::sqrt(n_ref / n_nat) : rel;
}

double BackwardErrors::worst() const {
  return std::max({saved, dx, dw, dbias, dscale, dgamma, dbeta});
}

BackwardErrors compare_gradients(const BackwardReferenceOutputs& ref,
                                 const BackwardGradients& got) {
  auto finite_or_inf = [](double e) { return std::isfinite(e) ? e : INFINITY; };
  BackwardErrors e;
  if (!got.saved.empty()) e.saved = finite_or_inf(relative_error(got.saved, ref.saved));
  if (!got.dx.empty()) e.dx = finite_or_inf(gradient_error(got.dx, ref.dx, ref.dx_natural));
  if (!got.dw.empty()) e.dw = finite_or_inf(gradient_error(got.dw, ref.dw, ref.dw_natural));
  if (!got.dbias.empty())
    e.dbias = finite_or_inf(scaled_error(got.dbias, ref.dbias, ref.dbias_scale));
  if (!got.dscale.empty())
    e.dscale = finite_or_inf(scaled_error(got.dscale, ref.dscale, ref.dscale_scale));
  if (!got.dgamma.empty()) e.dgamma = finite_or_inf(relative_error(got.dgamma, ref.dgamma));
  if (!got.dbeta.empty()) e.dbeta = finite_or_inf(relative_error(got.dbeta, ref.dbeta));
  return e;
}

bool passes(const BackwardErrors& e, double threshold, std::string* why) {
  std::string w;
  auto figure = [&](double v, const char* name) {
    if (!(v < threshold))
      w += fmt::format("{}{} error {:.3g} >= {:.3g}", w.empty() ? "" : "; ", name, v, threshold);
  };
  figure(e.saved, "saved");
  figure(e.dx, "dx");
  figure(e.dw, "dw");
  figure(e.dbias, "dbias");
  figure(e.dscale, "dscale");
  figure(e.dgamma, "dgamma");
  figure(e.dbeta, "dbeta");
  if (why) *why = w;
  return w.empty();
}

}  // namespace fusejit
