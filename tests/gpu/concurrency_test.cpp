// 32 threads make plans for an overlapping set of problems at the same moment (so plan creation
// races in the in-process core cache, the disk cache and the compiler), then each runs its own
// plan on its own stream with its own buffers, several times back to back, and every result is
// held to the float64 reference: y, the running stats carried across the runs, the saved
// statistics and the batch counter.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/plan.hpp"
#include "gpu_required.hpp"
#include "tools/sweep.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;

namespace {

constexpr int kThreads = 32;
constexpr int kRuns = 4;

// bf16, fp16 and fp32, each in both modes and on two shapes; fp32 parameters, so the running
// stats the GPU carries from run to run are what the float64 chain carries, to fp32 rounding.
const char* const kProblems[] = {
    "256x192x128 bf16 train",
    "130x200x72 bf16 eval",
    "130x200x72 fp16 train nobias",
    "256x192x128 fp16 eval",
    "256x192x128 fp32 train momentum=none",
    "130x200x72 fp32 eval noaffine",
};
constexpr int kProblemCount = static_cast<int>(std::size(kProblems));

struct ThreadResult {
  bool ran = false;
  std::string error;  // an exception's text
  std::string problem;
  CaseErrors errors;
  double threshold = 0;
  bool cache_hit = false;
  std::uint64_t seed = 0;
};

void worker(int index, std::barrier<>& start, ThreadResult& out) {
  const SweepCase c = parse_sweep_line(kProblems[index % kProblemCount]);
  out.problem = c.text();
  out.threshold = sweep_threshold(c.problem.dtype);
  bool arrived = false;
  try {
    // Driver calls need a current context on this thread; Plan and the buffers use the primary.
    primary_context(0);
    const CaseInputs in = make_case_inputs(c, 0x5EED0000u + static_cast<std::uint64_t>(index));
    out.seed = in.seed;
    DeviceCase dev(in);
    const Stream stream;
    arrived = true;
    start.arrive_and_wait();  // every thread asks for its plan at once
    const Plan plan(c.problem);
    out.cache_hit = plan.cache_hit();
    // Back to back, no sync between: the running stats and the counter carry from run to run
    // in stream order.
    for (int r = 0; r < kRuns; ++r) plan.run(stream, dev.tensors());
    stream.synchronize();
    const CaseOutputs got = dev.download();

    // The same runs in float64, each step reading the stats the previous one left.
    ReferenceInputs ref_in = reference_inputs(in);
    ReferenceSettings settings = reference_settings(c.problem, in.num_batches_tracked);
    settings.threads = 1;  // 32 threads already share the cores
    ReferenceOutputs ref;
    for (int r = 0; r < kRuns; ++r) {
      ref = reference_forward(ref_in, settings);
      if (c.problem.mode == Mode::train) {
        ref_in.running_mean = ref.running_mean;
        ref_in.running_var = ref.running_var;
        settings.num_batches_tracked = ref.num_batches_tracked;
      }
    }
    out.errors = compare(in, got, ref);
    out.ran = true;
  } catch (const std::exception& e) {
    out.error = e.what();
    if (!arrived) start.arrive_and_drop();  // the others must not wait for this thread forever
  }
}

}  // namespace

TEST_CASE("32 threads make plans for overlapping problems at once and each run is right") {
  primary_context(0);
  std::vector<ThreadResult> results(kThreads);
  std::barrier<> start(kThreads);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> threads;
    threads.reserve(kThreads);
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] { worker(i, start, results[static_cast<std::size_t>(i)]); });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int passed = 0, hits = 0;
  double worst = 0;
  for (int i = 0; i < kThreads; ++i) {
    const ThreadResult& r = results[static_cast<std::size_t>(i)];
    CAPTURE(i);
    CAPTURE(r.problem);
    CAPTURE(r.seed);
    CHECK_MESSAGE(r.error.empty(), r.error);
    if (!r.ran) continue;
    const CaseErrors& e = r.errors;
    CAPTURE(e.y);
    CAPTURE(e.running_mean);
    CAPTURE(e.running_var);
    CAPTURE(e.save_mean);
    CAPTURE(e.save_invstd);
    const bool ok =
        e.worst() < r.threshold && !e.non_finite && e.counter_ok && e.padding_ok && e.stats_kept;
    CHECK(ok);
    passed += ok ? 1 : 0;
    hits += r.cache_hit ? 1 : 0;
    worst = std::max(worst, e.worst());
  }
  MESSAGE(
      fmt::format("concurrency: {} threads, {} problems, {} runs each ({} runs), {} passed, "
                  "{} plans from a cache, worst relative error {:.2e}, {:.1f} s",
                  kThreads, kProblemCount, kRuns, kThreads * kRuns, passed, hits, worst, seconds));
  CHECK(passed == kThreads);
}
