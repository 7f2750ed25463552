// The fused BatchNorm epilogue, shared by every mainloop (tiled, SIMT, warpspec): it reads the
// CTA's fp32 accumulator tile from shared memory, so it does not care which instructions or
// fragment layout produced it.
//   eval            : y = A a + B with the folded running-stat affine.
//   train, 1 pass   : the tile holds every row (M <= BM): column stats, running-stat update and
//                     y = A a + B in one go.
//   train, 2 passes : per-column (mean, M2) of this tile's rows -> workspace (no atomics, so
//                     results are deterministic); y = a - tile_mean, rounded to T. Storing the
//                     deviation rather than a keeps its digits when a column's mean is large
//                     against its spread; bn_apply adds the mean back after the finalize.
// p.saved (optional, laid out like y): eval u = a + b, single-pass train c = a - mean_a, written
// here from the same tile; two-pass train leaves it to bn_apply, which knows mean_a.
#pragma once
#include "common/limits.h"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/tile.cuh"
#include "common/types.cuh"
#include "epilogue/bn_math.cuh"
#include "epilogue/store.cuh"

namespace fj {

struct CtaBarrier {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// NT threads (tid in [0, NT)) run the epilogue together; `bar` synchronizes exactly them.
template <class Spec, int NT>
struct BnEpilogue {
  static constexpr int BM = Spec::BM, BN = Spec::BN;
  // Threads that share one column in the reductions, and columns each thread walks.
  static constexpr int TPC = NT >= BN ? NT / BN : 1;
  static_assert(epilogue_threads_nest(NT, BN), "epilogue threads and BN must nest");
  static constexpr int kScratchFloats = 2 * BN + TPC * BN;
  static constexpr int kScratchBytes = kScratchFloats * 4;

  template <class Barrier>
  __device__ static void run(const Params& p, AccTile<BM, BN> tile, float* scratch, int m0, int n0,
                             int row_tile, int tid, Barrier bar) {
    float* coef_a = scratch;
    float* coef_b = scratch + BN;
    float* red = scratch + 2 * BN;
    // saved = a + saved_b[c]: the bias (eval) or -mean_a (single-pass train). It borrows the
    // reduction buffer, free once the statistics are taken (eval never reduces).
    float* saved_b = red;
    const int rows = min(BM, rows_of<Spec>(p) - m0);
    const int cols = min(BN, Spec::N - n0);
    if constexpr (!Spec::TRAIN) {
      for (int c = tid; c < cols; c += NT) {
        const Affine f = eval_affine<Spec>(p, n0 + c);
        coef_a[c] = f.a;
        coef_b[c] = f.b;
        if (p.saved) saved_b[c] = eval_saved_offset<Spec>(p, n0 + c);
      }
    } else {
      // Two-pass statistics inside the tile: mean first, then the sum of squared deviations.
      const float mean_scale = 1.0f / static_cast<float>(rows);
      column_reduce(
          tile, red, rows, tid, [](float v, float) { return v; }, coef_a, coef_a, bar);
      for (int c = tid; c < BN; c += NT) coef_a[c] *= mean_scale;  // coef_a = tile mean
      bar();
      column_reduce(
          tile, red, rows, tid, [](float v, float mean) { return (v - mean) * (v - mean); }, coef_a,
          coef_b, bar);  // coef_b = M2
      if constexpr (Spec::SINGLE_PASS) {
        const float factor = momentum_factor<Spec>(p);
        for (int c = tid; c < cols; c += NT) {
          const float var_a = coef_b[c] / static_cast<float>(rows_of<Spec>(p));
          const Affine f = train_column<Spec>(p, n0 + c, coef_a[c], var_a, factor, true);
          if (p.saved) saved_b[c] = -coef_a[c];
          coef_a[c] = f.a;
          coef_b[c] = f.b;
        }
      } else {
        float2* partials = reinterpret_cast<float2*>(p.ws_partials);
        for (int c = tid; c < cols; c += NT) {
          partials[static_cast<long long>(row_tile) * Spec::N + n0 + c] =
              make_float2(coef_a[c], coef_b[c]);
          coef_b[c] = -coef_a[c];
          coef_a[c] = 1.f;
        }
      }
    }
    bar();
    if constexpr (!StatsOnly<Spec>::value)
      store_affine_tile<Spec, NT>(p.y, tile, coef_a, coef_b, m0, n0, rows, cols, tid);
    if constexpr (!Spec::TRAIN || Spec::SINGLE_PASS) {
      if (p.saved)
        store_affine_tile<Spec, NT, true>(p.saved, tile, nullptr, saved_b, m0, n0, rows, cols, tid);
    }
  }

 private:
  // out[c] = sum over rows r < rows of f(tile(r, c), ref[c]) for every column c < BN (ref may
  // alias out: it is read before out is written).
  template <class F, class Barrier>
  __device__ static void column_reduce(AccTile<BM, BN> tile, float* red, int rows, int tid, F f,
                                       const float* ref, float* out, Barrier bar) {
    // Consecutive threads take consecutive columns: conflict-free shared-memory reads.
    for (int c = tid % BN; c < BN; c += (NT >= BN ? BN : NT)) {
      const int k = NT >= BN ? tid / BN : 0;
      const float rc = ref[c];
      float s = 0.f;
      for (int r = k; r < rows; r += TPC) s += f(tile(r, c), rc);
      red[k * BN + c] = s;
    }
    bar();
    for (int c = tid; c < BN; c += NT) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < TPC; ++k) s += red[k * BN + c];
      out[c] = s;
    }
    bar();
  }
};

}  // namespace fj
