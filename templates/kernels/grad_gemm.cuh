// The backward pass's weight and input gradients as one plain GEMM kernel: C = A B (or
// C += A B), C [ROWS][LDC] in T, fp32 accumulation, on the tiled mainloops (tensor cores for
// bf16/fp16/tf32, FFMA for strict fp32) with each operand K-major or MN-major
// (mainloop/operands.cuh):
//   dX [m][K] = dA W:    A = dA [m][LDA] K-major, B(c, k) = W[k][c] MN-major, RED = N, ROWS = 0
//   dW [N][K] = dA^T x:  A(r, k) = dA[k][r] MN-major, B(c, k) = x[k][c] MN-major, RED = 0
// One CTA per BM x BN output tile (blockIdx.x, grouped raster for L2 reuse) and split
// (blockIdx.y, SPLIT_K of them), G::THREADS threads, kSmemBytes of dynamic shared memory. The
// description G is the mainloops' plus GROUP_M, LDC and SPLIT_K; ROWS or RED = 0 is
// GemmParams::m. With SPLIT_K > 1 each split multiplies its share of the reduction
// (common/split_k.h) into its fp32 slice of GemmParams::partials, and kernels/grad_split_sum.cuh
// adds the slices into C: for grids of few tiles with a long reduction (dW's is the batch).
#pragma once
#include "common/gemm_params.h"
#include "common/grid_dependency.cuh"
#include "common/limits.h"
#include "common/math_kind.cuh"
#include "common/select.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "common/types.cuh"
#include "kernels/tile_scheduler.cuh"
#include "mainloop/operands.cuh"
#include "mainloop/simt_fp32.cuh"
#include "mainloop/tiled_mma.cuh"

namespace fj {

template <class G>
struct GradGemm {
  using T = typename G::T;
  using Mainloop =
      typename Select<G::MATH == kMathSimtFp32, SimtFp32Mainloop<G>, TiledMmaMainloop<G>>::type;
  using Tile = AccTile<G::BM, G::BN>;
  static constexpr int BM = G::BM, BN = G::BN, COLS = G::COLS, LDC = G::LDC;
  static_assert(G::ROWS >= 0 && G::ROWS <= kMaxDim && G::COLS >= 1 && G::COLS <= kMaxDim &&
                    G::RED >= 0 && G::RED <= kMaxDim,
                "ROWS, COLS and RED must be at most kMaxDim (common/limits.h), COLS positive");
  static_assert(LDC >= COLS, "LDC must be at least COLS");
  static_assert(BM <= kMaxTileExtent && BN <= kMaxTileExtent && G::BK <= kMaxTileExtent,
                "BM, BN and BK must be at most kMaxTileExtent (common/limits.h)");
  static constexpr int kColTiles = (COLS + BN - 1) / BN;
  using Raster = GroupedRaster<kColTiles, G::GROUP_M>;
  static constexpr int kSmemBytes =
      Mainloop::kSmemBytes > Tile::kBytes ? Mainloop::kSmemBytes : Tile::kBytes;

  // The epilogue's access: the widest that C's alignment allows, at most 16 bytes.
  static constexpr int kStoreBytes = G::VEC_BYTES < 16 ? G::VEC_BYTES : 16;
  static constexpr int V = kStoreBytes / int(sizeof(T)) > 0 ? kStoreBytes / int(sizeof(T)) : 1;
  static constexpr int kWords = V * int(sizeof(T)) / 4;  // 32-bit words of a vector access
  static_assert(BN % V == 0 && V <= 8, "BN must be a multiple of the store width");
  static constexpr int kSplits = G::SPLIT_K;
  static_assert(kSplits >= 1, "SPLIT_K must be positive");

  __device__ static void run(const GemmParams& p) {
    extern __shared__ __align__(128) char smem[];
    if (!p.beside_prior) join_launch_chain();
    const GemmOperands op{p.a, p.b, p.m, p.m};
    const int rows = gemm_rows<G>(op);
    const auto t = Raster{(rows + BM - 1) / BM}.tile(blockIdx.x);
    const int m0 = t.row * BM, n0 = t.col * BN;
    const Tile tile{reinterpret_cast<float*>(smem)};
    const int k_tiles = Mainloop::k_tiles(op);
    // A run's reduction (dW's batch) may have fewer k tiles than splits: the empty ones store
    // zeros, which the sum needs.
    Mainloop::run(op, smem, m0, n0,
                  kSplits == 1 ? KRange{0, k_tiles} : split_k_range(k_tiles, kSplits, blockIdx.y),
                  tile);
    if constexpr (kSplits > 1)
      store_slice(p, tile, m0, n0, rows);
    else
      store(p, tile, m0, n0, rows);
    if (p.beside_prior) join_launch_chain();  // at its exit: see beside_prior
  }

 private:
  template <int W>
  struct Words {
    unsigned w[W > 0 ? W : 1];
  };

  // v (V floats) -> T, as kWords 32-bit words in memory order.
  __device__ __forceinline__ static Words<kWords> pack(const float (&v)[V]) {
    Words<kWords> r;
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      if constexpr (sizeof(T) == 4)
        r.w[j] = __float_as_uint(v[j]);
      else
        r.w[j] = pack2<T>(v[2 * j], v[2 * j + 1]);
    }
    return r;
  }
  // v += the V elements of T in `old`.
  __device__ __forceinline__ static void add(float (&v)[V], const Words<kWords>& old) {
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      if constexpr (sizeof(T) == 4) {
        v[j] += __uint_as_float(old.w[j]);
      } else {
        const float2 o = unpack2<T>(old.w[j]);
        v[2 * j] += o.x;
        v[2 * j + 1] += o.y;
      }
    }
  }
  __device__ __forceinline__ static Words<kWords> load_words(const T* src) {
    Words<kWords> r;
    if constexpr (kWords == 4) {
      const uint4 u = *reinterpret_cast<const uint4*>(src);
      r.w[0] = u.x, r.w[1] = u.y, r.w[2] = u.z, r.w[3] = u.w;
    } else if constexpr (kWords == 2) {
      const uint2 u = *reinterpret_cast<const uint2*>(src);
      r.w[0] = u.x, r.w[1] = u.y;
    } else {
      r.w[0] = *reinterpret_cast<const unsigned*>(src);
    }
    return r;
  }
  __device__ __forceinline__ static void store_words(T* dst, const Words<kWords>& r) {
    if constexpr (kWords == 4)
      *reinterpret_cast<uint4*>(dst) = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
    else if constexpr (kWords == 2)
      *reinterpret_cast<uint2*>(dst) = make_uint2(r.w[0], r.w[1]);
    else
      *reinterpret_cast<unsigned*>(dst) = r.w[0];
  }

  // SPLIT_K: the tile's part inside rows x COLS into this split's slice, 4 columns per thread.
  __device__ __forceinline__ static void store_slice(const GemmParams& p, const Tile& tile, int m0,
                                                     int n0, int rows) {
    constexpr int kLd = split_slice_ld(COLS), kGroups = BN / 4;
    static_assert(BN % 4 == 0, "split-K slices take 4-column groups");
    float* const slice =
        p.partials + static_cast<long long>(blockIdx.y) * rows * static_cast<long long>(kLd);
    for (int i = threadIdx.x; i < BM * kGroups; i += G::THREADS) {
      const int r = i / kGroups, cc = (i % kGroups) * 4;
      // A group starting inside COLS ends inside the slice's row (kLd is a multiple of 8).
      if (m0 + r >= rows || n0 + cc >= COLS) continue;
      *reinterpret_cast<float4*>(slice + static_cast<long long>(m0 + r) * kLd + n0 + cc) =
          *reinterpret_cast<const float4*>(&tile(r, cc));
    }
  }

  // C = tile (or C += tile) over the tile's part inside rows x COLS: groups of V columns per
  // thread, consecutive threads on consecutive groups of a row (coalesced); a group that
  // straddles COLS goes element by element.
  __device__ __forceinline__ static void store(const GemmParams& p, const Tile& tile, int m0,
                                               int n0, int rows) {
    constexpr int kGroups = BN / V;
    T* const c = static_cast<T*>(p.c);
    const bool acc = p.accumulate != 0;
    for (int i = threadIdx.x; i < BM * kGroups; i += G::THREADS) {
      const int r = i / kGroups, cc = (i % kGroups) * V;
      const int gm = m0 + r, gn = n0 + cc;
      if (gm >= rows || gn >= COLS) continue;
      float v[V];
      if constexpr (V % 4 == 0) {
#pragma unroll
        for (int q = 0; q < V / 4; ++q) {
          const float4 f = *reinterpret_cast<const float4*>(&tile(r, cc + 4 * q));
          v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
      } else if constexpr (V == 2) {
        const float2 f = *reinterpret_cast<const float2*>(&tile(r, cc));
        v[0] = f.x, v[1] = f.y;
      } else {
        v[0] = tile(r, cc);
      }
      T* dst = c + static_cast<long long>(gm) * LDC + gn;
      if constexpr (kWords >= 1) {
        if (COLS % V == 0 || gn + V <= COLS) {
          if (acc) add(v, load_words(dst));
          store_words(dst, pack(v));
          continue;
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (gn + j >= COLS) break;
        const float old = acc ? to_float(dst[j]) : 0.f;
        dst[j] = from_float<T>(v[j] + old);
      }
    }
  }
};

}  // namespace fj
