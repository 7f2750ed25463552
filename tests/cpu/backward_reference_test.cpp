// The float64 backward reference (verify/cpu_backward_reference): every gradient agrees with
// central finite differences of L = sum(y * G) taken through the float64 forward reference, in
// both modes and with every parameter present or absent; degenerate columns (gamma = 0,
// scale = 0) and columns whose mean dwarfs their spread; the `saved` tensor is what it claims.
// backward_reference_from_saved (the gradients from what the forward saved, at index subsets)
// agrees with it, and compare_gradients / passes measure and judge gradients against it.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/error.hpp"
#include "fusejit/verify/cpu_backward_reference.hpp"
#include "fusejit/verify/cpu_reference.hpp"

using namespace fusejit;

namespace {

std::vector<double> uniform(std::size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Values in [lo, hi] with a random sign: no parameter is near 0 unless a test puts it there.
std::vector<double> signed_uniform(std::size_t n, std::mt19937_64& rng, double lo, double hi) {
  auto v = uniform(n, rng, lo, hi);
  std::bernoulli_distribution flip(0.5);
  for (auto& x : v)
    if (flip(rng)) x = -x;
  return v;
}

struct Case {
  Problem p;
  ReferenceInputs in;
  std::vector<double> G;  // dL/dy, [M][N]
};

Case make_case(std::int64_t M, std::int64_t N, std::int64_t K, Mode mode, bool bias, bool scale,
               bool affine, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Case c;
  c.p.M = M, c.p.N = N, c.p.K = K;
  c.p.mode = mode;
  c.p.has_bias = bias, c.p.has_scale = scale, c.p.has_affine = affine;
  c.in.M = M, c.in.N = N, c.in.K = K;
  const auto m = static_cast<std::size_t>(M), n = static_cast<std::size_t>(N),
             k = static_cast<std::size_t>(K);
  c.in.x = uniform(m * k, rng, 0.0, 1.0);  // non-centred, as KernelBench draws it
  c.in.w = uniform(n * k, rng, -1.0, 1.0);
  if (bias) c.in.bias = uniform(n, rng, -1.0, 1.0);
  if (scale) c.in.scale = signed_uniform(n, rng, 0.5, 2.0);
  if (affine) {
    c.in.gamma = signed_uniform(n, rng, 0.5, 1.5);
    c.in.beta = uniform(n, rng, -1.0, 1.0);
  }
  // Train ignores them for y; eval normalizes with them.
  c.in.running_mean = uniform(n, rng, -1.0, 1.0);
  c.in.running_var = uniform(n, rng, 0.5, 1.5);
  c.G = uniform(m * n, rng, -1.0, 1.0);
  return c;
}

double loss(const Case& c, const ReferenceInputs& in) {
  ReferenceSettings s = reference_settings(c.p);
  s.threads = 1;
  const auto y = reference_forward(in, s).y;
  double L = 0;
  for (std::size_t i = 0; i < y.size(); ++i) L += y[i] * c.G[i];
  return L;
}

// dL/d(in.*field)[i] for every i, by the fourth-order central stencil
//   (8 (L(v+h) - L(v-h)) - (L(v+2h) - L(v-2h))) / (12 h).
// Why not the two-point one: its truncation error h^2 L''' forces a step near 1e-6 and then
// rounding in L (~1e-16 |L| / h) caps the agreement near 1e-8..1e-6, too loose to tell a
// reference that is right from one that gets an O(eps / var) term wrong. h = 2^-14 balances
// the four-point stencil's truncation (h^4 L^(5); measured: 8e-6 at h = 2^-10, 1e-10 at
// 2^-14) against rounding in L (~1e-16 |L| / h; it dominates below 2^-15, most where x ~ 1000
// puts ulp(z) near 1e-12). h is absolute, not relative to v, because what sets L's curvature is
// each column's spread, which is O(1) in every test even where a column's mean is 1000s; being
// a power of two, v +- h is exact for |v| in [2, 1024) and within 2^-38 h elsewhere.
std::vector<double> finite_differences(const Case& c, std::vector<double> ReferenceInputs::*field,
                                       double h = 0x1p-14) {
  ReferenceInputs in = c.in;
  std::vector<double>& v = in.*field;
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double v0 = v[i];
    auto at = [&](double t) {
      v[i] = v0 + t * h;
      const double L = loss(c, in);
      v[i] = v0;
      return L;
    };
    out[i] = (8 * (at(1) - at(-1)) - (at(2) - at(-2))) / (12 * h);
  }
  return out;
}

// a = x W^T, written out here independently of both references.
std::vector<double> linear(const ReferenceInputs& in) {
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N),
             K = static_cast<std::size_t>(in.K);
  std::vector<double> a(M * N, 0.0);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t k = 0; k < K; ++k) a[m * N + n] += in.x[m * K + k] * in.w[n * K + k];
  return a;
}

// The natural scale of every gradient: the sum of |terms| it is made of, with every cancelling
// sum of the BatchNorm backward replaced by its sum of magnitudes, built here from the forward
// reference's statistics (not from the code under test). Errors are measured against it, not
// against the gradient's value, because BatchNorm makes some gradients nearly vanish by
// cancellation: dbias (exactly 0 in train), dscale (train: y depends on the scale only through
// eps, so dscale ~ eps / var of its terms), and dx, dW for M = 2 in train (zh = +-1 up to eps).
// Finite differences resolve a gradient only to ~1e-16 |L| / h absolute, i.e. relative to this
// scale, not to a value that cancellation made 1e-5 of it; and a kernel's rounding is relative
// to it too. A wrong or missing term still shows: it moves the gradient by a fraction of its
// terms, or (for the eps-sized gradients) by a fraction of the value, >= 1e-5 of the scale.
struct Scales {
  std::vector<double> dx, dw, dbias, dscale, dgamma, dbeta;
};

Scales natural_scales(const Case& c) {
  const auto M = static_cast<std::size_t>(c.in.M), N = static_cast<std::size_t>(c.in.N),
             K = static_cast<std::size_t>(c.in.K);
  const bool train = c.p.mode == Mode::train;
  const auto fwd = reference_forward(c.in, reference_settings(c.p));
  const auto a = linear(c.in);
  // |dz| and |da| bounds per element: train dz = g invstd / M (M dy - dbeta - zh dgamma).
  std::vector<double> tz(M * N), ta(M * N);
  Scales sc;
  sc.dbias.assign(N, 0.0), sc.dscale.assign(N, 0.0), sc.dgamma.assign(N, 0.0);
  sc.dbeta.assign(N, 0.0);
  for (std::size_t n = 0; n < N; ++n) {
    const double b = c.p.has_bias ? c.in.bias[n] : 0.0;
    const double s = c.p.has_scale ? c.in.scale[n] : 1.0;
    const double g = c.p.has_affine ? c.in.gamma[n] : 1.0;
    const double invstd = fwd.save_invstd[n];
    double mean_a = 0;
    for (std::size_t m = 0; m < M; ++m) mean_a += a[m * N + n] / static_cast<double>(M);
    std::vector<double> zh(M);
    for (std::size_t m = 0; m < M; ++m) {
      zh[m] = (s * (a[m * N + n] + b) - fwd.save_mean[n]) * invstd;
      sc.dbeta[n] += std::abs(c.G[m * N + n]);
      sc.dgamma[n] += std::abs(c.G[m * N + n] * zh[m]);
    }
    for (std::size_t m = 0; m < M; ++m) {
      const double dy = std::abs(c.G[m * N + n]);
      const double t = std::abs(g * invstd) *
                       (train ? dy + (sc.dbeta[n] + std::abs(zh[m]) * sc.dgamma[n]) / M : dy);
      tz[m * N + n] = t;
      ta[m * N + n] = std::abs(s) * t;
      sc.dbias[n] += ta[m * N + n];
      // dscale = sum dz (a + b); in train = sum dz (a - mean_a) since sum dz = 0.
      sc.dscale[n] += t * std::abs(train ? a[m * N + n] - mean_a : a[m * N + n] + b);
    }
  }
  // dx = da W; dW = da^T x, in train = da^T (x - column mean of x) since sum_m da = 0 (so
  // x's offset of 1000 in the large-means test does not inflate the scale).
  std::vector<double> xc = c.in.x;
  if (train)
    for (std::size_t k = 0; k < K; ++k) {
      double mean = 0;
      for (std::size_t m = 0; m < M; ++m) mean += c.in.x[m * K + k] / static_cast<double>(M);
      for (std::size_t m = 0; m < M; ++m) xc[m * K + k] -= mean;
    }
  sc.dx.assign(M * K, 0.0), sc.dw.assign(N * K, 0.0);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t k = 0; k < K; ++k) {
        sc.dx[m * K + k] += ta[m * N + n] * std::abs(c.in.w[n * K + k]);
        sc.dw[n * K + k] += ta[m * N + n] * std::abs(xc[m * K + k]);
      }
  return sc;
}

// max |got - want| over the largest natural scale of the tensor (see Scales). Normwise, as one
// entry's own scale can be small by chance (a small weight) while FD noise is not.
double scaled_error(const std::vector<double>& got, const std::vector<double>& want,
                    const std::vector<double>& scale) {
  REQUIRE(got.size() == want.size());
  REQUIRE(scale.size() == want.size());
  double diff = 0, mag = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    mag = std::max(mag, scale[i]);
  }
  REQUIRE(mag > 0);
  return diff / mag;
}

// Plain normwise relative error, max |got - want| over max |want|: for values that are O(1) by
// construction (saved, zh).
double normwise_error(const std::vector<double>& got, const std::vector<double>& want) {
  return scaled_error(got, want, [&] {
    std::vector<double> m(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) m[i] = std::abs(want[i]);
    return m;
  }());
}

// Measured against the natural scales, the worst error over all the cases in this file is
// 1.6e-9 (dx with x ~ 1000 in eval: the forward's own rounding at ulp(4000) read through the
// 1 / h of the stencil), 1.3e-10 for the ordinary inputs. 1e-8 leaves a margin of 6 over that
// and is still 1000 times below the smallest real term of these gradients (eps / var ~ 1e-5 of
// the scale, the whole of dx for M = 2 in train mode).
constexpr double kTolerance = 1e-8;

struct Errors {
  double dx = 0, dw = 0, dbias = 0, dscale = 0, dgamma = 0, dbeta = 0;
};

// Compares every gradient of `c` with finite differences and returns the errors it measured.
// `scale_step`: the finite-difference step for scale (see the scale = 0 test).
Errors check_against_fd(const Case& c, double scale_step = 0x1p-14) {
  const auto ref = backward_reference(c.p, c.in, c.G);
  const auto sc = natural_scales(c);
  const bool train = c.p.mode == Mode::train;
  Errors e;
  e.dx = scaled_error(ref.dx, finite_differences(c, &ReferenceInputs::x), sc.dx);
  e.dw = scaled_error(ref.dw, finite_differences(c, &ReferenceInputs::w), sc.dw);
  CHECK(e.dx < kTolerance);
  CHECK(e.dw < kTolerance);
  if (c.p.has_bias) {
    e.dbias = scaled_error(ref.dbias, finite_differences(c, &ReferenceInputs::bias), sc.dbias);
    CHECK(e.dbias < kTolerance);
    // Exactly 0 in train, up to rounding: sum zh = 0 only as far as c = a - mean_a is exact,
    // ~ulp(|a|) / spread, 1e-14 of the scale where |a| ~ 4000. And the scale it reports is the
    // sum of |da|, which the test's bound majorizes term by term.
    if (train)
      CHECK(scaled_error(ref.dbias, std::vector<double>(ref.dbias.size()), sc.dbias) < 1e-13);
    REQUIRE(ref.dbias_scale.size() == ref.dbias.size());
    for (std::size_t n = 0; n < ref.dbias.size(); ++n) {
      CHECK(ref.dbias_scale[n] >= std::abs(ref.dbias[n]));
      CHECK(ref.dbias_scale[n] <= sc.dbias[n] * (1 + 1e-12));
    }
  } else {
    CHECK(ref.dbias.empty());
    CHECK(ref.dbias_scale.empty());
  }
  if (c.p.has_scale) {
    e.dscale = scaled_error(ref.dscale, finite_differences(c, &ReferenceInputs::scale, scale_step),
                            sc.dscale);
    CHECK(e.dscale < kTolerance);
    REQUIRE(ref.dscale_scale.size() == ref.dscale.size());
    for (std::size_t n = 0; n < ref.dscale.size(); ++n) {
      CHECK(ref.dscale_scale[n] >= std::abs(ref.dscale[n]));
      CHECK(ref.dscale_scale[n] <= sc.dscale[n] * (1 + 1e-12));
    }
  } else {
    CHECK(ref.dscale.empty());
    CHECK(ref.dscale_scale.empty());
  }
  if (c.p.has_affine) {
    e.dgamma = scaled_error(ref.dgamma, finite_differences(c, &ReferenceInputs::gamma), sc.dgamma);
    e.dbeta = scaled_error(ref.dbeta, finite_differences(c, &ReferenceInputs::beta), sc.dbeta);
    CHECK(e.dgamma < kTolerance);
    CHECK(e.dbeta < kTolerance);
  } else {
    CHECK(ref.dgamma.empty());
    CHECK(ref.dbeta.empty());
  }
  return e;
}

void keep_worst(Errors& worst, const Errors& e) {
  worst.dx = std::max(worst.dx, e.dx);
  worst.dw = std::max(worst.dw, e.dw);
  worst.dbias = std::max(worst.dbias, e.dbias);
  worst.dscale = std::max(worst.dscale, e.dscale);
  worst.dgamma = std::max(worst.dgamma, e.dgamma);
  worst.dbeta = std::max(worst.dbeta, e.dbeta);
}

void report(const std::string& what, const Errors& w) {
  MESSAGE(what << ": worst FD error dx " << w.dx << " dw " << w.dw << " dbias " << w.dbias
               << " dscale " << w.dscale << " dgamma " << w.dgamma << " dbeta " << w.dbeta);
}

// x rows of 1000 + N(0, 1): every column of a has a mean ~1000 times its spread.
void make_means_large(Case& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  for (auto& v : c.in.x) v = 1000.0 + d(rng);
}

}  // namespace

TEST_CASE("every gradient matches finite differences: sizes, modes, bias/scale/affine") {
  Errors worst;
  std::uint64_t seed = 1;
  for (std::int64_t M : {2, 3, 7})
    for (std::int64_t N : {1, 3, 5})
      for (std::int64_t K : {2, 4})
        for (Mode mode : {Mode::train, Mode::eval})
          for (int flags = 0; flags < 8; ++flags) {
            CAPTURE(M);
            CAPTURE(N);
            CAPTURE(K);
            CAPTURE(name(mode));
            CAPTURE(flags);
            const auto c = make_case(M, N, K, mode, flags & 1, flags & 2, flags & 4, seed++);
            keep_worst(worst, check_against_fd(c));
          }
  report("sizes x modes x flags", worst);
}

TEST_CASE("a gamma = 0 column: dgamma still right, no dx/dW contribution") {
  for (Mode mode : {Mode::train, Mode::eval}) {
    CAPTURE(name(mode));
    auto c = make_case(5, 4, 3, mode, true, true, true, 77);
    const std::size_t n0 = 2, K = 3;
    c.in.gamma[n0] = 0.0;
    const Errors e = check_against_fd(c);
    report(mode == Mode::train ? "gamma = 0, train" : "gamma = 0, eval", e);
    const auto ref = backward_reference(c.p, c.in, c.G);
    // dgamma = sum dy zh does not involve gamma: that column's gradient is as large as any.
    CHECK(std::abs(ref.dgamma[n0]) > 1e-3);
    // y's column is beta whatever W's row is: exactly no gradient reaches that row, and dx does
    // not change (bit for bit) when the row does.
    for (std::size_t k = 0; k < K; ++k) CHECK(ref.dw[n0 * K + k] == 0.0);
    CHECK(ref.dbias[n0] == 0.0);
    CHECK(ref.dscale[n0] == 0.0);
    Case other = c;
    std::mt19937_64 rng(5);
    for (std::size_t k = 0; k < K; ++k) other.in.w[n0 * K + k] = uniform(1, rng, -3.0, 3.0)[0];
    CHECK(backward_reference(other.p, other.in, other.G).dx == ref.dx);
  }
}

TEST_CASE("a scale = 0 column: dscale right, no dx/dW/dbias contribution") {
  for (Mode mode : {Mode::train, Mode::eval}) {
    CAPTURE(name(mode));
    auto c = make_case(6, 4, 3, mode, true, true, true, 78);
    const std::size_t n0 = 1, K = 3;
    c.in.scale[n0] = 0.0;
    // In train mode the column z = 0 has variance 0: zh = s c / sqrt(s^2 var + eps) turns over
    // within |s| ~ sqrt(eps / var) ~ 3e-3 of 0, so this column needs a step well inside that.
    const Errors e = check_against_fd(c, 0x1p-20);
    const auto ref = backward_reference(c.p, c.in, c.G);
    const auto fd = finite_differences(c, &ReferenceInputs::scale, 0x1p-20);
    CHECK(std::abs(ref.dscale[n0] - fd[n0]) <= kTolerance * std::abs(fd[n0]));
    CHECK(std::abs(ref.dscale[n0]) > 1e-3);
    report(mode == Mode::train ? "scale = 0, train" : "scale = 0, eval", e);
    for (std::size_t k = 0; k < K; ++k) CHECK(ref.dw[n0 * K + k] == 0.0);
    CHECK(ref.dbias[n0] == 0.0);
    CHECK(ref.dbias_scale[n0] == 0.0);
    Case other = c;
    std::mt19937_64 rng(6);
    for (std::size_t k = 0; k < K; ++k) other.in.w[n0 * K + k] = uniform(1, rng, -3.0, 3.0)[0];
    CHECK(backward_reference(other.p, other.in, other.G).dx == ref.dx);
  }
}

TEST_CASE("large column means (x ~ 1000 + N(0,1)): gradients stay accurate") {
  for (Mode mode : {Mode::train, Mode::eval}) {
    for (int flags : {0, 7}) {
      CAPTURE(name(mode));
      CAPTURE(flags);
      auto c = make_case(9, 5, 4, mode, flags & 1, flags & 2, flags & 4, 90 + flags);
      make_means_large(c, 91 + flags);
      if (mode == Mode::eval) {
        // Running stats near this batch's, so that zh is O(1) as it is for a trained model.
        Case as_train = c;
        as_train.p.mode = Mode::train;
        ReferenceSettings s = reference_settings(as_train.p);
        const auto fwd = reference_forward(as_train.in, s);
        std::mt19937_64 rng(92);
        for (std::size_t n = 0; n < 5; ++n) {
          const double var = 1 / (fwd.save_invstd[n] * fwd.save_invstd[n]) - s.eps;
          c.in.running_mean[n] = fwd.save_mean[n] + uniform(1, rng, -0.5, 0.5)[0] * std::sqrt(var);
          c.in.running_var[n] = var * uniform(1, rng, 0.5, 1.5)[0];
        }
      }
      const Errors e = check_against_fd(c);
      report(mode == Mode::train ? "large means, train" : "large means, eval", e);
    }
  }
}

TEST_CASE("saved is c = a - mean_a (train) or u = a + b (eval), and gives zh") {
  for (Mode mode : {Mode::train, Mode::eval}) {
    for (bool large : {false, true}) {
      CAPTURE(name(mode));
      CAPTURE(large);
      auto c = make_case(7, 5, 4, mode, true, true, true, 123);
      if (large) make_means_large(c, 124);
      const std::size_t M = 7, N = 5;
      const auto ref = backward_reference(c.p, c.in, c.G);
      const auto a = linear(c.in);
      std::vector<double> want(M * N);
      for (std::size_t n = 0; n < N; ++n) {
        double mean = 0;
        for (std::size_t m = 0; m < M; ++m) mean += a[m * N + n] / static_cast<double>(M);
        for (std::size_t m = 0; m < M; ++m)
          want[m * N + n] = mode == Mode::train ? a[m * N + n] - mean : a[m * N + n] + c.in.bias[n];
      }
      // The centred values are O(1) while a is up to ~4000: compared on their own scale.
      CHECK(normwise_error(ref.saved, want) < 1e-12);
      // The comment's promise: zh = s invstd c (train), (s u - rm) invstd (eval), with the
      // forward's invstd; zh read back from the forward's y = gamma zh + beta.
      ReferenceSettings s = reference_settings(c.p);
      const auto fwd = reference_forward(c.in, s);
      std::vector<double> zh_saved(M * N), zh_fwd(M * N);
      for (std::size_t m = 0; m < M; ++m)
        for (std::size_t n = 0; n < N; ++n) {
          const double v = ref.saved[m * N + n], sc = c.in.scale[n];
          zh_saved[m * N + n] = mode == Mode::train
                                    ? sc * fwd.save_invstd[n] * v
                                    : (sc * v - c.in.running_mean[n]) * fwd.save_invstd[n];
          zh_fwd[m * N + n] = (fwd.y[m * N + n] - c.in.beta[n]) / c.in.gamma[n];
        }
      CHECK(normwise_error(zh_saved, zh_fwd) < 1e-11);
    }
  }
}

TEST_CASE("mismatched problem and inputs are refused, naming the argument") {
  auto c = make_case(4, 3, 2, Mode::train, true, true, true, 200);
  auto refused_for = [&](const Case& bad) -> std::string {
    try {
      backward_reference(bad.p, bad.in, bad.G);
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return "";
  };
  Case no_bias = c;
  no_bias.p.has_bias = false;
  CHECK(refused_for(no_bias) == "bias");
  Case short_dy = c;
  short_dy.G.pop_back();
  CHECK(refused_for(short_dy) == "dy");
  Case one_row = make_case(1, 3, 2, Mode::train, true, true, true, 201);
  CHECK(refused_for(one_row) == "M");
  Case eval_no_stats = make_case(4, 3, 2, Mode::eval, true, true, true, 202);
  eval_no_stats.in.running_var.clear();
  CHECK(refused_for(eval_no_stats) == "running_var");
}

namespace {

// The first, a middle and the last index of [0, count) (fewer when count < 3).
std::vector<std::int64_t> ends_and_middle(std::int64_t count) {
  std::vector<std::int64_t> v{0, count / 2, count - 1};
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// max |got - want| / max |want| over the tensor (0 when both are all zero).
double subset_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, mag = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    mag = std::max(mag, std::abs(want[i]));
  }
  return mag > 0 ? diff / mag : diff;
}

// `full` ([rows][cols] packed) at the columns `cols` of every row.
std::vector<double> columns_of(const std::vector<double>& full, std::size_t cols_total,
                               const std::vector<std::int64_t>& cols) {
  std::vector<double> v;
  for (std::size_t r = 0; r < full.size() / cols_total; ++r)
    for (std::int64_t c : cols) v.push_back(full[r * cols_total + static_cast<std::size_t>(c)]);
  return v;
}

// `full` ([rows][width] packed) at the rows `rows`.
std::vector<double> rows_of(const std::vector<double>& full, std::size_t width,
                            const std::vector<std::int64_t>& rows) {
  std::vector<double> v;
  for (std::int64_t r : rows)
    for (std::size_t k = 0; k < width; ++k)
      v.push_back(full[static_cast<std::size_t>(r) * width + k]);
  return v;
}

// What the forward saves for `c`, from the float64 forward: saved from backward_reference,
// save_invstd (train) from reference_forward.
SavedForward exact_saved(const Case& c, const BackwardReferenceOutputs& ref) {
  SavedForward f;
  f.saved = ref.saved;
  if (c.p.mode == Mode::train)
    f.save_invstd = reference_forward(c.in, reference_settings(c.p)).save_invstd;
  return f;
}

}  // namespace

TEST_CASE("backward_reference_from_saved agrees with backward_reference at index subsets") {
  std::uint64_t seed = 300;
  double worst = 0;
  // Named copies, not structured bindings: CAPTURE's lambda cannot capture those (clang 14).
  for (const auto& shape : {std::array<std::int64_t, 3>{7, 5, 3}, {33, 17, 9}})
    for (Mode mode : {Mode::train, Mode::eval})
      for (int flags = 0; flags < 8; ++flags) {
        const std::int64_t M = shape[0], N = shape[1], K = shape[2];
        CAPTURE(M);
        CAPTURE(N);
        CAPTURE(K);
        CAPTURE(name(mode));
        CAPTURE(flags);
        const auto c = make_case(M, N, K, mode, flags & 1, flags & 2, flags & 4, seed++);
        const auto ref = backward_reference(c.p, c.in, c.G);
        const auto cols = ends_and_middle(K), rows = ends_and_middle(N);
        REQUIRE(cols.size() == 3);
        REQUIRE(rows.size() == 3);
        const auto got =
            backward_reference_from_saved(c.p, c.in, c.G, exact_saved(c, ref), cols, rows);
        const auto Ks = static_cast<std::size_t>(K);
        CHECK(got.saved.empty());
        CHECK(got.dx.size() == static_cast<std::size_t>(M) * cols.size());
        CHECK(got.dw.size() == rows.size() * Ks);
        const std::vector<std::pair<const char*, double>> errors = {
            {"dx", subset_error(got.dx, columns_of(ref.dx, Ks, cols))},
            {"dx_natural", subset_error(got.dx_natural, columns_of(ref.dx_natural, Ks, cols))},
            {"dw", subset_error(got.dw, rows_of(ref.dw, Ks, rows))},
            {"dw_natural", subset_error(got.dw_natural, rows_of(ref.dw_natural, Ks, rows))},
            {"dbias", subset_error(got.dbias, ref.dbias)},
            {"dbias_scale", subset_error(got.dbias_scale, ref.dbias_scale)},
            {"dscale", subset_error(got.dscale, ref.dscale)},
            {"dscale_scale", subset_error(got.dscale_scale, ref.dscale_scale)},
            {"dgamma", subset_error(got.dgamma, ref.dgamma)},
            {"dbeta", subset_error(got.dbeta, ref.dbeta)}};
        for (const auto& item : errors) {
          const char* what = item.first;
          const double e = item.second;
          CAPTURE(what);
          CHECK(e < 1e-12);
          worst = std::max(worst, e);
        }
        // Present exactly when the parameter is.
        CHECK(got.dbias.size() == ref.dbias.size());
        CHECK(got.dscale.size() == ref.dscale.size());
        CHECK(got.dgamma.size() == ref.dgamma.size());
        // Every index: the full tensors again (in train invstd comes from the forward's own
        // GEMM, hence agreement to rounding, not bit for bit).
        std::vector<std::int64_t> all_k(Ks), all_n(static_cast<std::size_t>(N));
        for (std::size_t k = 0; k < all_k.size(); ++k) all_k[k] = static_cast<std::int64_t>(k);
        for (std::size_t n = 0; n < all_n.size(); ++n) all_n[n] = static_cast<std::int64_t>(n);
        const auto whole =
            backward_reference_from_saved(c.p, c.in, c.G, exact_saved(c, ref), all_k, all_n);
        CHECK(subset_error(whole.dx, ref.dx) < 1e-12);
        CHECK(subset_error(whole.dw, ref.dw) < 1e-12);
      }
  MESSAGE("from_saved vs backward_reference: worst relative difference " << worst);
}

TEST_CASE("compare_gradients: the reference against itself is 0; a 1% error in dx fails") {
  for (Mode mode : {Mode::train, Mode::eval}) {
    CAPTURE(name(mode));
    const auto c = make_case(33, 17, 9, mode, true, true, true, 400);
    const auto ref = backward_reference(c.p, c.in, c.G);
    BackwardGradients got{ref.saved, ref.dx, ref.dw, ref.dbias, ref.dscale, ref.dgamma, ref.dbeta};
    const BackwardErrors same = compare_gradients(ref, got);
    CHECK(same.worst() == 0);
    std::string why = "unchanged";
    CHECK(passes(same, 1e-6, &why));
    CHECK(why.empty());

    got.dx[got.dx.size() / 2] *= 1.01;
    const BackwardErrors off = compare_gradients(ref, got);
    CHECK(off.dx > 0);
    CHECK(off.worst() == off.dx);
    CHECK_FALSE(passes(off, 1e-6, &why));
    CHECK(why.find("dx") != std::string::npos);
    CHECK(why.find("dw") == std::string::npos);

    // Not finite: +inf, and it fails at any threshold.
    got.dx[0] = NAN;
    const BackwardErrors nan = compare_gradients(ref, got);
    CHECK(std::isinf(nan.dx));
    CHECK_FALSE(passes(nan, 1e300));

    // An empty vector is not compared.
    const BackwardErrors none = compare_gradients(ref, BackwardGradients{});
    CHECK(none.worst() == 0);
  }
}

TEST_CASE("backward_reference_from_saved refuses bad arguments, naming them") {
  const auto c = make_case(7, 5, 3, Mode::train, true, true, true, 500);
  const auto ref = backward_reference(c.p, c.in, c.G);
  const SavedForward f = exact_saved(c, ref);
  auto refused_for = [&](const Case& cc, const SavedForward& ff, std::vector<std::int64_t> cols,
                         std::vector<std::int64_t> rows) -> std::string {
    try {
      backward_reference_from_saved(cc.p, cc.in, cc.G, ff, cols, rows);
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return "";
  };
  CHECK(refused_for(c, f, {0, 2}, {0, 4}).empty());
  CHECK(refused_for(c, f, {0, 3}, {0}) == "dx_cols");
  CHECK(refused_for(c, f, {-1}, {0}) == "dx_cols");
  CHECK(refused_for(c, f, {0}, {5}) == "dw_rows");
  SavedForward no_invstd = f;
  no_invstd.save_invstd.clear();
  CHECK(refused_for(c, no_invstd, {0}, {0}) == "save_invstd");
  SavedForward short_saved = f;
  short_saved.saved.pop_back();
  CHECK(refused_for(c, short_saved, {0}, {0}) == "saved");
  // Eval normalizes with the running stats: a save_invstd there is a mistake.
  const auto e = make_case(7, 5, 3, Mode::eval, true, true, true, 501);
  SavedForward fe = exact_saved(e, backward_reference(e.p, e.in, e.G));
  CHECK(refused_for(e, fe, {0}, {0}).empty());
  fe.save_invstd.assign(5, 1.0);
  CHECK(refused_for(e, fe, {0}, {0}) == "save_invstd");
}
