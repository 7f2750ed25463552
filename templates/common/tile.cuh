// Small typed views over shared memory, so kernels index tiles by (row, col) instead of by hand.
#pragma once

namespace fj {

// The fp32 accumulator tile every mainloop hands to the epilogue: BM x BN, row-major in shared
// memory. Rows are padded by 8 floats so that both the mma fragments' float2 stores (8 rows x 4
// column pairs per half-warp) and the epilogue's per-column reads are free of bank conflicts.
template <int BM_, int BN_>
struct AccTile {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int LD = BN + 8;
  static constexpr int kBytes = BM * LD * 4;
  float* data;
  __device__ __forceinline__ float& operator()(int r, int c) const { return data[r * LD + c]; }
};

}  // namespace fj
