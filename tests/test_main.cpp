#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "fusejit/device/driver.hpp"
#include "gpu_required.hpp"

namespace fusejit::test {

bool gpu_required = false;

}  // namespace fusejit::test

int main(int argc, char** argv) {
  // GPU test executables set gpu_required through a static initializer (gpu_required.hpp).
  if (fusejit::test::gpu_required) {
    std::string why;
    if (!fusejit::driver_available(&why)) {
      std::cout << "SKIPPED: this test needs a GPU: " << why << "\n";
      return 77;
    }
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
