// The tiled-variant mainloop templates are real CUDA C++: nvcc compiles the standalone harness
// (tests/nvcc/mainloop_harness.cu, which instantiates them for every math kind, tails and odd
// alignments) for sm_80 and sm_90a. Needs nvcc, not a GPU; without nvcc the test says so and
// passes vacuously (NVRTC coverage lives in nvrtc_all_archs_test).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "test_process.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

namespace {

using fusejit::test::find_nvcc;
using Run = fusejit::test::CommandResult;
Run run(const std::string& cmd) {
  return fusejit::test::run_command(cmd);
}

}  // namespace

TEST_CASE("nvcc compiles the mainloop harness for sm_80 and sm_90a") {
  const char* src_env = std::getenv("FUSEJIT_SOURCE_DIR");
  REQUIRE_MESSAGE(src_env, "FUSEJIT_SOURCE_DIR is set by tests/CMakeLists.txt");
  const fs::path src(src_env);
  const fs::path harness = src / "tests" / "nvcc" / "mainloop_harness.cu";
  REQUIRE(fs::is_regular_file(harness));
  const std::string nvcc = find_nvcc();
  if (nvcc.empty()) {
    MESSAGE("nvcc not found on PATH or in /usr/local/cuda/bin: nothing to check");
    return;
  }
  const fs::path obj =
      fs::temp_directory_path() / ("fusejit-mainloop-harness-" + std::to_string(::getpid()) + ".o");
  // Both targets in one nvcc call, assembled in parallel (--threads): ptxas dominates the time.
  // Device-side ptxas at -O1: still a full assembly of every instruction, in about half the time.
  const std::string cmd =
      "'" + nvcc + "' -std=c++17 -c --threads 2 -Xptxas -O1 -Werror all-warnings" +
      " -gencode arch=compute_80,code=sm_80" + " -gencode arch=compute_90a,code=sm_90a -I'" +
      (src / "templates").string() + "' '" + harness.string() + "' -o '" + obj.string() + "'";
  const Run r = run(cmd);
  INFO("command: " << cmd);
  INFO("output:\n" << r.out);
  CHECK(r.code == 0);
  std::error_code ec;
  CHECK(fs::file_size(obj, ec) > 0);
  fs::remove(obj, ec);
}
