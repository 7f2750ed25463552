// XOR-swizzled shared-memory layout for a ROWS x CPR tile of 16-byte chunks (a row is one
// K-contiguous slice of an operand tile: BK elements = CPR chunks).
//
// Why: ldmatrix reads one 16-byte chunk from each of 8 consecutive rows at the same logical
// chunk column. Unswizzled, rows of 64 or 128 bytes put those 8 chunks in the same 4 banks
// (8-way or 4-way conflicts). Here the chunk's position inside its 128-byte line is XORed with a
// few row bits so that any 8 consecutive rows starting at a multiple of 8 hit 8 distinct
// 16-byte bank groups, and so do the 8 consecutive chunks that one cp.async phase writes (the
// permutation stays inside one 128-byte line). The XOR pattern repeats every 16 rows, so callers
// may add multiples of 16 rows (kRowBytes * 16) to an offset without recomputing the swizzle.
// Plain C++ beside the qualifiers: the host tests check the offsets (element_passes_test).
#pragma once
#include "common/host_device.h"

namespace fj {

template <int ROWS, int CPR>
struct SwizzledTile {
  static_assert(CPR == 1 || CPR == 2 || CPR == 4 || CPR == 8 || CPR == 16 || CPR == 32,
                "SwizzledTile: a row must be 1, 2, 4, 8, 16 or 32 chunks of 16 bytes "
                "(BK * sizeof(T) a power of two from 16 to 512 bytes)");
  static constexpr int kRowBytes = CPR * 16;
  static constexpr int kBytes = ROWS * kRowBytes;
  // Rows after which key() repeats: offsets of rows r and r + k * kPeriod differ by a constant.
  static constexpr int kPeriod = CPR >= 8 ? 8 : CPR == 4 ? 16 : CPR == 2 ? 8 : 1;

  // The XOR key of a row. Rows of >= 128 bytes own whole lines: key = row % 8 permutes the
  // chunk's low 3 bits. Shorter rows share a line (8 / CPR rows per line): the key is the line
  // index, taken modulo just enough to separate the lines that 8 consecutive rows touch.
  FJ_HOST_DEVICE_INLINE static constexpr int key(int row) {
    if constexpr (CPR >= 8)
      return row & 7;
    else if constexpr (CPR == 4)
      return (row >> 1) & 7;
    else if constexpr (CPR == 2)
      return (row >> 2) & 1;
    else
      return 0;
  }
  // Byte offset of logical (row, chunk) inside the tile.
  FJ_HOST_DEVICE_INLINE static constexpr int offset(int row, int chunk) {
    return ((row * CPR + chunk) ^ key(row)) * 16;
  }
};

// An element-granular view of a SwizzledTile of 4-byte elements: element (row, k) of a [row][k]
// tile, for ElementLoader (mainloop/operand_loader.cuh), which fills tf32's MN-major operands
// turned around. Moving kLinearPeriod rows (the swizzle's period) moves every offset by the same
// kLinearPeriod * kLinearStride bytes: ElementPasses relies on it.
template <class Layout>
struct SwizzledWords {
  static constexpr int kLinearPeriod = Layout::kPeriod;
  static constexpr int kLinearStride = Layout::kRowBytes;
  static constexpr int kBytes = Layout::kBytes;
  FJ_HOST_DEVICE_INLINE static constexpr int offset(int row, int k) {
    return Layout::offset(row, k >> 2) + (k & 3) * 4;
  }
};

// Rows of ROW_BYTES (a multiple of 16) with no swizzle: the strict-fp32 mainloop's padded [k][row]
// stages, whose padding already spreads its accesses over the banks. Same interface as
// SwizzledTile, so the chunk loader fills either.
template <int ROWS, int ROW_BYTES>
struct PaddedTile {
  static_assert(ROW_BYTES % 16 == 0, "PaddedTile: rows must be whole 16-byte chunks");
  static constexpr int kRowBytes = ROW_BYTES;
  static constexpr int kBytes = ROWS * kRowBytes;
  static constexpr int kPeriod = 1;
  FJ_HOST_DEVICE_INLINE static constexpr int offset(int row, int chunk) {
    return row * kRowBytes + chunk * 16;
  }
};

}  // namespace fj
