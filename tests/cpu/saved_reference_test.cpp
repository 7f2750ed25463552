// The host side of the forward's `saved` output (Tensors::saved): its float64 reference, how
// compare() measures it, and the pointer checks a run makes before launching (no GPU needed:
// the checks look at addresses only).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/verify/verification.hpp"

using namespace fusejit;

namespace {

// a = x W^T straight from the definition, [M][N].
std::vector<double> plain_a(const ReferenceInputs& r) {
  std::vector<double> a(static_cast<std::size_t>(r.M * r.N));
  for (std::int64_t m = 0; m < r.M; ++m)
    for (std::int64_t n = 0; n < r.N; ++n) {
      double s = 0;
      for (std::int64_t k = 0; k < r.K; ++k) s += r.x[m * r.K + k] * r.w[n * r.K + k];
      a[m * r.N + n] = s;
    }
  return a;
}

std::string rejected(const Problem& p, const Tensors& t) {
  try {
    validate_tensors(p, t);
  } catch (const InvalidArgument& e) {
    return e.argument();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("reference_saved: train c = a - column mean of a, eval u = a + bias") {
  for (const char* line : {"37x5x9 fp32 train", "37x5x9 bf16 eval", "37x5x9 fp16 eval nobias",
                           "6x3x4 tf32 train noscale"}) {
    CAPTURE(std::string(line));
    const SweepCase c = parse_sweep_line(line);
    const CaseInputs in = make_case_inputs(c, 11);
    const ReferenceInputs r = reference_inputs(in);
    const std::vector<double> a = plain_a(r);
    const std::vector<double> saved = reference_saved(r, c.problem.mode);
    REQUIRE(saved.size() == a.size());
    for (std::int64_t n = 0; n < r.N; ++n) {
      double mean = 0;
      for (std::int64_t m = 0; m < r.M; ++m) mean += a[m * r.N + n];
      mean /= static_cast<double>(r.M);
      const double shift = c.problem.mode == Mode::train ? -mean : r.bias.empty() ? 0.0 : r.bias[n];
      for (std::int64_t m = 0; m < r.M; ++m) {
        const double want = a[m * r.N + n] + shift;
        CHECK(std::abs(saved[m * r.N + n] - want) <= 1e-12 * (std::abs(a[m * r.N + n]) + 1));
      }
    }
    // Neither the bias nor the scale enters c: it is the same without them.
    if (c.problem.mode == Mode::train) {
      ReferenceInputs bare = r;
      bare.bias.clear();
      bare.scale.clear();
      CHECK(reference_saved(bare, Mode::train) == saved);
    }
  }
}

TEST_CASE("compare measures saved by relative error and flags NaN and written padding") {
  const SweepCase c = parse_sweep_line("20x6x8 bf16 train");
  const CaseInputs in = make_case_inputs(c, 3);
  const ReferenceOutputs ref = reference_forward(
      reference_inputs(in), reference_settings(c.problem, in.num_batches_tracked));
  const std::vector<double> ref_saved = reference_saved(reference_inputs(in), c.problem.mode);
  CaseOutputs got;
  got.y = ref.y;
  got.running_mean = ref.running_mean;
  got.running_var = ref.running_var;
  got.save_mean = ref.save_mean;
  got.save_invstd = ref.save_invstd;
  got.num_batches_tracked = in.num_batches_tracked + 1;
  CHECK(compare(in, got, ref).saved == 0);  // not requested: not measured
  got.saved = ref_saved;
  CaseErrors e = compare(in, got, ref, &ref_saved);
  CHECK(e.saved == 0);
  CHECK(e.worst() == 0);
  CHECK(passes(e, sweep_threshold(c.problem.dtype)));
  // One element off by the column's spread: measured against saved's own norm.
  got.saved[7] += 1.0;
  e = compare(in, got, ref, &ref_saved);
  double norm = 0;
  for (double v : ref_saved) norm += v * v;
  CHECK(e.saved == doctest::Approx(1.0 / std::sqrt(norm)));
  CHECK(e.worst() == e.saved);
  // Without a reference given, compare computes the same one.
  CHECK(compare(in, got, ref).saved == e.saved);
  got.saved[7] = NAN;
  e = compare(in, got, ref, &ref_saved);
  CHECK(e.non_finite);
  CHECK(!passes(e, 1.0));
  got.saved = ref_saved;
  got.saved_padding_intact = false;
  e = compare(in, got, ref, &ref_saved);
  CHECK(!e.padding_ok);
  std::string why;
  CHECK(!passes(e, 1.0, &why));
  CHECK(why.find("saved") != std::string::npos);
}

TEST_CASE("validate_tensors: saved is optional, aligned like y and must not overlap it") {
  Problem p;
  p.M = 100, p.N = 56, p.K = 32, p.ldy = 64;
  p.dtype = DType::bf16;
  p.mode = Mode::eval;
  // Addresses only: nothing is dereferenced.
  const std::uintptr_t base = 0x10000000;
  const std::uintptr_t span = ((p.M - 1) * p.lda_y() + p.N) * 2;  // bytes of y
  auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  Tensors t;
  t.x = at(base + 0x1000000);
  t.w = at(base + 0x2000000);
  t.y = at(base);
  t.bias = at(base + 0x3000000);
  t.scale = at(base + 0x3001000);
  t.gamma = at(base + 0x3002000);
  t.beta = at(base + 0x3003000);
  t.running_mean = at(base + 0x3004000);
  t.running_var = at(base + 0x3005000);
  CHECK(rejected(p, t) == "(accepted)");  // null: not wanted
  auto with_saved = [&](std::uintptr_t a) {
    Tensors s = t;
    s.saved = at(a);
    return s;
  };
  // y's last row ends at column N, not at ldy: saved may begin right there (16-byte aligned
  // here), or end right where y begins.
  REQUIRE(span % 16 == 0);
  const std::uintptr_t after = base + span;
  CHECK(rejected(p, with_saved(after)) == "(accepted)");
  CHECK(rejected(p, with_saved(base - span)) == "(accepted)");
  CHECK(rejected(p, with_saved(base)) == "saved");
  CHECK(rejected(p, with_saved(base + span - 16)) == "saved");
  CHECK(rejected(p, with_saved(base - span + 16)) == "saved");
  CHECK(rejected(p, with_saved(after + 2)) == "saved");  // y's rows are 16-byte aligned
  p.alignment = 2;  // the caller promises only 2 bytes: saved is held to the same
  CHECK(rejected(p, with_saved(after + 2)) == "(accepted)");
}
