// KernelConfig::parse: any text is a config or InvalidArgument("config"); a parsed config's key()
// parses back to a config with the same key. A parsed config then goes where a user-supplied
// PlanOptions::config goes first, why_invalid() against real problems and devices, which must
// answer (valid or why not) for any field values without undefined behaviour.
#include <cstdint>
#include <string>

#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fuzz_check.hpp"

namespace {

fusejit::Problem problem(fusejit::DType dtype, fusejit::Mode mode) {
  fusejit::Problem p;
  p.M = 1000, p.N = 4096, p.K = 512;
  p.dtype = dtype;
  p.mode = mode;
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = fusejit::fuzz::as_string(data, size);
  fusejit::KernelConfig c;
  try {
    c = fusejit::KernelConfig::parse(text);
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(e.argument() == "config", "rejected with argument '%s'", e.argument().c_str());
    return 0;
  }
  const std::string key = c.key();
  fusejit::KernelConfig again;
  try {
    again = fusejit::KernelConfig::parse(key);
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(false, "key '%s' of a parsed config does not parse: %s", key.c_str(), e.what());
  }
  FJ_FUZZ_CHECK(again.key() == key, "'%s' re-parses to '%s'", key.c_str(), again.key().c_str());

  static const fusejit::Device devices[] = {fusejit::Device::for_arch("sm_80"),
                                            fusejit::Device::for_arch("sm_90a")};
  for (const auto& d : devices)
    for (auto dtype : {fusejit::DType::fp32, fusejit::DType::bf16})
      for (auto mode : {fusejit::Mode::train, fusejit::Mode::eval}) {
        const fusejit::Problem p = problem(dtype, mode);
        const std::string why = c.why_invalid(p, d);
        // A config it calls valid must be one the kernels can be built from.
        if (why.empty())
          FJ_FUZZ_CHECK(c.bm > 0 && c.bn > 0 && c.bk > 0 && c.stages >= 2 && c.threads() > 0 &&
                            c.threads() <= 1024 && c.smem_bytes(p) <= d.smem_per_block_optin &&
                            c.split_k >= 1 && c.split_k <= fusejit::KernelConfig::kMaxSplitK &&
                            c.split_k <= (p.K + c.bk - 1) / c.bk &&
                            c.splitk_reduce_smem_bytes() <= d.smem_per_block_optin,
                        "'%s' accepted for %s", key.c_str(), d.arch().c_str());
      }
  return 0;
}
