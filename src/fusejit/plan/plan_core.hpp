// What a plan needs at run time, built once per (problem, device, options) and shared.
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
  std::size_t coef_offset = 0, coef_bytes = 0;          // train, two-pass: [N] float2
  std::size_t splitk_offset = 0, splitk_bytes = 0;      // split-K: [S][tiles][BM * BN] float
  std::size_t total = 0;
};
WorkspaceLayout workspace_layout(const Problem&, const KernelConfig&);

struct LaunchShape {
  unsigned grid_x = 0, grid_y = 0, threads = 0;
};

struct PlanCore {
  Problem problem;
  KernelConfig config;
  Device device;
  CUcontext context = nullptr;
  KernelSchedule schedule;
  WorkspaceLayout workspace;
  std::shared_ptr<const Module> module;
  CUfunction gemm = nullptr, splitk_reduce = nullptr, finalize = nullptr, apply = nullptr,
             bump = nullptr;
  int smem_bytes = 0;
  unsigned gemm_grid = 0;
  unsigned gemm_splits = 1;  // the GEMM's grid y: split-K's S
  // From the module (templates/kernels/splitk_reduce.cuh, bn_*.cuh).
  LaunchShape splitk_reduce_shape, finalize_shape, apply_shape;
  int splitk_reduce_smem_bytes = 0;
  // How the kernels were obtained (for logs, `fusejit bench`, tests of the cache).
  bool cache_hit = false;
  double compile_seconds = 0;
};

// The core of (problem, config) in `context`, with kernels from `cache_dir` (empty: the
// default): built once per process (codegen, compile or load from the disk cache, module load,
// launch sizes) and shared by every plan and tuning candidate that asks for the same. The
// config must be valid for the problem on the context's device (KernelConfig::why_invalid).
std::shared_ptr<const PlanCore> plan_core(const Problem& problem, const KernelConfig& config,
                                          CUcontext context, const std::string& cache_dir);

}  // namespace fusejit
