// The tiled variant (sm_80+): tile scheduler + mainloop (mma.sync or SIMT FFMA) + BN epilogue,
// one CTA per output tile. The three are independent seams: any mainloop that leaves an
// AccTile in shared memory composes with any epilogue.
#pragma once
#include "common/math_kind.cuh"
#include "common/params.h"
#include "common/select.cuh"
#include "common/tile.cuh"
#include "epilogue/bn_epilogue.cuh"
#include "kernels/tile_scheduler.cuh"
#include "mainloop/simt_fp32.cuh"
#include "mainloop/tiled_mma.cuh"

namespace fj {

template <class Spec>
struct TiledGemm {
  using Mainloop = typename Select<Spec::MATH == kMathSimtFp32, SimtFp32Mainloop<Spec>,
                                   TiledMmaMainloop<Spec>>::type;
  using Epilogue = BnEpilogue<Spec, Spec::THREADS>;
  using Tile = AccTile<Spec::BM, Spec::BN>;
  static constexpr int kRowTiles = (Spec::M + Spec::BM - 1) / Spec::BM;
  static constexpr int kColTiles = (Spec::N + Spec::BN - 1) / Spec::BN;
  using Raster = GroupedRaster<kRowTiles, kColTiles, Spec::GROUP_M>;
  static constexpr int kEpilogueBytes = Tile::kBytes + Epilogue::kScratchBytes;
  static constexpr int kSmemBytes =
      Mainloop::kSmemBytes > kEpilogueBytes ? Mainloop::kSmemBytes : kEpilogueBytes;

  __device__ static void run(const Params& p) {
    extern __shared__ __align__(128) char smem[];
    const auto t = Raster::tile(blockIdx.x);
    const int m0 = t.row * Spec::BM;
    const int n0 = t.col * Spec::BN;
    const Tile tile{reinterpret_cast<float*>(smem)};
    Mainloop::run(p, smem, m0, n0, tile);
    Epilogue::run(p, tile, reinterpret_cast<float*>(smem + Tile::kBytes), m0, n0, t.row,
                  threadIdx.x, CtaBarrier{});
    // Single-pass train with a fixed momentum: nobody reads num_batches_tracked, so one thread
    // can bump it here (cumulative mode launches bump_batches after the GEMM instead).
    if constexpr (Spec::TRAIN && Spec::SINGLE_PASS && !Spec::CUMULATIVE) {
      if (blockIdx.x == 0 && threadIdx.x == 0 && p.num_batches_tracked) *p.num_batches_tracked += 1;
    }
  }
};

}  // namespace fj
