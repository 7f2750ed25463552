// The exhaustive CPU tests (every config, arch, kernel set or batch size of an enumeration)
// check one case in N when FUSEJIT_TEST_STRIDE=N is set, and every case by default.
//
// Why: the sanitizer builds (CMakePresets.json) run the CPU suite again to find memory and
// thread errors in fusejit's own host code. These tests run the same host code (codegen, the
// NVRTC wrapper, the cache key) for every case, and in the compile tests NVRTC itself,
// uninstrumented, takes almost all of the time. Six of them took 4,900 of the 6,000
// test-seconds of a CI run's ASan and TSan passes on two cores. The main build still checks
// every case; the sanitizer builds check a sample that keeps every arch.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fusejit/util/hash.hpp"

namespace fusejit::test {

inline std::size_t test_stride() {
  const char* env = std::getenv("FUSEJIT_TEST_STRIDE");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  // Bounded so that a loop stepping by it cannot overflow.
  if (*end != '\0' || n < 1 || n > 1'000'000)
    throw std::invalid_argument(
        std::string("FUSEJIT_TEST_STRIDE: expected an integer in 1..1000000, got '") + env + "'");
  return static_cast<std::size_t>(n);
}

// Whether the case named `key` is checked: one in test_stride() by a hash of the name (the
// library's xxh3_64, the same on every host), not by position, so that a sample of an
// enumeration that alternates (tiled, warpspec, tiled, ...) does not keep one kind only.
inline bool in_sample(std::string_view key) {
  return xxh3_64(key.data(), key.size()) % test_stride() == 0;
}

}  // namespace fusejit::test
