// The backward kernel set without a GPU: what it holds per mode, that its source names no M,
// the slab split and workspace layout the host and kernels share, and that every backward set
// compiles with NVRTC for every supported architecture.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

#include "common/backward_shape.h"
#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "test_nvrtc_jobs.hpp"
#include "tools/sweep.hpp"

using namespace fusejit;

TEST_CASE("backward kernel set per mode") {
  Problem p = parse_sweep_line("300x72x40 bf16 train").problem;
  CHECK(backward_kernel_set(p) == std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_coef",
                                                           "fj_bwd_da", "fj_bwd_params",
                                                           "fj_bwd_dx", "fj_bwd_dw"});
  p.mode = Mode::eval;
  CHECK(backward_kernel_set(p) ==
        std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_params", "fj_bwd_dx", "fj_bwd_dw"});
}

TEST_CASE("a backward source names no M: one kernel set for every batch size") {
  const Device dev = Device::for_arch("sm_90a");
  const Problem a = parse_sweep_line("300x72x40 bf16 train").problem;
  Problem b = a;
  b.M = 4096;
  // The config is chosen at one M (the dW GEMM's reduction is M): force the same one.
  const BackwardConfig c = default_backward_config(a, dev);
  const KernelSource sa = generate_backward(a, c), sb = generate_backward(b, c);
  CHECK(sa.text == sb.text);
  CHECK(sa.name == sb.name);
  CHECK(sa.text.find("300") == std::string::npos);
  // dx = da W: A (da) K-major, B (W) MN-major; dW = da^T x: both MN-major, reduction the run's M.
  CHECK(sa.text.find("struct DxSpec") != std::string::npos);
  CHECK(sa.text.find("ROWS = 0, COLS = 40, RED = 72") != std::string::npos);
  CHECK(sa.text.find("ROWS = 72, COLS = 40, RED = 0") != std::string::npos);
}

TEST_CASE("backward slabs cover the rows exactly, bounded in count") {
  for (long long m :
       {1LL, 2LL, 7LL, 63LL, 64LL, 65LL, 300LL, 4096LL, 4097LL, 65536LL, 1000003LL, 2147483391LL}) {
    CAPTURE(m);
    const fj::BackwardSlabs s = fj::backward_slabs(m);
    CHECK(s.count >= 1);
    CHECK(s.count <= fj::kBackwardMaxSlabs);
    CHECK(s.rows % fj::kBackwardRowThreads == 0);
    CHECK(static_cast<long long>(s.count) * s.rows >= m);
    CHECK(static_cast<long long>(s.count - 1) * s.rows < m);
  }
  // The bound a plan's workspace is laid out with covers every run of fewer rows.
  for (long long big : {64LL, 4095LL, 4100LL, 20000LL})
    for (long long m = 1; m <= big; m += 7) {
      CHECK(fj::backward_slabs(m).count <= fj::backward_slab_bound(big));
      CHECK(fj::backward_slab_bound(m) <= fj::backward_slab_bound(big));
    }
}

TEST_CASE("backward workspace: aligned regions, growing with the rows") {
  const Problem p = parse_sweep_line("5000x136x96 fp16 train").problem;
  std::size_t last = 0;
  for (std::int64_t rows : {2, 64, 65, 1000, 5000}) {
    const BackwardWorkspace w = backward_workspace(p, rows);
    for (std::size_t o : {w.dy_partials_offset, w.dz_partials_offset, w.coef_offset, w.da_offset})
      CHECK(o % kWorkspaceAlign == 0);
    CHECK(w.da_offset + static_cast<std::size_t>(rows) * 136 * 2 <= w.total);
    CHECK(w.total >= last);
    last = w.total;
  }
}

TEST_CASE("every backward kernel set compiles for every supported architecture") {
  const std::vector<std::string> archs = fusejit::test::supported_archs();
  std::vector<fusejit::test::CompileJob> jobs;
  const char* lines[] = {
      "300x72x40 {} train", "300x72x40 {} eval", "300x7x5 {} train same nobias noscale noaffine",
      "300x72x40 {} eval ldx=48 ldw=56 ldy=80 momentum=none", "100x10x6 {} train align=4"};
  for (const auto& arch : archs) {
    const Device dev = Device::for_arch(arch);
    // Every case on the two archs whose code paths differ most; the two modes on the others
    // (the CI machine compiles them all on two cores).
    const bool all = arch == "sm_80" || arch == "sm_90a";
    for (const char* dt : {"fp32", "tf32", "fp16", "bf16"})
      for (const char* l : lines) {
        if (!all && l != lines[0] && l != lines[1]) continue;
        const Problem p = parse_sweep_line(fmt::format(fmt::runtime(l), dt)).problem;
        jobs.push_back({arch, generate_backward(p, default_backward_config(p, dev))});
      }
  }
  MESSAGE(jobs.size() << " backward kernel sets over " << archs.size() << " architectures");
  const std::string failures = fusejit::test::compile_jobs(jobs);
  CHECK_MESSAGE(failures.empty(), failures);
}
