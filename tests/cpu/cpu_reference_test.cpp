// The float64 reference (check/cpu_reference): agrees with a naive, independently written
// computation of reference_model.py's reference_forward; cumulative momentum; errors; speed.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <random>
#include <vector>

#include "fusejit/error.hpp"
#include "fusejit/verify/cpu_reference.hpp"

using namespace fusejit;

namespace {

std::vector<double> random(std::size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

ReferenceInputs make_inputs(std::int64_t M, std::int64_t N, std::int64_t K, std::uint64_t seed,
                            bool bias, bool scale, bool affine, bool running) {
  std::mt19937_64 rng(seed);
  ReferenceInputs in;
  in.M = M, in.N = N, in.K = K;
  const auto m = static_cast<std::size_t>(M), n = static_cast<std::size_t>(N),
             k = static_cast<std::size_t>(K);
  in.x = random(m * k, rng, 0.0, 1.0);  // non-centred, as KernelBench
  in.w = random(n * k, rng, -1.0, 1.0);
  if (bias) in.bias = random(n, rng, -1.0, 1.0);
  if (scale) in.scale = random(n, rng, -2.0, 2.0);
  if (affine) {
    in.gamma = random(n, rng, 0.5, 1.5);
    in.beta = random(n, rng, -1.0, 1.0);
  }
  if (running) {
    in.running_mean = random(n, rng, -1.0, 1.0);
    in.running_var = random(n, rng, 0.5, 1.5);
  }
  return in;
}

// reference_forward written out the obvious way, element by element, without sharing code
// with the implementation under test.
ReferenceOutputs naive(const ReferenceInputs& in, const ReferenceSettings& s) {
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N),
             K = static_cast<std::size_t>(in.K);
  ReferenceOutputs out;
  out.y.assign(M * N, 0.0);
  out.num_batches_tracked = s.num_batches_tracked + (s.mode == Mode::train ? 1 : 0);
  for (std::size_t n = 0; n < N; ++n) {
    std::vector<double> z(M);
    for (std::size_t m = 0; m < M; ++m) {
      double a = 0;
      for (std::size_t k = 0; k < K; ++k) a += in.x[m * K + k] * in.w[n * K + k];
      const double b = in.bias.empty() ? 0.0 : in.bias[n];
      const double sc = in.scale.empty() ? 1.0 : in.scale[n];
      z[m] = (a + b) * sc;
    }
    double mean, var;
    if (s.mode == Mode::train) {
      mean = 0;
      for (double v : z) mean += v;
      mean /= M;
      var = 0;
      for (double v : z) var += (v - mean) * (v - mean);
      var /= M;
      if (!in.running_mean.empty()) {
        const double f = s.momentum ? *s.momentum : 1.0 / (s.num_batches_tracked + 1.0);
        out.running_mean.push_back((1 - f) * in.running_mean[n] + f * mean);
        out.running_var.push_back((1 - f) * in.running_var[n] + f * var * M / (M - 1.0));
      }
    } else {
      mean = in.running_mean[n];
      var = in.running_var[n];
      out.running_mean.push_back(mean);
      out.running_var.push_back(var);
    }
    const double invstd = 1.0 / std::sqrt(var + s.eps);
    out.save_mean.push_back(mean);
    out.save_invstd.push_back(invstd);
    for (std::size_t m = 0; m < M; ++m) {
      const double g = in.gamma.empty() ? 1.0 : in.gamma[n];
      const double be = in.beta.empty() ? 0.0 : in.beta[n];
      out.y[m * N + n] = (z[m] - mean) * invstd * g + be;
    }
  }
  return out;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return worst;
}

void check_same(const ReferenceOutputs& got, const ReferenceOutputs& want) {
  CHECK(max_rel(got.y, want.y) < 1e-11);
  CHECK(max_rel(got.running_mean, want.running_mean) < 1e-12);
  CHECK(max_rel(got.running_var, want.running_var) < 1e-12);
  CHECK(max_rel(got.save_mean, want.save_mean) < 1e-12);
  CHECK(max_rel(got.save_invstd, want.save_invstd) < 1e-10);
  CHECK(got.num_batches_tracked == want.num_batches_tracked);
}

}  // namespace

TEST_CASE("matches a naive computation: tails of the 4x4 and 64x64 tiles, K chunks, flags") {
  struct Shape {
    std::int64_t M, N, K;
  };
  // Sizes straddle the blocking: 4x4 micro tiles, 64x64 tasks, 256-wide K chunks.
  for (Shape sh : {Shape{2, 1, 1}, Shape{3, 7, 5}, Shape{37, 70, 300}, Shape{129, 65, 513},
                   Shape{64, 64, 256}}) {
    for (int flags = 0; flags < 8; ++flags) {
      const bool bias = flags & 1, scale = flags & 2, affine = flags & 4;
      for (Mode mode : {Mode::train, Mode::eval}) {
        CAPTURE(sh.M);
        CAPTURE(sh.N);
        CAPTURE(sh.K);
        CAPTURE(flags);
        const auto in = make_inputs(sh.M, sh.N, sh.K, 100 + flags, bias, scale, affine, true);
        ReferenceSettings s;
        s.mode = mode;
        s.momentum = 0.1 + 0.1 * flags;
        s.num_batches_tracked = 3;
        check_same(reference_forward(in, s), naive(in, s));
      }
    }
  }
}

TEST_CASE("cumulative momentum uses 1 / (num_batches_tracked + 1) and counts the batch") {
  const auto in = make_inputs(50, 20, 30, 7, true, true, true, true);
  ReferenceSettings s;
  s.momentum = std::nullopt;
  s.num_batches_tracked = 4;
  const auto out = reference_forward(in, s);
  check_same(out, naive(in, s));
  CHECK(out.num_batches_tracked == 5);
  // With factor 1/5: 4/5 of the old value plus 1/5 of the batch statistic, spelled out.
  for (std::size_t n = 0; n < 20; ++n)
    CHECK(out.running_mean[n] ==
          doctest::Approx(0.8 * in.running_mean[n] + 0.2 * out.save_mean[n]).epsilon(1e-13));
  // The first batch (counter 0) replaces the running stats outright.
  s.num_batches_tracked = 0;
  const auto first = reference_forward(in, s);
  for (std::size_t n = 0; n < 20; ++n) {
    CHECK(first.running_mean[n] == doctest::Approx(first.save_mean[n]).epsilon(1e-14));
    const double var = 1.0 / (first.save_invstd[n] * first.save_invstd[n]) - s.eps;
    CHECK(first.running_var[n] == doctest::Approx(var * 50.0 / 49.0).epsilon(1e-9));
  }
  // Three steps of the cumulative average equal the plain mean of the three batch means.
  ReferenceInputs cur = in;
  std::vector<double> sum(20, 0.0);
  for (int step = 0; step < 3; ++step) {
    cur.x = make_inputs(50, 20, 30, 1000 + step, false, false, false, false).x;
    s.num_batches_tracked = step;
    const auto o = reference_forward(cur, s);
    for (std::size_t n = 0; n < 20; ++n) sum[n] += o.save_mean[n];
    cur.running_mean = o.running_mean;
    cur.running_var = o.running_var;
  }
  for (std::size_t n = 0; n < 20; ++n)
    CHECK(cur.running_mean[n] == doctest::Approx(sum[n] / 3).epsilon(1e-12));
}

TEST_CASE("train without running stats; eval leaves them unchanged and does not count") {
  const auto in = make_inputs(10, 6, 4, 9, true, true, true, false);
  const auto out = reference_forward(in, {});
  CHECK(out.running_mean.empty());
  CHECK(out.running_var.empty());
  CHECK(out.save_mean.size() == 6);
  const auto ev_in = make_inputs(1, 6, 4, 9, true, true, true, true);  // M = 1 is fine in eval
  ReferenceSettings ev;
  ev.mode = Mode::eval;
  ev.num_batches_tracked = 7;
  const auto ev_out = reference_forward(ev_in, ev);
  CHECK(ev_out.running_mean == ev_in.running_mean);
  CHECK(ev_out.running_var == ev_in.running_var);
  CHECK(ev_out.num_batches_tracked == 7);
  check_same(ev_out, naive(ev_in, ev));
}

TEST_CASE("variance is exact for columns whose mean dwarfs their spread") {
  ReferenceInputs in;
  in.M = 4, in.N = 1, in.K = 1;
  in.x = {1e8 + 1, 1e8 - 1, 1e8 + 1, 1e8 - 1};
  in.w = {1.0};
  const auto out = reference_forward(in, {});
  CHECK(out.save_mean[0] == 1e8);
  CHECK(out.save_invstd[0] == doctest::Approx(1.0 / std::sqrt(1.0 + 1e-5)).epsilon(1e-15));
  CHECK(out.y[0] == doctest::Approx(1.0 / std::sqrt(1.0 + 1e-5)).epsilon(1e-14));
}

TEST_CASE("errors name the argument") {
  auto in = make_inputs(1, 4, 4, 1, true, true, true, true);
  try {
    reference_forward(in, {});
    FAIL("M = 1 in train mode must throw");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "M");
  }
  in = make_inputs(3, 4, 4, 1, true, true, true, false);
  ReferenceSettings ev;
  ev.mode = Mode::eval;
  try {
    reference_forward(in, ev);
    FAIL("eval without running stats must throw");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "running_mean");
  }
  in = make_inputs(3, 4, 4, 1, true, true, true, true);
  in.x.pop_back();
  try {
    reference_forward(in, {});
    FAIL("a short x must throw");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "x");
  }
  in = make_inputs(3, 4, 4, 1, true, true, true, true);
  in.gamma.resize(3);
  try {
    reference_forward(in, {});
    FAIL("a short gamma must throw");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "gamma");
  }
  in = make_inputs(3, 4, 4, 1, true, true, true, true);
  in.running_var.clear();
  try {
    reference_forward(in, {});
    FAIL("running_mean without running_var must throw");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "running_var");
  }
}

TEST_CASE("the threaded GEMM gives the same bits with any thread count") {
  const auto in = make_inputs(200, 150, 700, 5, true, true, false, false);
  const auto one = reference_linear(in, 1);
  CHECK(reference_linear(in, 3) == one);
  CHECK(reference_linear(in, 64) == one);
}

// Processor time of all threads, not wall time: ctest runs tests side by side, and a machine
// busy with other work stretches the wall clock without making the reference any slower.
TEST_CASE("1024x1024x1024 takes well under four seconds of processor time") {
  const auto in = make_inputs(1024, 1024, 1024, 11, true, true, true, true);
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  const auto out = reference_forward(in, {});
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("reference_forward 1024x1024x1024: " << s << " s wall, " << cpu << " s processor");
  CHECK(out.y.size() == 1024u * 1024u);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  CHECK(cpu < 4.0);
#endif
}
