// The exhaustive CPU tests (every config, arch, kernel set or batch size of an enumeration)
// check every N-th case when FUSEJIT_TEST_STRIDE=N is set, and every case by default.
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

namespace fusejit::test {

inline std::size_t test_stride() {
  const char* env = std::getenv("FUSEJIT_TEST_STRIDE");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1)
    throw std::invalid_argument(
        std::string("FUSEJIT_TEST_STRIDE: expected a positive integer, got '") + env + "'");
  return static_cast<std::size_t>(n);
}

// Whether case `index` of an enumeration is checked; `offset` (e.g. the arch's position) shifts
// the sample so that different groups keep different members.
inline bool in_sample(std::size_t index, std::size_t offset = 0) {
  return (index + offset) % test_stride() == 0;
}

}  // namespace fusejit::test
