#include "fusejit/device/driver.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/tma_descriptor.hpp"

namespace fusejit {

void launch_warpspec(const PlanCore& c, CUstream stream, const fj::Params& params,
                     const Tensors& t) {
  WarpspecTensorMaps maps = warpspec_tensor_maps(c.problem, c.config, t.x, t.w, t.y);
  fj::Params prm = params;
  void* args[] = {&prm, &maps.x, &maps.w, &maps.y};
  const auto threads = static_cast<unsigned>(c.config.threads());
  const auto smem = static_cast<unsigned>(c.smem_bytes);
  const Driver& d = driver();
  if (c.config.cluster_m == 1) {
    check(d.cuLaunchKernel(c.gemm, c.gemm_grid, 1, 1, threads, 1, 1, smem, stream, args, nullptr),
          "cuLaunchKernel(fj_gemm)");
    return;
  }
  CUlaunchAttribute cluster{};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = static_cast<unsigned>(c.config.cluster_m);
  cluster.value.clusterDim.y = 1;
  cluster.value.clusterDim.z = 1;
  CUlaunchConfig cfg{};
  cfg.gridDimX = c.gemm_grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = threads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  check(d.cuLaunchKernelEx(&cfg, c.gemm, args, nullptr), "cuLaunchKernelEx(fj_gemm, cluster)");
}

}  // namespace fusejit
