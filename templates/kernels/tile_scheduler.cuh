// Maps a linear tile index to (row tile, column tile). Consecutive indices walk GROUP_M row
// tiles down one column of tiles before moving right, so a wave of CTAs shares few W column
// tiles and x row tiles in L2 instead of streaming all of W once per row of tiles.
#pragma once
#include "common/limits.h"

namespace fj {

// The walk both rasters share: consecutive indices take `group` steps along one dimension (of
// `extent` tiles) before one step along the other (of `across` tiles), group after group; the
// last group holds what is left. Returns {along, across}.
struct GroupedWalk {
  int along, across;
};
__device__ __forceinline__ GroupedWalk grouped_walk(int linear, int group, int extent, int across) {
  const int per_group = group * across;
  const int g = linear / per_group;
  const int first = g * group;
  const int in_group = min(extent - first, group);
  const int i = linear - g * per_group;
  return {first + i % in_group, i / in_group};
}

// The row tile count is the run's (M is a run-time value, common/rows.cuh); the host checks
// that row tiles x COL_TILES fits int for the largest M a plan accepts (KernelConfig::why_invalid).
// `group` is GROUP_M unless a kernel sets it per run: a resident grid_sync run of several rounds
// takes group = row_tiles, so that consecutive indices fill whole column panels (every row tile
// of a column tile), which is what each round's grid barrier must see complete; group x
// COL_TILES is then the run's tiles, which fit int.
template <int COL_TILES, int GROUP_M>
struct GroupedRaster {
  static_assert(fits_int(static_cast<long long>(GROUP_M) * COL_TILES),
                "GroupedRaster: GROUP_M x column tiles must fit int (KernelConfig::why_invalid)");
  int row_tiles;
  int group = GROUP_M;
  struct Tile {
    int row, col;
  };
  __device__ __forceinline__ int tiles() const { return row_tiles * COL_TILES; }
  __device__ __forceinline__ Tile tile(int linear) const {
    const GroupedWalk w = grouped_walk(linear, group, row_tiles, COL_TILES);
    return {w.along, w.across};
  }
};

// The transpose, for KernelConfig::overlap_apply (kernels/overlap_apply.cuh): consecutive indices
// walk GROUP_N column tiles across one row tile, then the next row tile, so the column panels
// (every row tile of one column tile) finish group by group, in order, and their BatchNorm apply
// can start while later groups are still in the mainloop. A wave holds a few row tiles of x and
// GROUP_N column tiles of W.
template <int COL_TILES, int GROUP_N>
struct PanelRaster {
  static_assert(GROUP_N >= 1, "PanelRaster: GROUP_N must be positive");
  int row_tiles;
  struct Tile {
    int row, col;
  };
  __device__ __forceinline__ int tiles() const { return row_tiles * COL_TILES; }
  // Groups wider than the layer are the layer: the group times row tiles is then at most the
  // run's tiles, which fit int (KernelConfig::why_invalid), whatever group_m a key forces.
  static constexpr int kGroup = GROUP_N < COL_TILES ? GROUP_N : COL_TILES;
  __device__ __forceinline__ Tile tile(int linear) const {
    const GroupedWalk w = grouped_walk(linear, kGroup, COL_TILES, row_tiles);
    return {w.across, w.along};
  }
};

}  // namespace fj
