// The hot path: checking a run's tensors and enqueueing its kernels. Nothing here allocates,
// synchronizes, compiles or touches files.
#pragma once
#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include "common/params.h"
#include "fusejit/comm/nccl_exchange.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/plan/tma_descriptor.hpp"
#include "fusejit/tensors.hpp"

namespace fusejit {

// The BatchNorm side of a run's tensors into a kernel parameter block (fj::Params for the fused
// kernels, fj::RefParams for the reference op's): one mapping, so the two cannot drift.
template <class KernelParams>
void set_batchnorm_params(KernelParams& prm, const Tensors& t) {
  prm.y = t.y;
  prm.scale = t.scale;
  prm.gamma = t.gamma;
  prm.beta = t.beta;
  prm.running_mean = t.running_mean;
  prm.running_var = t.running_var;
  prm.num_batches_tracked = reinterpret_cast<long long*>(t.num_batches_tracked);
  prm.save_mean = t.save_mean;
  prm.save_invstd = t.save_invstd;
  prm.saved = t.saved;
}

// What a run of `rows` rows launches: the grids and the kernels (a plan computes it once for
// its own M; Plan::run(rows) per call, a few integer operations).
struct RunShape {
  int rows = 0;
  unsigned gemm_grid = 0;
  unsigned gemm_splits = 1;  // the GEMM's grid y: split-K's S
  unsigned splitk_grid = 0, apply_grid = 0;
  unsigned pad_grid = 0;       // fj_pad_operands (KernelConfig::pad_operands), 0: not launched
  CUfunction apply = nullptr;  // fj_apply, fj_apply_fold, or none
  bool gemm = true;  // false: a synchronized rank with no rows (only the exchange and fj_bump)
  bool finalize = false, exchange = false, bump = false;
  bool affine = false;  // KernelConfig::recompute: fj_gemm_affine after the finalize
  // KernelSchedule::grid_sync: fj_gemm goes out alone as a cooperative launch of resident_grid
  // CTAs (resident_grid() from PlanCore::resident_tiles; no finalize, no affine pass). gemm_grid
  // stays the usual grid, which recompute's kernels take if the driver refuses the launch.
  bool grid_sync = false;
  unsigned resident_grid = 0;
  // KernelSchedule::overlap: fj_gemm goes out alone as a cooperative launch and applies y itself.
  bool overlap = false;
  // KernelSchedule::input_stats: fj_input_stats' cooperative grid (0: not launched), one CTA
  // per kInputStatsCtaRows rows or per kInputStatsWarps columns, whichever is more, up to
  // PlanCore::input_stats_ctas.
  unsigned input_stats_grid = 0;
  WorkspaceLayout workspace;  // the plan's: sized for its M, of which a run uses a prefix
};
// `rows` must lie within what `workspace` was laid out for (Plan::run checks).
RunShape run_shape(const PlanCore&, std::int64_t rows, const WorkspaceLayout& workspace);

// The launch attribute that makes a launch a programmatic dependent launch (sm_90+): the one
// place both launch_dependent and launch_warpspec (beside its cluster attribute) take it from.
CUlaunchAttribute programmatic_dependent_attribute();

// The attribute of a cooperative launch (grid_sync, overlap_apply, input_stats): the driver
// starts the grid only if all of its CTAs can be resident at once.
CUlaunchAttribute cooperative_attribute();
// cuLaunchKernelEx of `cfg`, a cooperative launch: the driver's result, or under the test-only
// fault cooperative_too_large (util/fault.hpp) its refusal,
// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, without asking it. The one place every cooperative
// launch goes out, so the fault reaches them all.
CUresult launch_cooperative(const CUlaunchConfig& cfg, CUfunction f, void** args);
// launch_cooperative of `grid` blocks of `threads` with `smem` bytes of dynamic shared memory;
// `dependent`: on sm_90+ also a programmatic dependent launch (the kernel waits for its
// predecessor itself).
CUresult launch_cooperative_grid(const Device& device, CUfunction f, unsigned grid,
                                 unsigned threads, unsigned smem, CUstream stream, void** args,
                                 bool dependent);

// Enqueues `f` on `stream` as a programmatic dependent launch of the kernel before it in the
// stream (on sm_90+; an ordinary launch before): grid_x x grid_y blocks of `threads`, `smem`
// bytes of dynamic shared memory. The kernel must wait for its predecessor itself before it
// touches memory (templates/common/grid_dependency.cuh). `what` names the launch in an error.
void launch_dependent(const Device& device, CUfunction f, unsigned grid_x, unsigned grid_y,
                      unsigned threads, unsigned smem, CUstream stream, void** args,
                      const char* what);

// What a plan's runs remember between calls, because a loop runs with the same stream and
// tensors again and again:
//  - the last stream found to belong to the plan's context (asking the driver, cuStreamGetCtx,
//    is a call per run otherwise);
//  - the warpspec kernel's tensor maps for the last (x, W, y, rows): encoding them is a pure
//    host call but costs about as much as a launch. One run at a time uses them (`busy`); a
//    concurrent run of the same plan encodes its own instead of waiting.
// A run's hold on a plan's cached tensor maps (RunCache::busy, BackwardRunCache::busy): taken
// only when free, so a concurrent run encodes its own instead of waiting, and given back on
// every way out of its scope, an encoding that throws included (else every later run would
// encode its own).
class CacheClaim {
 public:
  explicit CacheClaim(std::atomic_flag* busy) noexcept
      : busy_(busy && !busy->test_and_set(std::memory_order_acquire) ? busy : nullptr) {}
  ~CacheClaim() {
    if (busy_) busy_->clear(std::memory_order_release);
  }
  CacheClaim(const CacheClaim&) = delete;
  CacheClaim& operator=(const CacheClaim&) = delete;
  explicit operator bool() const { return busy_ != nullptr; }

 private:
  std::atomic_flag* busy_;
};

struct RunCache {
  std::atomic<CUstream> checked_stream{nullptr};
  std::atomic_flag busy;
  bool valid = false;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;
  int rows = 0;
  WarpspecTensorMaps maps{};
};

// Throws InvalidArgument(arg) unless `p` is a non-null pointer aligned to `align`. `what` is a
// callable giving the text for the error: nothing is formatted on the success path, which a run
// takes every call.
template <class What>
void require_pointer(const void* p, const char* arg, std::size_t align, What&& what) {
  if (p && reinterpret_cast<std::uintptr_t>(p) % align == 0) [[likely]]
    return;
  if (!p)
    throw InvalidArgument(arg, fmt::format("expected a device pointer ({}); got null", what()));
  throw InvalidArgument(
      arg, fmt::format("expected a {}-byte aligned pointer ({}); got {}", align, what(), p));
}
inline void require_pointer(const void* p, const char* arg, std::size_t align, const char* what) {
  require_pointer(p, arg, align, [what] { return what; });
}
// Throws InvalidArgument(arg) when `p` is not null.
inline void forbid(const void* p, const char* arg, const char* why) {
  if (p) throw InvalidArgument(arg, fmt::format("expected null: {}", why));
}
// The bytes a [rows][ld] tensor of `cols` columns of `elem_bytes` spans from its base:
// (rows - 1) ld + cols elements.
std::size_t tensor_span(std::int64_t rows, std::int64_t ld, std::int64_t cols,
                        std::size_t elem_bytes);
// Throws InvalidArgument(arg) when the `bytes` bytes from `p` share a byte with the
// `other_bytes` from `other` (named `other_arg`); `why` says why they must not. A null pointer
// or an empty range meets nothing (whether it may be null is checked apart). Formats nothing
// unless it throws.
void require_disjoint(const void* p, std::size_t bytes, const char* arg, const void* other,
                      std::size_t other_bytes, const char* other_arg, const char* why);
// A row-major matrix in memory: `rows` rows of `cols` elements, `ld` elements apart.
struct StridedBytes {
  const void* base;
  std::int64_t rows, ld, cols;
  std::size_t elem_bytes;
  std::size_t span() const { return tensor_span(rows, ld, cols, elem_bytes); }
  // Whether the two share a byte: exact where both have one row stride in bytes, else whether
  // their address ranges meet. Null meets nothing.
  bool meets(const StridedBytes& other) const;
};
// require_disjoint for two matrices, by StridedBytes::meets.
void require_disjoint(const StridedBytes& t, const char* arg, const StridedBytes& other,
                      const char* other_arg, const char* why);

// A per-column parameter of p ([N] in p.param_dtype) that the problem has (`present`, the Problem
// flag named `flag`) must be given and aligned; one it lacks must be null. Formats nothing unless
// it throws.
void require_param(const Problem& p, const void* ptr, bool present, const char* arg,
                   const char* flag);

// Throws InvalidArgument naming the first tensor that is missing, misaligned or not wanted, or
// whose address range over `rows` rows (0: the problem's M) meets one it must not: an output
// (y, saved) that of an operand (x, W) or of the other output, and any of the four that of the
// `workspace_bytes` of `workspace` the run writes. Formats nothing unless it throws.
void validate_tensors(const Problem&, const Tensors&, std::int64_t rows = 0,
                      const void* workspace = nullptr, std::size_t workspace_bytes = 0);
// Throws InvalidArgument("workspace") unless `workspace` holds `needed` bytes (of `bytes`
// given) and is kWorkspaceAlign-aligned; nothing to check when `needed` is 0.
void validate_workspace(const void* workspace, std::size_t bytes, std::size_t needed);
// Throws InvalidArgument("stream") when `stream` belongs to a CUDA context other than
// `context` (the plan's): the driver would refuse the launch with a bare CUDA error, or worse.
// The null, legacy and per-thread handles mean "the current context's", which a run makes
// `context` for its launches, so they pass: they name the plan's context's default stream.
void validate_stream(CUcontext context, CUstream stream);
// Enqueues a run of shape.rows rows on `stream`. `workspace` was checked by the caller, and
// sized for at least shape.rows rows. `cache`: the plan's, or null. `exchange`: required when
// shape.exchange (the plan's communicator), else unused.
void launch(const PlanCore&, const RunShape& shape, CUstream stream, const Tensors&,
            void* workspace, RunCache* cache = nullptr, const StatsExchange* exchange = nullptr);
// fj_input_stats (KernelConfig::input_stats) as a cooperative launch of shape.input_stats_grid
// CTAs with `args` (the run's fj::Params): false when the driver refuses it as
// too large for the device as it is now (nothing enqueued: the caller runs recompute's
// schedule), true when launched; other failures throw.
bool launch_input_stats(const PlanCore&, const RunShape& shape, CUstream stream, void** args);
// The warpspec GEMM's launch: its TMA descriptors name the run's x, W and y and its rows, so
// they are encoded on the host (a pure host call: no sync, no allocation) when those change.
// `gemm`/`smem_bytes`/`name`: fj_gemm's, or (recompute) fj_gemm_affine's, on the same tensor
// maps. `cooperative` (grid_sync, overlap_apply): a cooperative launch; false when the driver
// refuses it as too large for the device as it is now (nothing enqueued: the caller falls back),
// true when launched. `dependent` (recompute's fj_gemm_affine): a programmatic dependent launch
// on sm_90+, which the kernel waits out before it reads the previous kernel's results. Every
// other failure throws.
bool launch_warpspec(const PlanCore&, const RunShape& shape, CUstream stream,
                     const fj::Params& params, const Tensors&, RunCache* cache, CUfunction gemm,
                     int smem_bytes, const char* name, bool cooperative = false,
                     bool dependent = false);

}  // namespace fusejit
