// KernelConfig::input_stats: whether a run's statistics came from x (kernels/input_stats.cuh),
// which the statistics GEMM and fj_finalize ask before they do anything.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/input_stats.h"
#include "common/params.h"
#include "common/spec_flag.cuh"

namespace fj {

FJ_SPEC_FLAG(InputStatsSet, INPUT_STATS, false);

// The region's flag after fj_input_stats: true when the run's statistics come from x (no
// column cancelled too much), so the statistics GEMM and fj_finalize's merge are not needed.
// Waits for the previous grid first (these kernels go out as its programmatic dependents).
template <class Spec>
__device__ __forceinline__ bool statistics_from_input(const Params& p) {
  if constexpr (!InputStatsSet<Spec>::value) {
    return false;
  } else {
    wait_for_prior_grid();
    constexpr InputStatsLayout L = input_stats_layout(Spec::N, input_stats_kp(Spec::K));
    return p.input_stats != 0 &&
           reinterpret_cast<const volatile unsigned*>(p.ws_xstats)[L.flag] == 0u;
  }
}

}  // namespace fj
