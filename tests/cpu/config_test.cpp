#include <doctest/doctest.h>

#include <set>

#include "fusejit/config/kernel_config.hpp"
#include "fusejit/error.hpp"

using namespace fusejit;

namespace {

Problem problem(DType d, Mode m, std::int64_t M = 1024, std::int64_t N = 1024,
                std::int64_t K = 1024) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

}  // namespace

TEST_CASE("config keys round-trip and are distinct") {
  std::set<std::string> keys;
  for (const char* arch : {"sm_80", "sm_86", "sm_90a"}) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
      for (const auto& c : candidate_configs(problem(d, Mode::train), dev)) {
        const KernelConfig back = KernelConfig::parse(c.key());
        CHECK(back.key() == c.key());
        keys.insert(c.key());
      }
    }
  }
  CHECK(keys.size() >= 6);
  CHECK_THROWS_AS(KernelConfig::parse("tiled.128x128"), InvalidArgument);
  CHECK_THROWS_AS(KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8junk"), InvalidArgument);
  CHECK_THROWS_AS(KernelConfig::parse("gemm.1x1x1"), InvalidArgument);
}

TEST_CASE("every candidate is valid for its device, and pruning says why") {
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_120"}) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
      const auto cs = candidate_configs(problem(d, Mode::eval), dev);
      REQUIRE(!cs.empty());
      for (const auto& c : cs) CHECK(c.valid_for(problem(d, Mode::eval), dev));
    }
  }
  // wgmma exists only on sm_90a; strict fp32 has no wgmma path; TMA needs 16-byte rows.
  KernelConfig ws = KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p0");
  CHECK(!ws.valid_for(problem(DType::bf16, Mode::eval), Device::for_arch("sm_80")));
  CHECK(!ws.valid_for(problem(DType::fp32, Mode::eval), Device::for_arch("sm_90a")));
  Problem unaligned = problem(DType::bf16, Mode::eval, 64, 64, 5);
  unaligned.alignment = 2;
  CHECK(ws.why_invalid(unaligned, Device::for_arch("sm_90a")).find("16-byte") != std::string::npos);
  // A config whose shared memory exceeds the device's limit is pruned.
  KernelConfig huge = KernelConfig::parse("tiled.128x256x64.w2x4.s3.g8");
  CHECK(huge.why_invalid(problem(DType::bf16, Mode::eval), Device::for_arch("sm_86"))
            .find("shared memory") != std::string::npos);
  CHECK_THROWS_AS(default_config(problem(DType::bf16, Mode::eval), Device::for_arch("sm_80"),
                                 Variant::warpspec),
                  InvalidArgument);
}

TEST_CASE("architectures parse and older than sm_80 are refused") {
  CHECK(parse_arch("sm_90a").cc == 90);
  CHECK(parse_arch("sm_90a").arch_specific);
  CHECK(parse_arch("8.6").cc == 86);
  CHECK(parse_arch("compute_120").cc == 120);
  CHECK(Device::for_arch("sm_90").arch() == "sm_90a");
  CHECK(Device::for_arch("sm_89").arch() == "sm_89");
  CHECK_THROWS_AS(parse_arch("sm_75"), InvalidArgument);
  CHECK_THROWS_AS(parse_arch("hopper"), InvalidArgument);
}

TEST_CASE("pruning mirrors the mainloops' static limits") {
  const Device dev = Device::for_arch("sm_90a");
  Problem p = problem(DType::bf16, Mode::eval);
  // 64x128 warp tile: 256 accumulators per thread.
  CHECK(KernelConfig::parse("tiled.128x256x64.w2x2.s3.g8")
            .why_invalid(p, dev)
            .find("128 accumulators") != std::string::npos);
  // 24 bf16 = 48 bytes per k-row: not a power of two.
  CHECK(
      KernelConfig::parse("tiled.128x128x24.w2x2.s3.g8").why_invalid(p, dev).find("power of two") !=
      std::string::npos);
  p.dtype = DType::fp32;
  CHECK(KernelConfig::parse("tiled.128x128x16.w4x4.s3.g8").why_invalid(p, dev).find("2048") !=
        std::string::npos);
  CHECK(KernelConfig::parse("tiled.128x128x16.w4x2.s3.g8").valid_for(p, dev));
}
