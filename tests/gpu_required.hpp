// Include from a GPU test file (once) as FUSEJIT_GPU_TEST_EXECUTABLE to make the executable skip
// (exit 77, reported by ctest as skipped) on machines without a usable GPU.
#pragma once

namespace fusejit::test {
extern bool gpu_required;
struct MarkGpuRequired {
  MarkGpuRequired() { gpu_required = true; }
};
}  // namespace fusejit::test

#define FUSEJIT_GPU_TEST_EXECUTABLE \
  static ::fusejit::test::MarkGpuRequired fusejit_gpu_required_marker_
