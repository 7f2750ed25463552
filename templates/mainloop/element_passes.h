// Where ElementLoader's copies go (mainloop/operand_loader.cuh): which element of a TR x TC tile
// each pass of each thread copies, and the byte of the stage it lands in. Plain C++ beside the
// qualifiers, so that the host tests check it against the layout (element_passes_test).
//
// W consecutive threads take W consecutive columns of one row (one 4W-byte segment of global
// memory), the next W threads the next row: thread t starts at (t / W, t % W), and pass i moves
// it by (dr(i), dc(i)) with S = THREADS / W rows per pass, wrapping to the next W columns at TR
// rows. Source element (r, c) lands at Dst::offset(c, r).
#pragma once
#include "common/host_device.h"

namespace fj {

template <class Dst, int TR, int TC, int THREADS, int W>
struct ElementPasses {
  static constexpr int kElems = TR * TC;
  static constexpr int kIters = (kElems + THREADS - 1) / THREADS;
  static constexpr int S = THREADS / W;
  static_assert(THREADS % W == 0 && TC % W == 0,
                "ElementLoader: W must divide THREADS and the tile's columns");
  static_assert(TR % S == 0 || S % TR == 0,
                "ElementLoader: THREADS / W and the tile's rows must divide one another");

  // Pass i's step from the thread's first element (compile-time).
  FJ_HOST_DEVICE_INLINE static constexpr int dr(int i) { return (i * S) % TR; }
  FJ_HOST_DEVICE_INLINE static constexpr int dc(int i) { return W * ((i * S) / TR); }
  // The thread's first element; tid < THREADS, so with TR % S == 0 the first pass never wraps.
  FJ_HOST_DEVICE_INLINE static constexpr int first_row(int tid) {
    return TR % S == 0 ? tid / W : (tid / W) % TR;
  }
  FJ_HOST_DEVICE_INLINE static constexpr int first_col(int tid) {
    return tid % W + (TR % S == 0 ? 0 : W * ((tid / W) / TR));
  }
  // Whether pass i of the thread with lin = tid / W is inside the tile (the last pass of a tile
  // that is not a multiple of THREADS elements is not, for some threads).
  FJ_HOST_DEVICE_INLINE static constexpr bool in_tile(int lin, int i) {
    return kElems % THREADS == 0 || lin + i * S < TR * (TC / W);
  }

  // Stage offsets. Computed per pass from (c + dc(i), r + dr(i)), ptxas hoisted all kIters of
  // them out of the k loop and held them across it (tf32 gradient GEMMs, NVRTC 13.0: 12-128
  // bytes of spills at 255 registers on sm_80, sm_86, sm_89, sm_100 and sm_120, 44-80 on
  // sm_90a). But a pass only ever moves the thread by one of kBases row steps and a multiple of
  // kColUnit columns, and where Dst promises that kLinearPeriod columns move every offset by
  // kLinearPeriod * kLinearStride bytes (SwizzledWords: the swizzle's period), the kBases
  // offsets of the first pass's columns, taken once, give every pass's by adding a constant.
  static constexpr int kBases = TR % S == 0 ? TR / S : 1;
  static constexpr int kColUnit = TR % S == 0 ? W : W * (S / TR);
  // (The period, or 1: nvcc warns of a % 0 even where && never evaluates it.)
  static constexpr int kPeriod = Dst::kLinearPeriod > 0 ? Dst::kLinearPeriod : 1;
  static constexpr bool kLinear = Dst::kLinearPeriod > 0 && kColUnit % kPeriod == 0;
  struct Bases {
    int off[kLinear ? kBases : 1];  // unused on the per-pass path
  };
  // For the thread whose first element is (r, c) (first_row, first_col).
  FJ_HOST_DEVICE_INLINE static constexpr Bases bases(int r, int c) {
    Bases b{};
    if constexpr (kLinear)
      for (int j = 0; j < kBases; ++j) b.off[j] = Dst::offset(c, r + j * S);
    return b;
  }
  // Pass i's byte in the stage.
  FJ_HOST_DEVICE_INLINE static constexpr int offset(const Bases& b, int r, int c, int i) {
    if constexpr (kLinear)
      return b.off[TR % S == 0 ? dr(i) / S : 0] + dc(i) * Dst::kLinearStride;
    else
      return Dst::offset(c + dc(i), r + dr(i));
  }
};

}  // namespace fj
