#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"

#include <fmt/format.h>

#include <array>
#include <mutex>

#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"

namespace fusejit {

namespace {

int attr(CUdevice dev, CUdevice_attribute a) {
  int v = 0;
  FJ_CU(cuDeviceGetAttribute(&v, a, dev));
  return v;
}

}  // namespace

void require_device_ordinal(int ordinal) {
  int count = 0;
  FJ_CU(cuDeviceGetCount(&count));
  if (count == 0) throw UnsupportedDevice("no GPU: the driver reports 0 CUDA devices");
  if (ordinal < 0 || ordinal >= count)
    throw InvalidArgument("device", fmt::format("expected 0..{}, got {}", count - 1, ordinal));
}

Device Device::get(int ordinal) {
  const Driver& d = driver();
  require_device_ordinal(ordinal);
  CUdevice dev = 0;
  FJ_CU(cuDeviceGet(&dev, ordinal));
  Device out;
  out.ordinal = ordinal;
  std::array<char, 256> name{};
  FJ_CU(cuDeviceGetName(name.data(), static_cast<int>(name.size()), dev));
  out.name = name.data();
  out.cc_major = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  out.cc_minor = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  out.sm_count = attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  out.smem_per_block_optin = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  out.smem_per_sm = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  out.regs_per_sm = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  out.l2_bytes = attr(dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  out.max_threads_per_sm = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  out.driver_version = d.version;
  FJ_CU(cuDeviceTotalMem(&out.total_memory, dev));
  if (out.cc() < 80)
    throw UnsupportedDevice(fmt::format(
        "{} has compute capability {}.{}; fusejit needs 8.0 or newer (cp.async, bf16 mma.sync)",
        out.name, out.cc_major, out.cc_minor));
  return out;
}

Device Device::current() {
  CUcontext ctx = nullptr;
  FJ_CU(cuCtxGetCurrent(&ctx));
  if (!ctx) return get(0);
  CUdevice dev = 0;
  FJ_CU(cuCtxGetDevice(&dev));
  return get(static_cast<int>(dev));
}

Device Device::for_arch(const std::string& text) {
  Arch a = parse_arch(text);
  Device out;
  out.ordinal = -1;
  out.name = "(compile only: " + a.sm() + ")";
  out.cc_major = a.cc / 10;
  out.cc_minor = a.cc % 10;
  // Architectural limits, so configs can be pruned without a GPU.
  switch (a.cc) {
    case 80:
    case 87:
      out.smem_per_block_optin = 163 * 1024;
      break;
    case 86:
    case 89:
    case 120:
    case 121:
      out.smem_per_block_optin = 99 * 1024;
      break;
    default:
      out.smem_per_block_optin = 227 * 1024;
      break;
  }
  out.smem_per_sm = out.smem_per_block_optin + 1024;
  // The flagship part of each architecture; only the planners read it (the forward's time model,
  // the gradient GEMMs' split-K and cuBLASLt choices), so a GPU with fewer SMs may pick other
  // kernels than `fusejit compile --arch` precompiled for it.
  switch (a.cc) {
    case 80:
      out.sm_count = 108;
      break;
    case 90:
      out.sm_count = 132;
      break;
    case 100:
    case 103:
      out.sm_count = 148;
      break;
    case 120:
    case 121:
      out.sm_count = 170;
      break;
    default:
      out.sm_count = 84;
      break;
  }
  out.regs_per_sm = 65536;
  out.max_threads_per_sm = a.cc == 86 || a.cc == 89 || a.cc >= 120 ? 1536 : 2048;
  return out;
}

std::string Device::arch() const {
  // wgmma and setmaxnreg exist only in the arch-specific sm_90a target.
  return cc() == 90 ? std::string("sm_90a") : fmt::format("sm_{}", cc());
}

std::string Device::fingerprint() const {
  return fmt::format("{}|cc{}|driver{}", name, cc(), driver_version);
}

std::string Arch::sm() const {
  return fmt::format("sm_{}{}", cc, arch_specific ? "a" : "");
}

Arch parse_arch(const std::string& text) {
  std::string s = text;
  for (const char* prefix : {"sm_", "compute_"})
    if (s.rfind(prefix, 0) == 0) s = s.substr(std::string(prefix).size());
  Arch a;
  if (!s.empty() && (s.back() == 'a' || s.back() == 'f')) {
    a.arch_specific = s.back() == 'a';
    s.pop_back();
  }
  auto dot = s.find('.');
  if (dot != std::string::npos) s = s.substr(0, dot) + s.substr(dot + 1);
  bool digits =
      !s.empty() && s.size() <= 3 && s.find_first_not_of("0123456789") == std::string::npos;
  if (!digits)
    throw InvalidArgument("arch", "expected an architecture like sm_80, sm_90a or 8.6; got '" +
                                      printable(text) + "'");
  a.cc = std::stoi(s);
  if (a.cc < 80)
    throw InvalidArgument("arch", fmt::format("fusejit needs compute capability 8.0 or newer; "
                                              "got '{}'",
                                              printable(text)));
  return a;
}

CUcontext primary_context(int ordinal) {
  static std::mutex mu;
  static std::array<CUcontext, 64> retained{};
  if (ordinal < 0 || ordinal >= static_cast<int>(retained.size()))
    throw InvalidArgument("device", fmt::format("device ordinal {} out of range", ordinal));
  std::lock_guard<std::mutex> lock(mu);
  if (!retained[ordinal]) {
    require_device_ordinal(ordinal);
    CUdevice dev = 0;
    FJ_CU(cuDeviceGet(&dev, ordinal));
    FJ_CU(cuDevicePrimaryCtxRetain(&retained[ordinal], dev));
  }
  FJ_CU(cuCtxSetCurrent(retained[ordinal]));
  return retained[ordinal];
}

}  // namespace fusejit
