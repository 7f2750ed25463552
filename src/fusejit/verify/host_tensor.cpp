#include "fusejit/verify/host_tensor.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "fusejit/error.hpp"

namespace fusejit {

namespace {

// `m >> shift` rounded to nearest, ties to even (shift in 1..31).
std::uint32_t shift_round_even(std::uint32_t m, int shift) {
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((std::uint32_t{1} << shift) - 1);
  const std::uint32_t half = std::uint32_t{1} << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

template <class Draw>
std::uint64_t fill_with(HostTensor& t, std::optional<std::uint64_t> seed, Draw draw) {
  const std::uint64_t s = seed ? *seed : fresh_seed();
  std::mt19937_64 rng(s);
  for (std::size_t i = 0; i < t.size(); ++i) {
    // The storage type decides zero-ness: a tiny draw may round to 0 in fp16.
    float v = 0.0f;
    for (int attempt = 0; v == 0.0f; ++attempt) {
      if (attempt == 1000)
        throw InvalidArgument("distribution",
                              "its draws keep rounding to zero in " + std::string(name(t.dtype())));
      v = round_to_storage(t.dtype(), static_cast<float>(draw(rng)));
    }
    t.set(i, v);
  }
  return s;
}

}  // namespace

std::uint16_t float_to_half_bits(float v) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(v);
  const auto sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
  const std::uint32_t exp = (f >> 23) & 0xFFu;
  const std::uint32_t mant = f & 0x7FFFFFu;
  if (exp == 0xFFu) {
    if (mant == 0) return static_cast<std::uint16_t>(sign | 0x7C00u);
    // Keep the payload's top bits and force the quiet bit so it can never become inf.
    return static_cast<std::uint16_t>(sign | 0x7E00u | (mant >> 13));
  }
  const int e = static_cast<int>(exp) - 127 + 15;  // the half's biased exponent
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (e <= 0) {
    // Subnormal half: value / 2^-24 = (1.mant) * 2^(exp - 126); below 2^-25 it rounds to 0.
    if (e < -10) return sign;
    const std::uint32_t m = mant | 0x800000u;
    // A carry out of the subnormal range lands exactly on the smallest normal (0x0400).
    return static_cast<std::uint16_t>(sign | shift_round_even(m, 14 - e));
  }
  // Normal: round the 23-bit mantissa to 10 bits; a carry bumps the exponent (up to inf).
  const std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFu;
  const std::uint32_t r = h + ((rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u);
  return static_cast<std::uint16_t>(sign | r);
}

float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(mant), -24);  // exact: mant < 2^10
    return sign ? -mag : mag;
  }
  if (exp == 31)
    return std::bit_cast<float>(sign | 0x7F800000u | (mant ? (0x400000u | (mant << 13)) : 0u));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t float_to_bf16_bits(float v) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(v);
  if ((f & 0x7F800000u) == 0x7F800000u && (f & 0x7FFFFFu))
    return static_cast<std::uint16_t>((f >> 16) | 0x0040u);  // quiet NaN, sign kept
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest even on the bit pattern; it also
  // handles subnormals and overflows to inf.
  const std::uint32_t bias = 0x7FFFu + ((f >> 16) & 1u);
  return static_cast<std::uint16_t>((f + bias) >> 16);
}

float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

float round_to_storage(DType dtype, float v) {
  switch (storage_type(dtype)) {
    case DType::fp16:
      return half_bits_to_float(float_to_half_bits(v));
    case DType::bf16:
      return bf16_bits_to_float(float_to_bf16_bits(v));
    default:
      return v;
  }
}

float round_to_tf32(float v) {
  if (!std::isfinite(v)) return v;
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &bits, 4);
  return v;
}

float truncate_to_tf32(float v) {
  if (!std::isfinite(v)) return v;
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits &= 0xffffe000u;
  std::memcpy(&v, &bits, 4);
  return v;
}

std::string_view name(Distribution d) {
  return d == Distribution::centred ? "centred" : "non_centred";
}

Distribution parse_distribution(std::string_view s) {
  if (s == "centred" || s == "centered" || s == "normal" || s == "randn")
    return Distribution::centred;
  if (s == "non_centred" || s == "non_centered" || s == "uniform" || s == "rand")
    return Distribution::non_centred;
  throw InvalidArgument("distribution", "expected centred (randn) or non_centred (rand); got '" +
                                            std::string(s) + "'");
}

std::uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

HostTensor::HostTensor(DType dtype, std::size_t count)
    : dtype_(storage_type(dtype)), count_(count), bytes_(count * storage_bytes(dtype)) {}

float HostTensor::get(std::size_t i) const {
  if (dtype_ == DType::fp32) {
    float v;
    std::memcpy(&v, bytes_.data() + 4 * i, 4);
    return v;
  }
  std::uint16_t b;
  std::memcpy(&b, bytes_.data() + 2 * i, 2);
  return dtype_ == DType::fp16 ? half_bits_to_float(b) : bf16_bits_to_float(b);
}

void HostTensor::set(std::size_t i, float v) {
  if (dtype_ == DType::fp32) {
    std::memcpy(bytes_.data() + 4 * i, &v, 4);
    return;
  }
  const std::uint16_t b = dtype_ == DType::fp16 ? float_to_half_bits(v) : float_to_bf16_bits(v);
  std::memcpy(bytes_.data() + 2 * i, &b, 2);
}

std::vector<double> HostTensor::to_doubles() const {
  std::vector<double> out(count_);
  for (std::size_t i = 0; i < count_; ++i) out[i] = get(i);
  return out;
}

std::vector<double> HostTensor::packed(std::size_t rows, std::size_t cols, std::size_t ld) const {
  if (cols > ld || (rows > 0 && (rows - 1) * ld + cols > count_))
    throw InvalidArgument("ld", fmt::format("[{}][{}] with row stride {} exceeds {} elements", rows,
                                            cols, ld, count_));
  std::vector<double> out(rows * cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) out[r * cols + c] = get(r * ld + c);
  return out;
}

void HostTensor::poison() {
  if (dtype_ == DType::fp32) {
    const std::uint32_t w = nan_word(DType::fp32);
    for (std::size_t i = 0; i < count_; ++i) std::memcpy(bytes_.data() + 4 * i, &w, 4);
  } else {
    const std::uint16_t b = nan_bits16(dtype_);
    for (std::size_t i = 0; i < count_; ++i) std::memcpy(bytes_.data() + 2 * i, &b, 2);
  }
}

std::uint64_t fill_normal(HostTensor& t, double mean, double stddev,
                          std::optional<std::uint64_t> seed) {
  std::normal_distribution<double> dist(mean, stddev);
  return fill_with(t, seed, [&](std::mt19937_64& rng) { return dist(rng); });
}

std::uint64_t fill_uniform(HostTensor& t, double lo, double hi, std::optional<std::uint64_t> seed) {
  if (!(hi > lo))
    throw InvalidArgument("hi", fmt::format("expected hi > lo; got [{}, {})", lo, hi));
  std::uniform_real_distribution<double> dist(lo, hi);
  return fill_with(t, seed, [&](std::mt19937_64& rng) { return dist(rng); });
}

std::uint64_t fill_random(HostTensor& t, Distribution d, std::optional<std::uint64_t> seed) {
  return d == Distribution::centred ? fill_normal(t, 0.0, 1.0, seed)
                                    : fill_uniform(t, 0.0, 1.0, seed);
}

std::uint16_t nan_bits16(DType dtype) {
  switch (storage_type(dtype)) {
    case DType::fp16:
      return 0x7E00u;
    case DType::bf16:
      return 0x7FC0u;
    default:
      throw InvalidArgument("dtype", fmt::format("{} is not a 16-bit type", name(dtype)));
  }
}

std::uint32_t nan_word(DType dtype) {
  if (storage_type(dtype) == DType::fp32) return 0x7FC00000u;
  const std::uint32_t h = nan_bits16(dtype);
  return (h << 16) | h;
}

}  // namespace fusejit
