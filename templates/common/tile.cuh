// Small typed views over shared memory, so kernels index tiles by (row, col) instead of by hand.
#pragma once

// offsetof for the shared-memory layout structs, as an unsigned: what kernels add to a 32-bit
// shared-window base to address a member. NVRTC has neither <cstddef> nor __builtin_offsetof;
// this is the form libcu++ falls back to there, and it folds to a constant.
#define FJ_OFFSETOF(TYPE, MEMBER)                                                               \
  static_cast<unsigned>(reinterpret_cast<const char*>(&(static_cast<TYPE*>(nullptr)->MEMBER)) - \
                        static_cast<const char*>(nullptr))

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
  // The i-th group of 4 columns in row-major order (BN / 4 per row): whole rows move through it
  // as 16-byte accesses, consecutive threads on consecutive addresses.
  __device__ __forceinline__ float4& vec4(int i) const {
    static_assert(BN % 4 == 0, "AccTile::vec4: BN must be a multiple of 4");
    return *reinterpret_cast<float4*>(data + (i / (BN / 4)) * LD + (i % (BN / 4)) * 4);
  }
};

}  // namespace fj
