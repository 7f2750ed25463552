#include "fusejit/util/hash.hpp"

#include <array>
#include <new>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace fusejit {

// Over-aligned (XXH3 wants 64 bytes); C++17 aligned new honours that through make_unique.
struct Hasher::State {
  XXH3_state_t xxh;
};

namespace {

void check(XXH_errorcode code) {
  // XXH3 reports errors only for null arguments, which this wrapper never passes.
  if (code != XXH_OK) throw std::bad_alloc();
}

std::array<unsigned char, 8> little_endian(std::uint64_t value) {
  std::array<unsigned char, 8> bytes{};
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(value >> (8 * i));
  }
  return bytes;
}

}  // namespace

Hasher::Hasher() : state_(std::make_unique<State>()) {
  check(XXH3_128bits_reset(&state_->xxh));
}

Hasher::Hasher(const Hasher& other) : Hasher() {
  *this = other;
}

Hasher& Hasher::operator=(const Hasher& other) {
  if (this == &other) return *this;
  if (!other.state_) return *this = Hasher();
  if (!state_) state_ = std::make_unique<State>();
  XXH3_copyState(&state_->xxh, &other.state_->xxh);
  return *this;
}

Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;
Hasher::~Hasher() = default;

Hasher& Hasher::add(const void* data, std::size_t size) {
  // A moved-from hasher starts over instead of dereferencing null.
  if (!state_) *this = Hasher();
  const auto length = little_endian(size);
  check(XXH3_128bits_update(&state_->xxh, length.data(), length.size()));
  if (size != 0) check(XXH3_128bits_update(&state_->xxh, data, size));
  return *this;
}

Hasher& Hasher::add(std::string_view bytes) {
  return add(bytes.data(), bytes.size());
}

Hasher& Hasher::add(std::uint64_t value) {
  const auto bytes = little_endian(value);
  return add(bytes.data(), bytes.size());
}

std::string Hasher::hex() const {
  if (!state_) return Hasher().hex();
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(&state_->xxh));
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof(canonical.digest));
  for (unsigned char byte : canonical.digest) {
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 0xF]);
  }
  return out;
}

std::uint64_t xxh3_64(const void* data, std::size_t size) {
  return XXH3_64bits(data, size);
}

}  // namespace fusejit
