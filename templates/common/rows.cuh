// The batch's row count M. Kernels compiled for one exact M (KernelConfig::exact_m) see it as
// the compile-time Spec::M, as before; the others (Spec::M == 0) read the run's from Params::m,
// so one compiled kernel set serves every batch size of a layer and a new M costs no compile.
#pragma once
#include "common/params.h"

namespace fj {

template <class Spec>
__device__ __forceinline__ int rows_of(const Params& p) {
  if constexpr (Spec::M > 0)
    return Spec::M;
  else
    return p.m;
}

// Row tiles of BM rows: (M + BM - 1) / BM, in int (M <= kMaxDim, common/limits.h).
template <class Spec>
__device__ __forceinline__ int row_tiles_of(const Params& p) {
  return (rows_of<Spec>(p) + Spec::BM - 1) / Spec::BM;
}

}  // namespace fj
