// A GPU as fusejit sees it: what the planner needs to pick and launch kernels.
#pragma once

#include <cstdint>
#include <string>

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

struct Device {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int smem_per_block_optin = 0;  // bytes a block may use after raising its dynamic limit
  int smem_per_sm = 0;
  int regs_per_sm = 0;
  int l2_bytes = 0;
  int max_threads_per_sm = 0;
  int driver_version = 0;
  std::size_t total_memory = 0;

  // The device `ordinal`'s properties. Throws UnsupportedDevice when there is no driver, no such
  // GPU, or its compute capability is below 8.0.
  static Device get(int ordinal = 0);
  // The device of the calling thread's current context, or of ordinal 0 when none is current.
  static Device current();
  // A Device with only the architecture filled in, for compiling without a GPU ("sm_90a").
  static Device for_arch(const std::string& arch);

  int cc() const { return cc_major * 10 + cc_minor; }
  // The NVRTC target fusejit compiles for: sm_90a on Hopper (wgmma, setmaxnreg), else sm_XY.
  std::string arch() const;
  // The GPU as a tuning result depends on it: name, CC, driver version ("NVIDIA H100 80GB
  // HBM3|cc90|driver13000"). The tuning database adds the NVRTC and fusejit versions.
  std::string fingerprint() const;
};

// Parses "sm_80", "sm_90a", "compute_90", "90a" or "9.0" into (cc, arch-specific suffix).
// Throws InvalidArgument("arch", ...).
struct Arch {
  int cc = 0;
  bool arch_specific = false;  // the 'a' suffix
  std::string sm() const;      // "sm_90a"
};
Arch parse_arch(const std::string& text);

}  // namespace fusejit
#pragma GCC visibility pop
