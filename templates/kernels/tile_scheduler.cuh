// Maps a linear tile index to (row tile, column tile). Consecutive indices walk GROUP_M row
// tiles down one column of tiles before moving right, so a wave of CTAs shares few W column
// tiles and x row tiles in L2 instead of streaming all of W once per row of tiles.
#pragma once
#include "common/limits.h"

namespace fj {

template <int ROW_TILES, int COL_TILES, int GROUP_M>
struct GroupedRaster {
  static_assert(fits_int(static_cast<long long>(ROW_TILES) * COL_TILES),
                "GroupedRaster: the tile count must fit int (KernelConfig::why_invalid)");
  static_assert(fits_int(static_cast<long long>(GROUP_M) * COL_TILES),
                "GroupedRaster: GROUP_M x column tiles must fit int (KernelConfig::why_invalid)");
  static constexpr int kTiles = ROW_TILES * COL_TILES;
  struct Tile {
    int row, col;
  };
  __device__ __forceinline__ static Tile tile(int linear) {
    constexpr int kPerGroup = GROUP_M * COL_TILES;
    const int group = linear / kPerGroup;
    const int first_row = group * GROUP_M;
    const int rows_in_group = min(ROW_TILES - first_row, GROUP_M);
    const int in_group = linear % kPerGroup;
    return {first_row + in_group % rows_in_group, in_group / rows_in_group};
  }
};

}  // namespace fj
