// Hashing for cache keys and entry checksums (xxHash: fast, stable across platforms and
// releases, so a key computed today names the same entry tomorrow).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace fusejit {

// Streams fields into XXH3-128. Every field is preceded by its length, so the boundaries
// between fields are part of what is hashed: ("ab", "c") and ("a", "bc") differ.
class Hasher {
 public:
  Hasher();
  Hasher(const Hasher& other);
  Hasher& operator=(const Hasher& other);
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  ~Hasher();

  Hasher& add(std::string_view bytes);
  Hasher& add(const void* data, std::size_t size);
  // Eight little-endian bytes, the same on every host.
  Hasher& add(std::uint64_t value);

  // XXH3-128 of the fields so far as 32 lowercase hex digits (high half first). The hasher
  // stays usable: more fields may follow.
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// XXH3-64 of one buffer (the payload checksum of cache entries).
std::uint64_t xxh3_64(const void* data, std::size_t size);

}  // namespace fusejit
