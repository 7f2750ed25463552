// Maps a linear tile index to (row tile, column tile). Consecutive indices walk GROUP_M row
// tiles down one column of tiles before moving right, so a wave of CTAs shares few W column
// tiles and x row tiles in L2 instead of streaming all of W once per row of tiles.
#pragma once
#include "common/limits.h"

namespace fj {

// The row tile count is the run's (M is a run-time value, common/rows.cuh); the host checks
// that row tiles x COL_TILES fits int for the largest M a plan accepts (KernelConfig::why_invalid).
template <int COL_TILES, int GROUP_M>
struct GroupedRaster {
  static_assert(fits_int(static_cast<long long>(GROUP_M) * COL_TILES),
                "GroupedRaster: GROUP_M x column tiles must fit int (KernelConfig::why_invalid)");
  int row_tiles;
  struct Tile {
    int row, col;
  };
  __device__ __forceinline__ int tiles() const { return row_tiles * COL_TILES; }
  __device__ __forceinline__ Tile tile(int linear) const {
    constexpr int kPerGroup = GROUP_M * COL_TILES;
    const int group = linear / kPerGroup;
    const int first_row = group * GROUP_M;
    const int rows_in_group = min(row_tiles - first_row, GROUP_M);
    const int in_group = linear % kPerGroup;
    return {first_row + in_group % rows_in_group, in_group / rows_in_group};
  }
};

}  // namespace fj
