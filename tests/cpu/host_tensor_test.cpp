// Host-side data: fp16/bf16 conversions round to nearest even and round-trip, random fills never
// give zeros and honour seeds, poison patterns read as NaN.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>

#include "fusejit/error.hpp"
#include "fusejit/verify/host_tensor.hpp"

using namespace fusejit;

namespace {

float bits_f(std::uint32_t b) {
  return std::bit_cast<float>(b);
}

// Checks nearest-even independently of the conversion code: among the representable neighbours
// of the result, none is closer to v, and on a tie the result's last bit is 0.
template <class ToBits, class FromBits>
void check_nearest_even(float v, ToBits to_bits, FromBits from_bits) {
  const std::uint16_t h = to_bits(v);
  const double r = from_bits(h);
  if (std::isinf(r)) return;  // overflow region, checked with known values
  const double d = std::abs(static_cast<double>(v) - r);
  // Neighbours by bit pattern (same sign, magnitude +-1 ulp); magnitude 0 has no lower one.
  for (int step : {-1, 1}) {
    const int mag = (h & 0x7FFF) + step;
    if (mag < 0) continue;
    const auto nb = static_cast<std::uint16_t>((h & 0x8000) | mag);
    const double rn = from_bits(nb);
    if (std::isnan(rn) || std::isinf(rn)) continue;
    const double dn = std::abs(static_cast<double>(v) - rn);
    REQUIRE_MESSAGE(d <= dn, "v=" << v << " -> " << r << " but " << rn << " is closer");
    if (d == dn) REQUIRE_MESSAGE((h & 1) == 0, "tie at v=" << v << " not rounded to even");
  }
}

}  // namespace

TEST_CASE("fp16 conversion: known values, ties to even, subnormals, overflow, NaN") {
  CHECK(float_to_half_bits(1.0f) == 0x3C00);
  CHECK(float_to_half_bits(-2.0f) == 0xC000);
  CHECK(float_to_half_bits(0.1f) == 0x2E66);
  CHECK(float_to_half_bits(65504.0f) == 0x7BFF);
  CHECK(float_to_half_bits(65519.0f) == 0x7BFF);
  CHECK(float_to_half_bits(65520.0f) == 0x7C00);  // the tie above the max rounds to inf (even)
  CHECK(float_to_half_bits(1e6f) == 0x7C00);
  CHECK(float_to_half_bits(-INFINITY) == 0xFC00);
  CHECK(float_to_half_bits(0.0f) == 0x0000);
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: even is 1.
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  // 1 + 3 * 2^-11 lies halfway between 0x3C01 and 0x3C02: even is 0x3C02.
  CHECK(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 1.5 * 2^-24 ties to 2 * 2^-24.
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25) * 1.0001f) == 0x0001);
  CHECK(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -30)) == 0x0000);
  CHECK(float_to_half_bits(-std::ldexp(1.0f, -24)) == 0x8001);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  // Halfway between the largest subnormal (0x03FF) and the smallest normal rounds up (even).
  CHECK(float_to_half_bits(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)) == 0x0400);
  CHECK(float_to_half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  const std::uint16_t nan = float_to_half_bits(std::nanf(""));
  CHECK((nan & 0x7C00) == 0x7C00);
  CHECK((nan & 0x03FF) != 0);
  // A signalling NaN whose payload sits only in the low bits must not turn into inf.
  CHECK(std::isnan(half_bits_to_float(float_to_half_bits(bits_f(0x7F800001u)))));
  CHECK(half_bits_to_float(0x3C00) == 1.0f);
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x7BFF) == 65504.0f);
  CHECK(std::isinf(half_bits_to_float(0x7C00)));
  CHECK(std::signbit(half_bits_to_float(0x8000)));
}

TEST_CASE("bf16 conversion: known values, ties to even, overflow, NaN, subnormals") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-2.0f) == 0xC000);
  CHECK(float_to_bf16_bits(3.14159265f) == 0x4049);
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);        // tie -> even
  CHECK(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);    // tie -> even
  CHECK(float_to_bf16_bits(bits_f(0x3F808001u)) == 0x3F81);                // just above the tie
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to inf
  CHECK(float_to_bf16_bits(INFINITY) == 0x7F80);
  CHECK(float_to_bf16_bits(bits_f(0x00012345u)) == 0x0001);           // subnormal
  const std::uint16_t nan = float_to_bf16_bits(bits_f(0x7F800001u));  // payload only in low bits
  CHECK(std::isnan(bf16_bits_to_float(nan)));
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(-std::nanf("")))));
  CHECK(bf16_bits_to_float(0x3F80) == 1.0f);
}

TEST_CASE("every 16-bit pattern round-trips through fp32 exactly; NaN stays NaN") {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float fh = half_bits_to_float(h);
    if (std::isnan(fh)) {
      REQUIRE(std::isnan(half_bits_to_float(float_to_half_bits(fh))));
    } else {
      REQUIRE(float_to_half_bits(fh) == h);
    }
    const float fb = bf16_bits_to_float(h);
    if (std::isnan(fb)) {
      REQUIRE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(fb))));
    } else {
      REQUIRE(float_to_bf16_bits(fb) == h);
    }
  }
}

TEST_CASE("random floats round to the nearest representable value, ties to even") {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> expo(-30.0f, 16.0f);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    const float v = (i % 2 ? -1.0f : 1.0f) * mant(rng) * std::exp2(std::floor(expo(rng)));
    check_nearest_even(v, float_to_half_bits, half_bits_to_float);
    check_nearest_even(v, float_to_bf16_bits, bf16_bits_to_float);
  }
  // Exact ties between every pair of neighbouring fp16 values in [1, 2) and in the subnormals.
  for (std::uint16_t h = 0x3C00; h < 0x4000; ++h) {
    const float mid = 0.5f * (half_bits_to_float(h) + half_bits_to_float(h + 1));
    CHECK(float_to_half_bits(mid) == ((h & 1) ? h + 1 : h));
  }
  for (std::uint16_t h = 0x0000; h < 0x0400; ++h) {
    const float mid = 0.5f * (half_bits_to_float(h) + half_bits_to_float(h + 1));
    CHECK(float_to_half_bits(mid) == ((h & 1) ? h + 1 : h));
  }
}

TEST_CASE("round_to_storage: fp32 and tf32 keep the value; 16-bit types round") {
  const float v = 1.0f + std::ldexp(1.0f, -20);
  CHECK(round_to_storage(DType::fp32, v) == v);
  CHECK(round_to_storage(DType::tf32, v) == v);
  CHECK(round_to_storage(DType::fp16, v) == 1.0f);
  CHECK(round_to_storage(DType::bf16, v) == 1.0f);
}

TEST_CASE("HostTensor stores the storage format and decodes exactly") {
  HostTensor t(DType::bf16, 3);
  CHECK(t.bytes() == 6);
  t.set(0, 1.0f + std::ldexp(1.0f, -12));
  CHECK(t.get(0) == 1.0f);
  t.set(1, -3.5f);
  CHECK(t.get(1) == -3.5f);
  HostTensor f(DType::tf32, 2);
  CHECK(f.dtype() == DType::fp32);
  CHECK(f.bytes() == 8);
  HostTensor m(DType::fp16, 12);  // [3][4], used as [3][2] with ld 4
  for (std::size_t i = 0; i < 12; ++i) m.set(i, static_cast<float>(i));
  const auto p = m.packed(3, 2, 4);
  CHECK(p == std::vector<double>{0, 1, 4, 5, 8, 9});
  CHECK_THROWS_AS(m.packed(4, 2, 4), InvalidArgument);
  CHECK_THROWS_AS(m.packed(3, 5, 4), InvalidArgument);
}

TEST_CASE("poison patterns read as NaN in their type") {
  CHECK(std::isnan(half_bits_to_float(nan_bits16(DType::fp16))));
  CHECK(std::isnan(bf16_bits_to_float(nan_bits16(DType::bf16))));
  CHECK(std::isnan(std::bit_cast<float>(nan_word(DType::fp32))));
  CHECK(std::isnan(std::bit_cast<float>(nan_word(DType::tf32))));
  for (DType d : {DType::fp16, DType::bf16}) {
    const std::uint32_t w = nan_word(d);
    CHECK(static_cast<std::uint16_t>(w) == nan_bits16(d));
    CHECK(static_cast<std::uint16_t>(w >> 16) == nan_bits16(d));
  }
  CHECK_THROWS_AS(nan_bits16(DType::fp32), InvalidArgument);
  for (DType d : {DType::fp32, DType::fp16, DType::bf16}) {
    HostTensor t(d, 5);
    t.poison();
    for (std::size_t i = 0; i < t.size(); ++i) CHECK(std::isnan(t.get(i)));
  }
}

TEST_CASE("random fills: never zero, in range, seeded reproducibly, fresh otherwise") {
  for (DType d : {DType::fp32, DType::fp16, DType::bf16}) {
    HostTensor u(d, 20000);
    fill_random(u, Distribution::non_centred, 7);
    double sum = 0;
    for (std::size_t i = 0; i < u.size(); ++i) {
      REQUIRE(u.get(i) != 0.0f);
      REQUIRE(u.get(i) >= 0.0f);
      REQUIRE(u.get(i) <= 1.0f);  // rounding may reach 1 in 16-bit types
      sum += u.get(i);
    }
    CHECK(sum / u.size() == doctest::Approx(0.5).epsilon(0.03));
    HostTensor n(d, 20000);
    fill_random(n, Distribution::centred, 8);
    double s1 = 0, s2 = 0;
    for (std::size_t i = 0; i < n.size(); ++i) {
      REQUIRE(n.get(i) != 0.0f);
      s1 += n.get(i);
      s2 += double(n.get(i)) * n.get(i);
    }
    const double mean = s1 / n.size();
    CHECK(std::abs(mean) < 0.05);
    CHECK(std::sqrt(s2 / n.size() - mean * mean) == doctest::Approx(1.0).epsilon(0.05));
  }
  // Draws far below fp16's smallest subnormal would be zeros: they are drawn again.
  HostTensor tiny(DType::fp16, 5000);
  fill_normal(tiny, 0.0, 1e-7, 3);
  for (std::size_t i = 0; i < tiny.size(); ++i) REQUIRE(tiny.get(i) != 0.0f);
  // A distribution that can only give zeros is an error, not a hang.
  HostTensor zeros(DType::fp16, 1);
  CHECK_THROWS_AS(fill_uniform(zeros, 0.0, 1e-30, 1), InvalidArgument);
  CHECK_THROWS_AS(fill_uniform(zeros, 1.0, 1.0, 1), InvalidArgument);

  HostTensor a(DType::bf16, 64), b(DType::bf16, 64), c(DType::bf16, 64);
  CHECK(fill_random(a, Distribution::centred, 42) == 42);
  fill_random(b, Distribution::centred, 42);
  CHECK(a.to_doubles() == b.to_doubles());
  const std::uint64_t s1 = fill_random(b, Distribution::centred);
  const std::uint64_t s2 = fill_random(c, Distribution::centred);
  CHECK(s1 != s2);
  CHECK(b.to_doubles() != c.to_doubles());
  std::set<std::uint64_t> seeds;
  for (int i = 0; i < 16; ++i) seeds.insert(fresh_seed());
  CHECK(seeds.size() == 16);
}

TEST_CASE("distribution names") {
  CHECK(parse_distribution("centred") == Distribution::centred);
  CHECK(parse_distribution("non_centred") == Distribution::non_centred);
  CHECK(parse_distribution(name(Distribution::non_centred)) == Distribution::non_centred);
  CHECK_THROWS_AS(parse_distribution("gaussian"), InvalidArgument);
}

TEST_CASE("tf32 rounding keeps 10 mantissa bits, ties away from zero") {
  CHECK(round_to_tf32(1.0f) == 1.0f);
  CHECK(round_to_tf32(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f);  // tie: away from zero
  CHECK(round_to_tf32(-(1.0f + 0x1p-11f)) == -(1.0f + 0x1p-10f));
  CHECK(round_to_tf32(1.0f + 0x1p-12f) == 1.0f);  // below half: down
  CHECK(round_to_tf32(1.0f + 0x1p-11f + 0x1p-20f) == 1.0f + 0x1p-10f);
  CHECK(std::isinf(round_to_tf32(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(round_to_tf32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("tf32 truncation keeps 10 mantissa bits and drops the rest") {
  CHECK(truncate_to_tf32(1.0f) == 1.0f);
  CHECK(truncate_to_tf32(1.0f + 0x1p-11f) == 1.0f);  // a tie: dropped, where rounding goes up
  CHECK(truncate_to_tf32(1.0f + 0x1p-10f - 0x1p-23f) == 1.0f);
  CHECK(truncate_to_tf32(-(1.0f + 0x1p-10f + 0x1p-12f)) == -(1.0f + 0x1p-10f));  // toward zero
  CHECK(truncate_to_tf32(3.0f) == 3.0f);
  CHECK(std::isinf(truncate_to_tf32(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(truncate_to_tf32(std::numeric_limits<float>::quiet_NaN())));
}
