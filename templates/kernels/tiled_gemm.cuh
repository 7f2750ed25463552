// The tiled variant (sm_80+): tile scheduler + mainloop (mma.sync or SIMT FFMA) + BN epilogue,
// one CTA per output tile. The three are independent seams: any mainloop that leaves an
// AccTile in shared memory composes with any epilogue.
//
// Split-K (Spec::SPLIT_K = S > 1): the grid is tiles x S; CTA (tile, s) multiplies its share of
// the k tiles and stores its AccTile as slice [s][tile] of the workspace instead of running the
// epilogue. kernels/splitk_reduce.cuh adds the S slices in a fixed order and runs the epilogue
// through finish(), so the sums are the same on every run (no atomics, no counters).
#pragma once
#include "common/grid_dependency.cuh"
#include "common/limits.h"
#include "common/math_kind.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/select.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "epilogue/bn_epilogue.cuh"
#include "kernels/tile_scheduler.cuh"
#include "mainloop/operands.cuh"
#include "mainloop/simt_fp32.cuh"
#include "mainloop/tiled_mma.cuh"

namespace fj {

template <class Spec>
struct TiledGemm {
  // x W^T: both operands K-major (mainloop/operands.cuh).
  using Operands = LinearOperands<Spec>;
  using Mainloop = typename Select<Spec::MATH == kMathSimtFp32, SimtFp32Mainloop<Operands>,
                                   TiledMmaMainloop<Operands>>::type;
  // tf32 operands rounded before their products (TiledMmaMainloop's TF32_ROUND, to_tf32) or
  // truncated by the tensor core: fj_input_stats takes x and W as these products do.
  static constexpr Tf32Rounding kTf32Rounding =
      detail::Tf32Round<Operands>::value ? Tf32Rounding::nearest_away : Tf32Rounding::truncate;
  using Epilogue = BnEpilogue<Spec, Spec::THREADS>;
  using Tile = AccTile<Spec::BM, Spec::BN>;
  // Tile counts are (D + T - 1) / T in int (Problem::validate, KernelConfig::why_invalid).
  static_assert(Spec::M >= 0 && Spec::M <= kMaxDim && Spec::N <= kMaxDim && Spec::K <= kMaxDim,
                "M, N and K must be at most kMaxDim (common/limits.h)");
  static_assert(Spec::BM <= kMaxTileExtent && Spec::BN <= kMaxTileExtent &&
                    Spec::BK <= kMaxTileExtent,
                "BM, BN and BK must be at most kMaxTileExtent (common/limits.h)");
  static constexpr int kColTiles = (Spec::N + Spec::BN - 1) / Spec::BN;
  using Raster = GroupedRaster<kColTiles, Spec::GROUP_M>;
  __device__ __forceinline__ static Raster raster(const Params& p) {
    return Raster{row_tiles_of<Spec>(p)};
  }
  static constexpr int kEpilogueBytes = Tile::kBytes + Epilogue::kScratchBytes;
  static constexpr int kSmemBytes =
      Mainloop::kSmemBytes > kEpilogueBytes ? Mainloop::kSmemBytes : kEpilogueBytes;
  static constexpr int kSplits = Spec::SPLIT_K;
  static_assert(kSplits >= 1 && kSplits <= Mainloop::KT,
                "SPLIT_K must lie within 1..(k tiles): a split without k tiles would be empty");

  // Split-K workspace: slice [s][tile] (tile: the raster's linear index) is BM x BN fp32,
  // row-major and unpadded. Only a tile's rows inside M are stored and read: the epilogue never
  // reads the others.
  static constexpr int kSliceVecs = Spec::BM * Spec::BN / 4;
  __device__ __forceinline__ static float4* slice(const Params& p, int split, int linear) {
    return reinterpret_cast<float4*>(p.ws_splitk) +
           (static_cast<long long>(split) * raster(p).tiles() + linear) * kSliceVecs;
  }
  __device__ __forceinline__ static int slice_vecs_in_m(const Params& p, int linear) {
    const int m0 = raster(p).tile(linear).row * Spec::BM;
    return min(Spec::BM, rows_of<Spec>(p) - m0) * (Spec::BN / 4);
  }

  __device__ static void run(const Params& p) {
    extern __shared__ __align__(128) char smem[];
    const int linear = blockIdx.x;
    const auto t = raster(p).tile(linear);
    const Tile tile{reinterpret_cast<float*>(smem)};
    // Without split-K the range is a compile-time constant, as the mainloop was tuned with.
    const KRange k =
        kSplits == 1 ? KRange{0, Mainloop::KT} : split_k_range(Mainloop::KT, kSplits, blockIdx.y);
    Mainloop::run(GemmOperands{p.x, p.w, rows_of<Spec>(p), Spec::K}, smem, t.row * Spec::BM,
                  t.col * Spec::BN, k, tile);
    if constexpr (kSplits == 1) {
      finish<Spec::THREADS>(p, smem, linear);
    } else {
      // Only the slice store is left: the reduce kernel's CTAs may start waiting now.
      allow_dependent_launch();
      float4* dst = slice(p, blockIdx.y, linear);
      const int n = slice_vecs_in_m(p, linear);
      for (int i = threadIdx.x; i < n; i += Spec::THREADS) dst[i] = tile.vec4(i);
    }
  }

  // The BatchNorm epilogue on tile `linear`'s finished sums (an AccTile at the start of `smem`,
  // NT threads): the end of this kernel, or of the split-K reduce kernel, so that everything
  // downstream is the same either way.
  template <int NT>
  __device__ static void finish(const Params& p, char* smem, int linear) {
    const auto t = raster(p).tile(linear);
    // Recompute's affine pass is a programmatic dependent launch of fj_finalize: its mainloop
    // (x and W only) may run beside the finalize; its coefficients and the counter may not.
    if constexpr (WsAffine<Spec>::value) wait_for_prior_grid();
    BnEpilogue<Spec, NT>::run(p, Tile{reinterpret_cast<float*>(smem)},
                              reinterpret_cast<float*>(smem + Tile::kBytes), t.row * Spec::BM,
                              t.col * Spec::BN, t.row, threadIdx.x, CtaBarrier{});
    // Single-pass train with a fixed momentum: nobody reads num_batches_tracked, so one thread
    // can bump it here (cumulative mode launches bump_batches after the epilogue's kernel).
    // Recompute's affine pass likewise: it runs after fj_finalize, the counter's last reader.
    if constexpr ((Spec::TRAIN && Spec::SINGLE_PASS && !Spec::CUMULATIVE) ||
                  WsAffine<Spec>::value) {
      if (linear == 0 && threadIdx.x == 0 && p.num_batches_tracked) *p.num_batches_tracked += 1;
    }
  }
};

}  // namespace fj
