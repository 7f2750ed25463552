// parse_arch: any text either names a compute capability >= 8.0 (at most three digits) or is
// rejected with InvalidArgument("arch"); Arch::sm() of a parsed arch parses back to it, and
// Device::for_arch gives a device of that capability.
#include <cstdint>
#include <string>

#include "fusejit/device.hpp"
#include "fusejit/error.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = fusejit::fuzz::as_string(data, size);
  fusejit::Arch a;
  try {
    a = fusejit::parse_arch(text);
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(e.argument() == "arch", "rejected with argument '%s'", e.argument().c_str());
    return 0;
  }
  FJ_FUZZ_CHECK(a.cc >= 80 && a.cc <= 999, "accepted cc %d", a.cc);
  const std::string sm = a.sm();
  const fusejit::Arch again = fusejit::parse_arch(sm);
  FJ_FUZZ_CHECK(again.cc == a.cc && again.arch_specific == a.arch_specific,
                "'%s' re-parses differently", sm.c_str());
  FJ_FUZZ_CHECK(again.sm() == sm, "sm() is not canonical");
  const fusejit::Device d = fusejit::Device::for_arch(text);
  FJ_FUZZ_CHECK(d.cc() == a.cc && d.smem_per_block_optin > 0, "for_arch disagrees with parse_arch");
  return 0;
}
