// The hot path: checking a run's tensors and enqueueing its kernels. Nothing here allocates,
// synchronizes, compiles or touches files.
#pragma once
#include <cuda.h>

#include <cstddef>

#include "common/params.h"
#include "fusejit/plan/plan_core.hpp"
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
}

// Grid sizes for every kernel of the plan (called once, when the core is built).
void size_launches(PlanCore&);
// Throws InvalidArgument naming the first tensor that is missing, misaligned or not wanted.
void validate_tensors(const Problem&, const Tensors&);
// Throws InvalidArgument("workspace") unless `workspace` holds `needed` bytes (of `bytes`
// given) and is kWorkspaceAlign-aligned; nothing to check when `needed` is 0.
void validate_workspace(const void* workspace, std::size_t bytes, std::size_t needed);
// Throws InvalidArgument("stream") when `stream` belongs to a CUDA context other than
// `context` (the plan's): the driver would refuse the launch with a bare CUDA error, or worse.
// The null, legacy and per-thread handles mean "the current context's", which the caller has
// made `context`, so they pass.
void validate_stream(CUcontext context, CUstream stream);
// Enqueues the plan's kernels on `stream`. `workspace` was checked by the caller.
void launch(const PlanCore&, CUstream stream, const Tensors&, void* workspace);
// The warpspec GEMM's launch: its TMA descriptors name the run's x and W, so they are encoded
// here, on the host, every run (a pure host call: no sync, no allocation).
void launch_warpspec(const PlanCore&, CUstream stream, const fj::Params& params, const Tensors&);

}  // namespace fusejit
