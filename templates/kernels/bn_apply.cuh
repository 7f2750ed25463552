// Train mode, second pass, part 2: y holds d = a - tile_mean (see bn_epilogue.cuh); rewrite it
// in place as y = A (d + tile_mean) + B. Runs after bn_finalize in stream order, or, with few
// row tiles (bn_apply<Spec, true>), does the finalize's merge itself. Which one runs is the
// host's choice per run (the run's M), so a two-pass kernel set holds both.
// p.saved (optional): the forward's c = a - mean_a, written from the same d as
// c = d + (tile_mean - mean_a). The offset is formed in fp32 from the two means, which are close
// when a column's mean is large against its spread, so c keeps the digits d kept.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/limits.h"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/types.cuh"
#include "epilogue/store.cuh"
#include "kernels/bn_finalize.cuh"

namespace fj {

// VEC consecutive values of T exactly as stored, loaded with one instruction and kept packed
// in registers until used: a thread's 8 rows of 8 bf16 then hold 32 registers instead of 64.
// (With `saved` and the folded finalize beside them, ptxas gives fj_apply 72-80 registers and
// fj_apply_fold 80-89 on sm_90a, NVRTC 13.0: three or two 256-thread blocks an SM.)
template <class T, int VEC>
struct Packed {
  static constexpr int kBytes = VEC * static_cast<int>(sizeof(T));
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  unsigned w[kWords];

  __device__ __forceinline__ void load(const T* src) {
    if constexpr (kBytes == 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (kBytes == 4) {
      w[0] = *reinterpret_cast<const unsigned*>(src);
    } else {
      w[0] = *reinterpret_cast<const unsigned short*>(src);
    }
  }
  // The first n < VEC elements of a row's tail, zeros after them (as the vector's +0.0).
  __device__ __forceinline__ void load_first(const T* src, int n) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (j < n) {
        if constexpr (sizeof(T) == 4)
          w[j] = *reinterpret_cast<const unsigned*>(src + j);
        else
          w[j / 2] |= static_cast<unsigned>(reinterpret_cast<const unsigned short*>(src)[j])
                      << (16 * (j % 2));
      }
  }
  __device__ __forceinline__ float get(int j) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[j]);
    } else {
      T t;
      t.bits = static_cast<unsigned short>(w[j / 2] >> (16 * (j % 2)));
      return to_float(t);
    }
  }
};

// Block shape. A block covers a patch of 32 x VEC columns by 64 rows: a warp rewrites whole
// 512-byte row segments (bf16), and the per-column coefficients the block needs are few next to
// the y it rewrites, so they are computed once per block into shared memory instead of being
// re-read by every thread (a thread's own 8 rows x 8 bf16 are 128 bytes, the size of its 8
// columns' (A, B, tile mean) in fp32). A thread rewrites kApplyRows consecutive rows of VEC
// columns, all loads issued first: enough bytes in flight to cover memory latency. (The numbers,
// kApplyRows and the rest, are in common/limits.h: the host counts the blocks with them.)

template <class Spec>
struct ApplyShape {
  using T = typename Spec::T;
  static constexpr int VEC = Spec::VEC_BYTES / static_cast<int>(sizeof(T)) > 0
                                 ? Spec::VEC_BYTES / static_cast<int>(sizeof(T))
                                 : 1;
  static constexpr int kCols = kApplyColThreads * VEC;
  static constexpr int kStrips = (Spec::N + kCols - 1) / kCols;  // of kCols columns
  // The grid is kStrips x slabs of kApplyBlockRows rows (walked from the bottom up, see
  // bn_apply) in one dimension, strips fastest: CUDA caps grid.y at 65535, which would cap M at
  // 65535 slabs. The host sizes it for the run's M and checks that it fits int
  // (KernelConfig::why_invalid).
  // Row tiles a block's rows can reach (its rows start at a multiple of kApplyBlockRows).
  static constexpr int kTileSlots = (kApplyBlockRows - 1) / Spec::BM + 2;
  static_assert(Spec::BM % kApplyRows == 0, "a thread's rows must not straddle two row tiles");
  static_assert(kCols <= kApplyThreads, "one thread per block column fills the coefficients");
};

// Grid: one block per (column strip, kApplyBlockRows-row slab), strips fastest, slabs from the
// bottom up: the GEMM wrote the last row tiles last, so they are the likeliest to still be in L2
// when the first blocks run.
template <class Spec, bool FOLD_FINALIZE>
__device__ void bn_apply(const Params& p) {
  using T = typename Spec::T;
  using S = ApplyShape<Spec>;
  constexpr int VEC = S::VEC;
  const int m = rows_of<Spec>(p);
  const int slabs = (m + kApplyBlockRows - 1) / kApplyBlockRows;
  // y = A (d + tile_mean) + B = A d + B', B' = A tile_mean + B per (row tile, column).
  __shared__ float s_a[S::kCols];
  __shared__ float s_b[S::kTileSlots][S::kCols];
  __shared__ float s_c[S::kTileSlots][S::kCols];  // saved: c = d + s_c (tile_mean - mean_a)
  const int strip = static_cast<int>(blockIdx.x) % S::kStrips;
  const int slab = slabs - 1 - static_cast<int>(blockIdx.x) / S::kStrips;
  const int row0 = slab * kApplyBlockRows;
  const int col0 = strip * S::kCols;
  const int first_tile = row0 / Spec::BM;
  const int last_tile = (min(row0 + kApplyBlockRows, m) - 1) / Spec::BM;
  const int tx = threadIdx.x % kApplyColThreads;
  const int r0 = row0 + (threadIdx.x / kApplyColThreads) * kApplyRows;
  const int c = col0 + tx * VEC;
  const bool active = c < Spec::N && r0 < m;
  const int n_here = min(VEC, Spec::N - c);
  const int rows = min(kApplyRows, m - r0);
  // Row offsets in 64-bit, also within a thread's rows: 7 * LDY passes 2^31 from LDY ~ 3e8.
  T* y = static_cast<T*>(p.y) + static_cast<long long>(r0) * Spec::LDY + c;
  wait_for_prior_grid();
  // This thread's y first: its latency then overlaps the coefficient work below, which is a
  // chain of dependent loads (partials, then parameters) of its own. A partial column chunk
  // (N not a multiple of VEC) is read element by element after the barrier instead.
  Packed<T, VEC> raw[kApplyRows];
  if (active && n_here == VEC) {
#pragma unroll
    for (int r = 0; r < kApplyRows; ++r)
      if (r < rows) raw[r].load(y + static_cast<long long>(r) * Spec::LDY);
  }
  const float2* tile_stats = reinterpret_cast<const float2*>(p.ws_partials);
  if (threadIdx.x < S::kCols && col0 + static_cast<int>(threadIdx.x) < Spec::N) {
    const int n = col0 + threadIdx.x;
    Affine f;
    float mean_a;
    if constexpr (FOLD_FINALIZE) {
      // Every slab merges its columns' few partials itself (cheaper than a finalize launch);
      // the bottom slab, which runs first, is the one that records.
      f = finalize_column<Spec>(p, n, slab == slabs - 1, mean_a);
    } else {
      const float4 abm = reinterpret_cast<const float4*>(p.ws_coef)[n];
      f = {abm.x, abm.y};
      mean_a = abm.z;
    }
    s_a[threadIdx.x] = f.a;
    for (int t = first_tile; t <= last_tile; ++t) {
      const float tile_mean = tile_stats[static_cast<long long>(t) * Spec::N + n].x;
      s_b[t - first_tile][threadIdx.x] = f.a * tile_mean + f.b;
      if (p.saved) s_c[t - first_tile][threadIdx.x] = tile_mean - mean_a;
    }
  }
  // num_batches_tracked: after every reader. Unfolded, the readers were the finalize kernel,
  // which has completed; folded with momentum=None, every block here reads it, so bump_batches
  // runs after this kernel instead.
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.num_batches_tracked &&
      !(FOLD_FINALIZE && Spec::CUMULATIVE))
    *p.num_batches_tracked += 1;
  __syncthreads();
  if (!active) return;
  const int slot = r0 / Spec::BM - first_tile;
  // Same offset as y's: rows, columns and 64-bit row steps of saved follow y's.
  T* saved =
      p.saved ? static_cast<T*>(p.saved) + static_cast<long long>(r0) * Spec::LDY + c : nullptr;
  if (n_here < VEC) {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < n_here; ++j) {
        const long long off = static_cast<long long>(r) * Spec::LDY + j;
        const float d = to_float(y[off]);
        if (saved) saved[off] = from_float<T>(d + s_c[slot][tx * VEC + j]);
        y[off] = from_float<T>(s_a[tx * VEC + j] * d + s_b[slot][tx * VEC + j]);
      }
    return;
  }
  float a[VEC], b[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    a[j] = s_a[tx * VEC + j];
    b[j] = s_b[slot][tx * VEC + j];
  }
#pragma unroll
  for (int r = 0; r < kApplyRows; ++r) {
    if (r >= rows) break;
    float v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = a[j] * raw[r].get(j) + b[j];
    store_vec<T, VEC>(y + static_cast<long long>(r) * Spec::LDY, v);
  }
  // After y's loop, so that its a and b are dead and the offsets take their registers.
  if (saved) {
    float off[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) off[j] = s_c[slot][tx * VEC + j];
#pragma unroll
    for (int r = 0; r < kApplyRows; ++r) {
      if (r >= rows) break;
      float v[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = raw[r].get(j) + off[j];
      store_vec<T, VEC>(saved + static_cast<long long>(r) * Spec::LDY, v);
    }
  }
}

// Single-pass train with momentum=None: the GEMM's CTAs all read num_batches_tracked, so the
// increment waits for this one-thread launch after them.
__device__ __forceinline__ void bump_batches(const Params& p) {
  wait_for_prior_grid();
  if (p.num_batches_tracked) *p.num_batches_tracked += 1;
}

}  // namespace fj
