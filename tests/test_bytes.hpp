// Cache keys and payloads for the cache tests. Header-only.
#pragma once
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "fusejit/util/hash.hpp"

namespace fusejit::test {

// A well-formed cache key (32 lowercase hex digits) that names `name`.
inline std::string key_for(const std::string& name) {
  return fusejit::Hasher().add(name).hex();
}

// Random bytes, none of them zero, so a payload of zeros can never pass by accident.
inline std::vector<char> payload(std::size_t size, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(1, 255);
  std::vector<char> out(size);
  for (char& c : out) c = static_cast<char>(byte(rng));
  return out;
}

}  // namespace fusejit::test
