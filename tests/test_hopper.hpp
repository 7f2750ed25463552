// For GPU tests of the warpspec variant, which needs sm_90: on other GPUs such a test says so
// and passes (nothing of it can run there).
#pragma once
#include <doctest/doctest.h>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"

namespace fusejit::test {

inline bool on_hopper() {
  primary_context(0);
  const Device dev = Device::current();
  if (dev.cc() == 90) return true;
  MESSAGE("warpspec needs sm_90; this GPU is sm_" << dev.cc() << ": nothing to run");
  return false;
}

}  // namespace fusejit::test
