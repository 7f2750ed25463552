// Variable batch sizes without a GPU: the heuristic's choice over M = 1..8192 for one layer maps
// onto at most one kernel set per M class (kMaxMClassesUpTo8192), the cache key of a kernel set
// does not depend on M, and the M classes are what `fusejit compile --every-m` warms.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "test_stride.hpp"

using namespace fusejit;

TEST_CASE("M = 1..8192 of one layer maps onto at most one kernel set per M class") {
  struct Layer {
    std::int64_t N, K;
    DType dtype;
  };
  for (const char* arch : {"sm_90a", "sm_80"})
    for (const Layer l : {Layer{4096, 4096, DType::bf16}, Layer{512, 1024, DType::bf16},
                          Layer{256, 64, DType::fp16}, Layer{1024, 1024, DType::tf32},
                          Layer{777, 2050, DType::bf16}, Layer{256, 256, DType::fp32}})
      for (const Mode mode : {Mode::train, Mode::eval}) {
        const Device d = Device::for_arch(arch);
        Problem p;
        p.N = l.N, p.K = l.K, p.dtype = l.dtype, p.mode = mode;
        CAPTURE(arch);
        CAPTURE(p.key());
        std::map<std::string, std::set<std::int64_t>> sets;  // cache key -> M classes using it
        std::map<std::int64_t, std::string> class_key;       // class lo -> its one cache key
        // Every M, or the FUSEJIT_TEST_STRIDE sample of them (test_stride.hpp).
        const auto step = static_cast<std::int64_t>(fusejit::test::test_stride());
        for (std::int64_t m = mode == Mode::train ? 2 : 1; m <= 8192; m += step) {
          p.M = m;
          const KernelConfig c = default_config(p, d);
          const std::string key = cache_key(generate(p, c), d.arch(), "13.0");
          const std::int64_t cls = m_class(m).lo;
          sets[key].insert(cls);
          // Within a class, every M gets the same kernel set.
          auto [it, fresh] = class_key.emplace(cls, key);
          if (!fresh && it->second != key) FAIL_CHECK(fmt::format("M = {} of class {}", m, cls));
        }
        MESSAGE(fmt::format("{} {} {}x{} {}: {} kernel sets for M = 1..8192", arch, name(mode), l.N,
                            l.K, name(l.dtype), sets.size()));
        CHECK(sets.size() <= kMaxMClassesUpTo8192);
      }
}

TEST_CASE("the ten batch sizes of the issue's loop need at most four kernel sets at 4096x4096") {
  const Device d = Device::for_arch("sm_90a");
  Problem p;
  p.N = p.K = 4096;
  std::set<std::string> keys;
  for (const std::int64_t m : {1000, 1001, 999, 1024, 512, 257, 2048, 4000, 3, 77}) {
    p.M = m;
    keys.insert(cache_key(generate(p, default_config(p, d)), d.arch(), "13.0"));
  }
  MESSAGE(keys.size(), " kernel sets");
  CHECK(keys.size() <= 4);
}
