// The two ways the tiled mainloops fill a shared-memory stage from a row-major global matrix
// [NR][LD] (NR rows, NC valid columns; either may be 0: the run's, given to init()):
//   ChunkLoader    16-byte cp.async chunks along a row, into a chunk layout (SwizzledTile or
//                  PaddedTile): the tile keeps the global orientation.
//   ElementLoader  4-byte cp.async per element into the transposed position: the tile turns
//                  around (strict fp32's [k][row] stages; tf32's MN-major operands).
// Every k-tile the tile's origin moves by one tile along the k dimension, which is the columns
// (K_ROWS = false: a K-major operand, the tile is rows x BK) or the rows (K_ROWS = true: an
// MN-major operand, the tile is BK x rows). Rows >= NR and columns >= NC are zero-filled: zero
// output rows keep garbage out of the accumulators and zero k (in both operands) adds nothing.
#pragma once
#include "common/cp_async.cuh"
#include "common/types.cuh"
#include "mainloop/element_passes.h"

namespace fj {

namespace detail {

__device__ __forceinline__ int clamp_bytes(int v, int hi) {
  return v < 0 ? 0 : (v > hi ? hi : v);
}

// Copies TR x TC tiles (TC * sizeof(T) a multiple of 16) into a Layout of TR rows of
// TC * sizeof(T) / 16 chunks. Thread t owns chunk column t % CPR of rows t / CPR + i * kRowStep,
// so a warp reads whole contiguous row segments (coalesced) and writes whole 128-byte lines of
// shared memory (conflict-free in a SwizzledTile).
template <class T, class Layout, int TR, int TC, int NR, int NC, int LD, int VEC, int THREADS,
          bool K_ROWS>
struct ChunkLoader {
  static constexpr int kEpc = 16 / int(sizeof(T));  // elements per 16-byte chunk
  static constexpr int CPR = TC / kEpc;
  static constexpr int kChunks = TR * CPR;
  static constexpr int kIters = (kChunks + THREADS - 1) / THREADS;
  static constexpr int kRowStep = THREADS / CPR;
  // Successive chunks of a thread keep the same swizzle key: their offsets differ by a constant.
  static constexpr bool kLinearRows = kRowStep % Layout::kPeriod == 0;
  // Some tile has rows (columns) past the matrix: always possible when the count is the run's.
  static constexpr bool kRowTail = NR == 0 || NR % TR != 0;
  static constexpr bool kColTail = NC == 0 || NC % TC != 0;
  static_assert(TC % kEpc == 0 && Layout::kRowBytes >= CPR * 16,
                "ChunkLoader: a tile row must be whole 16-byte chunks that fit a layout row");
  static_assert(THREADS % CPR == 0,
                "ChunkLoader: THREADS must be a multiple of the 16-byte chunks in a tile row");
  static_assert(VEC == 16 || VEC == 8 || VEC == 4 || (VEC == 2 && sizeof(T) == 2),
                "VEC_BYTES must be 16, 8, 4, or 2 for 16-bit types (and at least sizeof(T))");

  const T* base;  // a valid, aligned address for copies that read nothing
  const T* g;     // this thread's first chunk, k-tile 0
  int row;        // this thread's first row inside the tile
  int chunk;      // this thread's chunk column
  int rows_left;  // rows of the matrix at or after this thread's first row (k-tile 0)
  int cols_left;  // columns of the matrix at or after this thread's chunk (k-tile 0)
  int soff;       // byte offset of the first chunk in a stage

  // The tile of k-tile 0 starts at (row0, col0); the matrix has nrows x ncols valid elements
  // (the template's NR / NC where those are not 0).
  __device__ __forceinline__ void init(const void* ptr, int row0, int col0, int tid, int nrows,
                                       int ncols) {
    base = static_cast<const T*>(ptr);
    chunk = tid % CPR;
    row = tid / CPR;
    rows_left = (NR > 0 ? NR : nrows) - row0 - row;
    cols_left = (NC > 0 ? NC : ncols) - col0 - chunk * kEpc;
    g = base + static_cast<long long>(row0 + row) * LD + col0 + chunk * kEpc;
    soff = Layout::offset(row, chunk);
  }

  __device__ __forceinline__ void issue(unsigned stage, int kt) const {
    const int rleft = K_ROWS ? rows_left - kt * TR : rows_left;
    // Elements before converting to bytes: left * sizeof(T) passes 2^31 once NC > 2^30.
    const int left = K_ROWS ? cols_left : cols_left - kt * TC;
    const int cbytes = !kColTail || left >= kEpc ? 16 : clamp_bytes(left * int(sizeof(T)), 16);
    const T* gk = K_ROWS ? g + static_cast<long long>(kt) * TR * LD : g + kt * TC;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (kChunks % THREADS != 0 && row + i * kRowStep >= TR) break;
      const bool row_ok = !kRowTail || i * kRowStep < rleft;
      const int bytes = row_ok ? cbytes : 0;
      const unsigned dst = stage + (kLinearRows ? soff + i * kRowStep * Layout::kRowBytes
                                                : Layout::offset(row + i * kRowStep, chunk));
      const T* src = gk + static_cast<long long>(i) * kRowStep * LD;
      if constexpr (VEC == 16) {
        cp_async<16>(dst, bytes > 0 ? src : base, bytes);
      } else if constexpr (VEC >= 4) {
        // The operand rows are only VEC-aligned: split the chunk into VEC-byte copies, each
        // with its own share of the valid bytes.
#pragma unroll
        for (int j = 0; j < 16 / VEC; ++j) {
          const int b = clamp_bytes(bytes - j * VEC, VEC);
          const char* s = reinterpret_cast<const char*>(src) + j * VEC;
          cp_async<VEC>(dst + j * VEC, b > 0 ? s : reinterpret_cast<const char*>(base), b);
        }
      } else {
        // 2-byte alignment: cp.async needs at least 4. Load elements synchronously and store
        // the assembled chunk; the pipeline's barriers order it like a completed cp.async.
        unsigned short v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = e * 2 < bytes ? src[e].bits : 0;
        st_shared_v4(dst, v[0] | (unsigned(v[1]) << 16), v[2] | (unsigned(v[3]) << 16),
                     v[4] | (unsigned(v[5]) << 16), v[6] | (unsigned(v[7]) << 16));
      }
    }
  }
};

// Copies TR x TC tiles of 4-byte elements transposed, one 4-byte cp.async per element: source
// element (r, c) of the tile goes to byte Dst::offset(c, r) of the stage, in the passes
// ElementPasses lays out (mainloop/element_passes.h).
//   strict fp32, K-major operand: W = TC = BK, (r, c) = (row, k) -> [k][row]: a warp reads
//     32 / BK row segments of BK floats (see mainloop/simt_fp32.cuh for its bank behaviour);
//   tf32, MN-major operand: W = 8, (r, c) = (k, row) -> the K-major SwizzledTile [row][k]: a
//     warp reads 4 k rows x 8 consecutive output indices (four 32-byte sectors) and writes,
//     per k, 8 rows whose swizzle keys differ, so its 32 words land in 32 distinct banks.
template <class Dst, int TR, int TC, int NR, int NC, int LD, int THREADS, int W, bool K_ROWS>
struct ElementLoader {
  using P = ElementPasses<Dst, TR, TC, THREADS, W>;
  static constexpr bool kRowTail = NR == 0 || NR % TR != 0;
  static constexpr bool kColTail = NC == 0 || NC % TC != 0;

  const float* base;  // a valid address for copies that read nothing
  const float* g;     // this thread's first element, k-tile 0
  int lin;            // tid / W: passes beyond TR * TC / W of these are past the tile
  int r, c;           // this thread's first element inside the tile
  int rows_left;      // rows of the matrix at or after row r (k-tile 0)
  int cols_left;      // columns of the matrix at or after column c (k-tile 0)
  typename P::Bases soff;

  __device__ __forceinline__ void init(const void* ptr, int row0, int col0, int tid, int nrows,
                                       int ncols) {
    base = static_cast<const float*>(ptr);
    lin = tid / W;
    r = P::first_row(tid);
    c = P::first_col(tid);
    rows_left = (NR > 0 ? NR : nrows) - row0 - r;
    cols_left = (NC > 0 ? NC : ncols) - col0 - c;
    g = base + static_cast<long long>(row0 + r) * LD + col0 + c;
    soff = P::bases(r, c);
  }

  __device__ __forceinline__ void issue(unsigned stage, int kt) const {
    const int rleft = K_ROWS ? rows_left - kt * TR : rows_left;
    const int cleft = K_ROWS ? cols_left : cols_left - kt * TC;
    const float* gk = K_ROWS ? g + static_cast<long long>(kt) * TR * LD : g + kt * TC;
#pragma unroll
    for (int i = 0; i < P::kIters; ++i) {
      if (!P::in_tile(lin, i)) break;
      const bool ok = (!kRowTail || P::dr(i) < rleft) && (!kColTail || P::dc(i) < cleft);
      const float* src = gk + static_cast<long long>(P::dr(i)) * LD + P::dc(i);
      cp_async<4>(stage + P::offset(soff, r, c, i), ok ? src : base, ok ? 4 : 0);
    }
  }
};

}  // namespace detail

}  // namespace fj
