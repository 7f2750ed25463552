// A loaded kernel set, built once per (kernel set, context, cache dir) and shared by every plan
// and tuning candidate it serves: with M a run-time value (codegen.hpp), that is every M of a
// layer in one schedule class.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/runtime/module.hpp"

namespace fusejit {

// Every workspace (a plan's, the reference op's) and each region in it starts on this boundary.
inline constexpr std::size_t kWorkspaceAlign = 256;
constexpr std::size_t align_workspace(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Where each region of a run's workspace lies (every offset 256-byte aligned); what the kernels
// are given in Params::ws_*. Empty regions have size 0.
struct WorkspaceLayout {
  std::size_t partials_offset = 0, partials_bytes = 0;  // train, two-pass: [row_tiles][N] float2
  std::size_t coef_offset = 0, coef_bytes = 0;          // train, two-pass: [N] float4
  std::size_t splitk_offset = 0, splitk_bytes = 0;      // split-K: [S][tiles][BM * BN] float
  // Synchronized statistics: [stat_ranks] rank records (common/column_stats.h), rank order.
  std::size_t ranks_offset = 0, ranks_bytes = 0;
  std::size_t rank_record_bytes = 0;
  // KernelConfig::pad_operands: W's N rows then x's M rows of padded_row_elements() elements
  // (Params::ws_padded; x's copy starts at padded_x_offset, the GEMM's tensor map of x).
  std::size_t padded_offset = 0, padded_bytes = 0, padded_x_offset = 0;
  // KernelConfig::overlap_apply: the in-kernel apply's counters (Params::ws_overlap).
  std::size_t overlap_offset = 0, overlap_bytes = 0;
  // KernelConfig::input_stats: fj_input_stats' region (Params::ws_xstats, InputStatsLayout).
  std::size_t xstats_offset = 0, xstats_bytes = 0;
  std::size_t total = 0;
};
// For runs of up to p.M rows (a run of fewer rows uses a prefix of each region's layout).
WorkspaceLayout workspace_layout(const Problem&, const KernelConfig&);

struct LaunchShape {
  unsigned grid_x = 0, grid_y = 0, threads = 0;
};

struct PlanCore {
  // The problem the set was first built for. Everything of it but M holds for every plan the
  // set serves; a run's M comes with the run (RunShape, plan/launch.hpp).
  Problem problem;
  // The problem as the warpspec GEMM's tensor maps see x and W: `problem`, or with
  // KernelConfig::pad_operands the padded copies' row strides (padded_operands_problem).
  Problem gemm_problem;
  KernelConfig config;
  Device device;
  CUcontext context = nullptr;
  std::shared_ptr<const Module> module;
  CUfunction gemm = nullptr, splitk_reduce = nullptr, finalize = nullptr, apply = nullptr,
             apply_fold = nullptr, bump = nullptr, rank_stats = nullptr, rank_finalize = nullptr,
             gemm_affine = nullptr, pad_operands = nullptr, input_stats = nullptr;
  int smem_bytes = 0, gemm_affine_smem_bytes = 0;
  // KernelConfig::grid_sync: how many of fj_gemm's CTAs are resident at once (resident_tiles()
  // from its occupancy); a run that resident_grid() cannot fit takes recompute's kernels.
  unsigned resident_tiles = 0;
  // KernelConfig::input_stats: the most CTAs of fj_input_stats the device holds at once (its
  // cooperative grid's bound), at most kInputStatsMaxCtas.
  unsigned input_stats_ctas = 0;
  // From the module (templates/kernels/splitk_reduce.cuh, bn_*.cuh). grid_x of the split-K
  // reduce is per output tile and of fj_apply per kApplyBlockRows-row slab.
  LaunchShape splitk_reduce_shape, finalize_shape, apply_shape, rank_finalize_shape;
  int splitk_reduce_smem_bytes = 0;
  // How the kernels were obtained (for logs, `fusejit bench`, tests of the cache).
  bool cache_hit = false;
  double compile_seconds = 0;
};

// A generated kernel set in the current context: the process's loaded module when it has one,
// else compiled or read from the disk cache at `cache_dir` and loaded (what every core does).
struct LoadedKernelSet {
  std::shared_ptr<const Module> module;
  bool cache_hit = false;
  double compile_seconds = 0;
};
LoadedKernelSet load_kernel_set(const KernelSource& src, const Device& device,
                                const std::string& cache_dir);
// A kernel's dynamic shared memory as the module's `symbol` says, checked against the device
// (InvalidArgument("config") naming `config_key` and `kernel`) and set as the function's limit:
// above 48 KiB it must be raised before launching.
int set_dynamic_smem(const Module& module, CUfunction f, const char* kernel, const char* symbol,
                     const Device& device, const std::string& config_key);

// The core of (problem, config) in `context`, with kernels from `cache_dir` (empty: the
// default): built once per process (codegen, compile or load from the disk cache, module load)
// and shared by every plan and tuning candidate whose problem and config give the same kernel
// set. The config must be valid for the problem on the context's device
// (KernelConfig::why_invalid). Cores are kept up to a bound (set_max_plan_cores), least
// recently used dropped first; a dropped core lives on in the plans that hold it.
// `built` (when given) says whether this call built the core (false: it was in the process).
std::shared_ptr<const PlanCore> plan_core(const Problem& problem, const KernelConfig& config,
                                          CUcontext context, const std::string& cache_dir,
                                          bool* built = nullptr);

}  // namespace fusejit
