// A wgmma accumulator tile's rows out to global memory through TMA stores from per-warp boxes:
// each warp writes 16 rows x 64 bytes (32 16-bit or 16 fp32 columns) at a time into one of its
// two 1 KiB boxes (TMA's 64-byte swizzle; stmatrix for 16-bit values, 8-byte shared stores for
// fp32) and one lane hands the box to a TMA store. The warp synchronizes with itself only (no
// named barriers) and goes back to its mainloop while the copy engine drains the rows; and the
// staging is 2 KiB a warp where a whole tile's would be bm x bn elements, so the stage ring keeps
// the space (the forward's 16-bit y: docs/performance.md, sixth session; tf32's 4th stage: "TMA
// stores of fp32 y"; the gradient GEMMs' 4th stage: "The gradient GEMMs' stores through per-warp
// boxes").
//
// Fragment layout (wgmma m64nNk*, fp32 D): in atom `ma` (64 rows), warp w of the warpgroup owns
// 16 rows, and lane (g = lane / 4, q = lane % 4) holds, for every 8-column block j, the pair of
// columns 8 j + 2 q, + 1 at row 64 ma + 16 w + g + 8 h. The caller's value(ma, j, h) returns that
// pair, converted: two 16-bit values packed in an unsigned, or a float2.
//
// The tensor map: the matrix in boxes of kBoxRows rows x kBoxCols columns, 64-byte swizzle
// (common/tma_store_box.h, which the host encodes the maps with); TMA skips the rows and columns
// past its bounds.
#pragma once
#include "common/cp_async.cuh"
#include "common/select.cuh"
#include "common/tma_descriptor.cuh"
#include "common/tma_store_box.h"
#include "common/types.cuh"
#include "mainloop/tma.cuh"

namespace fj {

template <class T, int BN, int M_ATOMS>
struct WarpBoxStore {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "warp box store: 16- or 32-bit values");
  static constexpr int kBoxRows = kTmaStoreBoxRows, kBoxRowBytes = kTmaStoreBoxRowBytes;
  static constexpr int kBoxCols = kBoxRowBytes / static_cast<int>(sizeof(T));
  static constexpr int kBoxBytes = kBoxRows * kBoxRowBytes;
  static constexpr int kWarpBytes = kTmaStoreWarpBytes;  // a warp's two boxes
  static_assert(kWarpBytes == 2 * kBoxBytes, "warp box store: two boxes a warp");
  static constexpr int kAlign = 1024;  // the swizzle pattern's period
  // An even number of boxes per call, so that every call starts on box 0 with box 1's group the
  // only one that may still be reading.
  static_assert(BN % (2 * kBoxCols) == 0, "warp box store: BN must be whole pairs of boxes");
  using Pair = typename Select<sizeof(T) == 4, float2, unsigned>::type;

  // Two adjacent columns' values as they are stored: 16-bit values packed in an unsigned, or a
  // float2 (what value() returns to store()).
  __device__ __forceinline__ static Pair pair(float lo, float hi) {
    if constexpr (sizeof(T) == 4)
      return make_float2(lo, hi);
    else
      return pack2<T>(lo, hi);
  }

  // Byte offset of row r's 16-byte unit u in a box: unit u ^ ((r / 2) % 4), TMA's 64-byte
  // swizzle on a 1 KiB aligned box, which also puts each stmatrix phase's 8 rows on distinct
  // banks.
  __device__ __forceinline__ static unsigned unit_offset(int r, int u) {
    return static_cast<unsigned>(r * kBoxRowBytes + 16 * (u ^ ((r / 2) % 4)));
  }

  // The warp's rows [row0 + 64 ma, + 16) of columns [n0, n0 + BN), box after box, alternating
  // between its two boxes at `boxes` (shared address, kAlign-aligned): before one is refilled,
  // lane 0 (which issues the stores) waits until at most one group, the other box's, still
  // reads shared memory. The stores stay in flight; drain() waits for them.
  template <class Value>
  __device__ __forceinline__ static void store(unsigned boxes, int lane, int row0, int n0,
                                               const TmaDescriptor* map, Value value) {
    int parity = 0;
#pragma unroll
    for (int ma = 0; ma < M_ATOMS; ++ma)
#pragma unroll
      for (int cc = 0; cc < BN / kBoxCols; ++cc, parity ^= 1) {
        Pair v[kBoxCols / 8][2];
#pragma unroll
        for (int jj = 0; jj < kBoxCols / 8; ++jj)
#pragma unroll
          for (int h = 0; h < 2; ++h) v[jj][h] = value(ma, cc * (kBoxCols / 8) + jj, h);
        const unsigned box = boxes + parity * kBoxBytes;
        if (lane == 0) bulk_wait_read<1>();
        __syncwarp();
        fill_box(box, lane, v);
        fence_async_shared();
        __syncwarp();
        if (lane == 0) {
          tma_store_2d(map, box, n0 + cc * kBoxCols, row0 + 64 * ma);
          bulk_commit();
        }
      }
  }

  // Before the boxes die with the CTA, or before a later kernel reads what they wrote: every
  // store of the warp complete.
  __device__ __forceinline__ static void drain(int lane) {
    if (lane == 0) bulk_wait<0>();
  }

  // One box of 16 rows x kBoxCols columns from the warp's pairs v (8-column block jj, row half h).
  __device__ __forceinline__ static void fill_box(unsigned box, int lane,
                                                  const Pair (&v)[kBoxCols / 8][2]) {
    if constexpr (sizeof(T) == 2) {
      // This lane's stmatrix row: row `lane % 8` of matrix `lane / 8`, which is (8-column
      // block 2 s + mi / 2, row half mi % 2) of the box in call s.
      const int mi = lane / 8;
      const int r = lane % 8 + 8 * (mi % 2);
#pragma unroll
      for (int s = 0; s < kBoxCols / 16; ++s)
        stmatrix_x4(box + unit_offset(r, 2 * s + mi / 2), v[2 * s][0], v[2 * s][1], v[2 * s + 1][0],
                    v[2 * s + 1][1]);
    } else {
      // fp32 (no stmatrix for 32-bit values): the lane's own pair, row g + 8 h, bytes
      // [32 jj + 8 q, + 8) of the row, in 16-byte unit 2 jj + q / 2. Per instruction the warp
      // writes 256 bytes in two wavefronts: rows 2 apart land on different units through the
      // swizzle, so no more than two lanes' pairs share a bank.
      const int g = lane / 4, q = lane % 4;
#pragma unroll
      for (int jj = 0; jj < kBoxCols / 8; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = g + 8 * h;
          st_shared_v2(box + unit_offset(r, 2 * jj + q / 2) + 8 * (q % 2),
                       __float_as_uint(v[jj][h].x), __float_as_uint(v[jj][h].y));
        }
    }
  }

 private:
  // Four 8x8 matrices of 16-bit pairs from the mma fragment layout (register i holds matrix i's
  // row lane / 4, pair lane % 4) into shared memory; lanes 8i..8i+7 give matrix i's row
  // addresses. A quarter of the instructions of 32-bit shared stores.
  __device__ __forceinline__ static void stmatrix_x4(unsigned addr, unsigned r0, unsigned r1,
                                                     unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  }
};

}  // namespace fj
