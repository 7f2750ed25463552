#include <fmt/format.h>

#include "fusejit/device/driver.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/tma_descriptor.hpp"

namespace fusejit {

bool launch_warpspec(const PlanCore& c, const RunShape& shape, CUstream stream,
                     const fj::Params& params, const Tensors& t, RunCache* cache, CUfunction gemm,
                     int smem_bytes, const char* name, bool cooperative, bool dependent) {
  WarpspecTensorMaps fresh;
  const WarpspecTensorMaps* maps = &fresh;
  {
    const CacheClaim claim(cache ? &cache->busy : nullptr);
    if (claim) {
      if (!cache->valid || cache->x != t.x || cache->w != t.w || cache->y != t.y ||
          cache->rows != shape.rows) {
        cache->valid = false;  // stays so if encoding throws
        cache->maps = warpspec_tensor_maps(c.gemm_problem, c.config, shape.rows, t.x, t.w, t.y);
        cache->x = t.x, cache->w = t.w, cache->y = t.y, cache->rows = shape.rows;
        cache->valid = true;
      }
      fresh = cache->maps;
    } else {
      fresh = warpspec_tensor_maps(c.gemm_problem, c.config, shape.rows, t.x, t.w, t.y);
    }
  }
  fj::Params prm = params;
  void* args[] = {&prm, const_cast<CUtensorMap*>(&maps->x), const_cast<CUtensorMap*>(&maps->w),
                  const_cast<CUtensorMap*>(&maps->y)};
  const auto threads = static_cast<unsigned>(c.config.threads());
  const auto smem = static_cast<unsigned>(smem_bytes);
  const Driver& d = driver();
  if (c.config.cluster_m == 1 && !cooperative && !dependent) {
    const CUresult r =
        d.cuLaunchKernel(gemm, shape.gemm_grid, 1, 1, threads, 1, 1, smem, stream, args, nullptr);
    if (r != CUDA_SUCCESS) check(r, fmt::format("cuLaunchKernel({})", name).c_str());
    return true;
  }
  CUlaunchAttribute attrs[2]{};
  unsigned n_attrs = 0;
  if (cooperative) {
    attrs[n_attrs++] = cooperative_attribute();
  } else if (c.config.cluster_m > 1) {
    CUlaunchAttribute& a = attrs[n_attrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = static_cast<unsigned>(c.config.cluster_m);
    a.value.clusterDim.y = 1;
    a.value.clusterDim.z = 1;
  }
  if (dependent) attrs[n_attrs++] = programmatic_dependent_attribute();
  CUlaunchConfig cfg{};
  cfg.gridDimX = shape.gemm_grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = threads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n_attrs;
  const CUresult r = cooperative ? launch_cooperative(cfg, gemm, args)
                                 : d.cuLaunchKernelEx(&cfg, gemm, args, nullptr);
  if (r == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE && cooperative) return false;
  if (r != CUDA_SUCCESS)
    check(r, fmt::format("cuLaunchKernelEx({}, {})", name,
                         cooperative ? "cooperative" : (dependent ? "dependent" : "cluster"))
                 .c_str());
  return true;
}

}  // namespace fusejit
