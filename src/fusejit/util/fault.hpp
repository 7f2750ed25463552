// Test-only fault injection: makes the pipeline's failure paths reachable on demand, so tests
// can prove that each failure surfaces as the right exception (or degrades as documented),
// leaves no partial cache entry behind, and that a retry after it succeeds.
//
// Each hook is one `if (fault::fire(Fault::x))` at the place where the real failure would
// happen, producing the same error the real failure produces. With nothing armed, fire() is a
// single relaxed atomic load, so the hooks cost nothing measurable in production.
//
// Armed by tests through arm(), or for a whole process (e.g. `fusejit compile` in a script)
// through FUSEJIT_FAULTS, read once on first use: a comma-separated list of fault names, each
// optionally followed by ":N" to fire N times (without it the fault fires on every call), e.g.
//   FUSEJIT_FAULTS=nvrtc_compile:1,disk_full
#pragma once
#include <optional>
#include <string_view>

namespace fusejit {

enum class Fault {
  nvrtc_compile,   // compile(): NVRTC reports a compilation error (CompileError)
  module_load,     // Module: cuModuleLoadData fails (CudaError)
  kernel_launch,   // Plan::run: the first cuLaunchKernel fails (CudaError, nothing enqueued)
  disk_full,       // write_file_atomically: a write after the first part fails with ENOSPC
  disk_read_only,  // write_file_atomically: creating the temp file fails with EACCES
  // Plan::run of a grid_sync, overlap_apply or input_stats plan, or a train BackwardPlan::run
  // that forms da (fj_bwd_resident): the driver refuses the cooperative launch as too large
  // (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), which the occupancy check of the plan should
  // prevent and was never seen on the H100; the run falls back to recompute's kernels (grid_sync,
  // input_stats), the two-pass passes (overlap_apply) or the three BatchNorm passes (backward).
  cooperative_too_large,
  // LtGemm::require_for_rows: cuBLASLt has no algorithm for the GEMM (CudaError), as for strides
  // or row counts its kernels do not run. A BackwardPlan then runs the heuristic's tiles for a
  // GEMM that its dispatch, not its caller, put on cuBLASLt (lt_declined_fallback).
  lt_no_algorithm,
  // LtGemm::runs_rows: cuBLASLt's algorithm, checked at a few row counts when the plan was made,
  // is refused at a run's other count. BackwardPlan::run then throws CudaError before it enqueues
  // anything.
  lt_rows_refused,
};
inline constexpr int kFaultCount = 8;

namespace fault {

// Fires every call until disarmed (arm's `times`).
inline constexpr int kAlways = -1;

// True when `f` is armed; consumes one of its remaining firings. Thread-safe.
bool fire(Fault f);
// Arms `f` for the next `times` calls of fire(f) (kAlways: every call), replacing any earlier
// count for it. times == 0 disarms it.
void arm(Fault f, int times = 1);
// Disarms every fault (including those armed from FUSEJIT_FAULTS).
void disarm_all();
// How many times fire(f) returned true in this process (tests assert the hook was reached).
int fired(Fault f);

std::string_view name(Fault f);
std::optional<Fault> parse(std::string_view name);

}  // namespace fault
}  // namespace fusejit
