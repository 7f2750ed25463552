// The backward pass's BatchNorm kernels: the column reductions and the elementwise map that turn
// dy into da, the operand of the two gradient GEMMs (kernels/grad_gemm.cuh), and the parameter
// gradients. The math and the workspace: common/backward_params.h. Schedules:
//   train: fj_bwd_reduce (dy partials) -> fj_bwd_coef (dbeta, dgamma, dscale, dbias = 0,
//          per-column coefficients) -> fj_bwd_da (da) -> the GEMMs; where da is wanted, the
//          three as one cooperative grid, fj_bwd_resident (or fj_bwd_resident_shared), the
//          passes its fallback
//   eval : fj_bwd_reduce (dy and dz partials, and da: dz = g dy / sqrt(rv + eps) needs no
//          reduction first) -> fj_bwd_params (all four) -> the GEMMs
// On sm_90+ every kernel is a programmatic dependent launch and joins the chain
// (common/grid_dependency.cuh) before it reads or writes anything: its launch and its first
// wave's start then overlap the previous kernel's last wave instead of following its end.
// Why partials per slab and merges in a fixed order rather than atomics: the gradients come out
// bit-identical from run to run, and no workspace has to be zeroed before a run.
//
// The reference beside it: verify/cpu_backward_reference.cpp computes the same quantities in
// float64, straight from the formulas.
#pragma once
#include "common/backward_params.h"
#include "common/backward_shape.h"
#include "common/grid_barrier.cuh"
#include "common/grid_dependency.cuh"
#include "common/types.cuh"
#include "epilogue/store.cuh"
#include "kernels/bn_apply.cuh"  // Packed

namespace fj {

template <class Spec>
struct BackwardShape {
  using T = typename Spec::T;
  static constexpr int kVecBytes =
      Spec::VEC_BYTES < kBackwardVecBytes ? Spec::VEC_BYTES : kBackwardVecBytes;
  static constexpr int VEC = kVecBytes / static_cast<int>(sizeof(T)) > 0
                                 ? kVecBytes / static_cast<int>(sizeof(T))
                                 : 1;
  static constexpr int kCols = kBackwardColThreads * VEC;  // columns of a block
  // grid: strips x slabs
  static constexpr int kStrips =
      backward_strips(Spec::N, Spec::VEC_BYTES, static_cast<int>(sizeof(T)));
  static_assert(kStrips == (Spec::N + kCols - 1) / kCols, "backward_strips disagrees with VEC");
  static constexpr int kColumnBlocks =
      (Spec::N + kBackwardMergeColumns - 1) / kBackwardMergeColumns;
  // fj_bwd_da's resident blocks per SM that its registers must allow. A layer of fewer than 8
  // strips has a grid of about kBackwardTargetBlocks blocks, which at the 73 registers fj_bwd_da
  // takes there unbounded (three blocks per SM) is 1.29 waves on 132 SMs, and one wave at four
  // (64 registers). ncu, bf16 train, H200: 65536x256 39.1 -> 32.1 us. Wider layers keep their
  // registers (87 at N >= 1024), which the cap made slower: 4096x4096 36.6 -> 39.5 us, and at
  // 8 strips (N = 1024, 512 blocks) 16384x1024 30.2 -> 32.0 and 65536x1024 109 -> 119 us.
  // (Register counts of the pass as measured then; with da as two FMAs and the rows kept packed
  // (for_each_row) it takes 48 at 4096x4096 and 8192x12288, under the cap either way.)
  static constexpr int kDaBlocksPerSm = kStrips * kBackwardMaxSlabs < kBackwardTargetBlocks ? 4 : 1;
};

// Per-column values every backward kernel reads, from the parameters and the forward's stats.
struct BackwardColumn {
  float s;   // scale (1 without)
  float g;   // gamma (1 without affine)
  float zs;  // zh = zs * saved + zo
  float zo;
  float dzk;  // eval: dz = dzk * dy
};

template <class Spec>
__device__ __forceinline__ BackwardColumn backward_column(const BackwardParams& p, int n) {
  using P = typename Spec::P;
  BackwardColumn c;
  c.s = Spec::HAS_SCALE ? load_param<P>(p.scale, n, 1.f) : 1.f;
  c.g = Spec::HAS_AFFINE ? load_param<P>(p.gamma, n, 1.f) : 1.f;
  if constexpr (Spec::TRAIN) {
    // saved = c = a - mean_a, so z - mean_z = s c.
    const float invstd = p.save_invstd[n];
    c.zs = c.s * invstd;
    c.zo = 0.f;
    c.dzk = 0.f;
  } else {
    // saved = u = a + b, z = s u.
    const float rm = to_float(static_cast<const P*>(p.running_mean)[n]);
    const float rv = to_float(static_cast<const P*>(p.running_var)[n]);
    const float istd = rsqrtf(rv + p.eps);
    c.zs = c.s * istd;
    c.zo = -rm * istd;
    c.dzk = c.g * istd;
  }
  return c;
}

// One row's {sum dy, sum dy saved} terms, added to a thread's column sums in row order. Written
// once: fj_bwd_reduce's partials and those fj_bwd_resident forms from the rows it holds must be the
// same bits.
template <int VEC>
__device__ __forceinline__ void add_dy_sums(float (&sdy)[VEC], float (&sdyu)[VEC],
                                            const float (&dy)[VEC], const float (&sv)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    sdy[j] += dy[j];
    sdyu[j] += dy[j] * sv[j];
  }
}

// da [m][LDDA] from VEC floats. Its rows are padded to 16 bytes (grad_da_row_elements) so that the
// gradient GEMMs load them with TMA or 16-byte copies whatever N is. The GEMMs never use the
// padding (TMA's bounds and the tiled loads' byte counts stop at N), but a 16-byte copy at a row's
// end reads it: the thread that writes a row's last columns writes the padding as zeros, so no
// load ever reads memory the run did not write.
// kWhole: the caller knows n_here == VEC, so the tail's element stores are not compiled in (ptxas
// has been seen to if-convert them into a row loop beside the vector store: docs/performance.md,
// "Train's BatchNorm side as one cluster kernel").
template <class Spec, int VEC, bool kWhole = false>
__device__ __forceinline__ void store_da(const BackwardParams& p, long long row, int c, int n_here,
                                         const float (&v)[VEC]) {
  using T = typename Spec::T;
  static_assert(Spec::LDDA >= Spec::N && Spec::LDDA * sizeof(T) % 16 == 0,
                "da's rows are N padded to 16 bytes");
  T* dst = static_cast<T*>(p.ws_da) + row * Spec::LDDA + c;
  if (kWhole || n_here == VEC) {
    store_vec<T, VEC>(dst, v);
  } else {
    for (int j = 0; j < n_here; ++j) dst[j] = from_float<T>(v[j]);
  }
  if constexpr (Spec::LDDA > Spec::N)
    if (c + n_here == Spec::N)
      for (int j = n_here; j < n_here + Spec::LDDA - Spec::N; ++j) dst[j] = from_float<T>(0.f);
}

template <class Spec>
struct BackwardBlock {
  using S = BackwardShape<Spec>;
  static constexpr int VEC = S::VEC;
  int tx, ty, c, n_here, row_begin, row_end, strip, slab;
  bool active;

  // The block's share of the grid's strips x slabs: `unit` (blockIdx.x, but for fj_bwd_resident,
  // whose blocks walk several). bottom_up: the last slab first (fj_bwd_da, see there).
  __device__ __forceinline__ BackwardBlock(const BackwardParams& p, int unit, bool bottom_up) {
    strip = unit % S::kStrips;
    slab = bottom_up ? p.slabs - 1 - unit / S::kStrips : unit / S::kStrips;
    tx = threadIdx.x % kBackwardColThreads;
    ty = threadIdx.x / kBackwardColThreads;
    c = strip * S::kCols + tx * VEC;
    n_here = min(VEC, Spec::N - c);
    row_begin = slab * p.slab_rows;
    row_end = min(row_begin + p.slab_rows, p.m);
    active = c < Spec::N;
  }

  // Adds the row threads' two sums per column in the order ty = 0..7 and stores them as the
  // block's slab partials: out[slab * N + column] = {a, b}.
  __device__ __forceinline__ void store_partials(float2* out, const float (&a)[VEC],
                                                 const float (&b)[VEC]) const {
    __shared__ float2 red[kBackwardRowThreads][S::kCols];
#pragma unroll
    for (int j = 0; j < VEC; ++j) red[ty][tx * VEC + j] = make_float2(a[j], b[j]);
    __syncthreads();
    const int col0 = c - tx * VEC;
    for (int k = threadIdx.x; k < S::kCols; k += kBackwardThreads) {
      if (col0 + k >= Spec::N) break;
      float2 t = red[0][k];
#pragma unroll
      for (int r = 1; r < kBackwardRowThreads; ++r) {
        t.x += red[r][k].x;
        t.y += red[r][k].y;
      }
      out[static_cast<long long>(slab) * Spec::N + col0 + k] = t;
    }
    __syncthreads();
  }
};

// Calls f(row, dy, saved) for each row of the block's slab this thread owns (every
// kBackwardRowThreads-th), with dy and saved as floats. Rows come UNROLL at a time and all of
// their loads are issued before the first is used (f's stores would otherwise keep the next
// row's loads behind them): these passes stream, and one load pair in flight per thread left
// fj_bwd_da at about half of H100's bandwidth (common/backward_shape.h has the figures).
//
// The loads stay packed until their row is used (2 registers per row of 4 bf16, not 4), and a
// thread decides once whether its columns are whole vectors, not per load. With a per-load
// choice and the rows as floats, ptxas gave fj_bwd_reduce 89 registers at N = 12288 (32 at N =
// 4096, where it did not keep the rows' loads in flight together): two blocks per SM, dy and
// saved read at 1.26 TB/s (ncu, H200, 8192x12288 bf16 train: 326 us against 66 us for 268 MB
// at 16384x4096).
template <class Spec, int UNROLL, class F>
__device__ __forceinline__ void for_each_row(const BackwardParams& p,
                                             const BackwardBlock<Spec>& blk, F&& f) {
  using T = typename Spec::T;
  constexpr int VEC = BackwardBlock<Spec>::VEC;
  constexpr int kStep = kBackwardRowThreads;
  int r = blk.row_begin + blk.ty;
  const T* const dy_col = static_cast<const T*>(p.dy) + blk.c;
  const T* const sv_col = static_cast<const T*>(p.saved) + blk.c;
  auto use = [&](int row, const Packed<T, VEC>& dy_raw, const Packed<T, VEC>& sv_raw) {
    float dy[VEC], sv[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dy[j] = dy_raw.get(j);
      sv[j] = sv_raw.get(j);
    }
    f(row, dy, sv);
  };
  if (blk.n_here < VEC) {
    // The strip's last chunk (N not a multiple of VEC): its n_here columns, zeros past them.
    for (; r < blk.row_end; r += kStep) {
      const long long off = static_cast<long long>(r) * Spec::LDY;
      Packed<T, VEC> dy, sv;
      dy.load_first(dy_col + off, blk.n_here);
      sv.load_first(sv_col + off, blk.n_here);
      use(r, dy, sv);
    }
    return;
  }
  auto load = [&](int row, Packed<T, VEC>& dy_raw, Packed<T, VEC>& sv_raw) {
    const long long off = static_cast<long long>(row) * Spec::LDY;
    dy_raw.load(dy_col + off);
    sv_raw.load(sv_col + off);
  };
  for (; r + (UNROLL - 1) * kStep < blk.row_end; r += UNROLL * kStep) {
    Packed<T, VEC> dy[UNROLL], sv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) load(r + u * kStep, dy[u], sv[u]);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) use(r + u * kStep, dy[u], sv[u]);
  }
  for (; r < blk.row_end; r += kStep) {
    Packed<T, VEC> dy, sv;
    load(r, dy, sv);
    use(r, dy, sv);
  }
}

// Pass 1. Train: per slab and column {sum dy, sum dy c}. Eval: {sum dy, sum dy zh}, plus
// {sum dz, sum dz u} and da = s dz (eval's dz is a column scale of dy).
// One block's slab of one strip (every thread of the block calls it: it synchronizes).
template <class Spec>
__device__ __forceinline__ void backward_reduce_unit(const BackwardParams& p,
                                                     const BackwardBlock<Spec>& blk) {
  constexpr int VEC = BackwardBlock<Spec>::VEC;
  BackwardColumn col[VEC];
  float sdy[VEC], sdyz[VEC], sdyu[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    sdy[j] = sdyz[j] = sdyu[j] = 0.f;
    if (blk.active && j < blk.n_here)
      col[j] = backward_column<Spec>(p, blk.c + j);
    else
      col[j] = BackwardColumn{0.f, 0.f, 0.f, 0.f, 0.f};
  }
  // Eight rows' loads in flight, not four: a narrow layer's grid is about kBackwardTargetBlocks
  // blocks, half the threads an H200 holds (ncu at 65536x256 bf16 train: 0.48 waves, 32
  // registers, dy and saved read at 2.5 TB/s), so each thread keeps more bytes in flight itself.
  // There the pass went from 27.7 to 24.7 us and the eval backward (whose pass also stores da)
  // from 0.083 to 0.075 ms; 4096x4096: 20.8 -> 19.6 us (H200; docs/performance.md).
  if (blk.active)
    for_each_row<Spec, 8>(p, blk, [&](int r, const float(&dy)[VEC], const float(&sv)[VEC]) {
      add_dy_sums(sdy, sdyu, dy, sv);
      float da[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float zh = col[j].zs * sv[j] + col[j].zo;
        sdyz[j] += dy[j] * zh;
        da[j] = col[j].s * col[j].dzk * dy[j];
      }
      if constexpr (!Spec::TRAIN)
        if (p.ws_da) store_da<Spec, VEC>(p, r, blk.c, blk.n_here, da);
    });
  if constexpr (Spec::TRAIN)
    blk.store_partials(reinterpret_cast<float2*>(p.ws_dy_partials), sdy, sdyu);
  else
    blk.store_partials(reinterpret_cast<float2*>(p.ws_dy_partials), sdy, sdyz);
  if constexpr (!Spec::TRAIN) {
    // Eval: dz = dzk dy, so its sums are the column's scale of dy's.
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      sdy[j] *= col[j].dzk;
      sdyu[j] *= col[j].dzk;
    }
    blk.store_partials(reinterpret_cast<float2*>(p.ws_dz_partials), sdy, sdyu);
  }
}

template <class Spec>
__device__ void bn_backward_reduce(const BackwardParams& p) {
  join_launch_chain();
  backward_reduce_unit<Spec>(p, BackwardBlock<Spec>(p, static_cast<int>(blockIdx.x), false));
}

// The per-column kernels' thread layout: kBackwardMergeColumns consecutive columns per block
// (consecutive threads, so a lane's loads of one slab are coalesced) x kBackwardMergeLanes lanes.
// `column_block`: the block's share of columns, blockIdx.x in the per-column kernels
// (fj_bwd_resident walks the column blocks over its grid).
__device__ __forceinline__ int merged_column(int column_block) {
  return column_block * kBackwardMergeColumns +
         static_cast<int>(threadIdx.x) % kBackwardMergeColumns;
}
// The threads that hold a merged column's total (lane 0) and own its outputs.
__device__ __forceinline__ bool merge_leader(int N, int column_block) {
  return threadIdx.x < kBackwardMergeColumns && merged_column(column_block) < N;
}

// The slab partials of merged_column(), summed in a fixed order: lane l adds slabs l, l + lanes,
// ... in order, then lane 0 adds the lanes' sums in lane order. Every thread of the block calls
// it (it synchronizes); the total is valid where merge_leader().
__device__ __forceinline__ float2 merge_slabs(const float* partials, int N, int slabs,
                                              int column_block) {
  static_assert(kBackwardColumnThreads == kBackwardMergeLanes * kBackwardMergeColumns);
  __shared__ float2 lanes[kBackwardMergeLanes][kBackwardMergeColumns];
  const int col = static_cast<int>(threadIdx.x) % kBackwardMergeColumns;
  const int lane = static_cast<int>(threadIdx.x) / kBackwardMergeColumns;
  const int n = merged_column(column_block);
  const float2* pp = reinterpret_cast<const float2*>(partials);
  float2 t = make_float2(0.f, 0.f);
  // Four of the lane's slabs' loads in flight at once, added in slab order: narrow layers have
  // up to kBackwardTargetBlocks slabs (common/backward_shape.h), and one dependent L2 load per
  // slab made the merge a chain of them.
  constexpr int kInFlight = 4, kStep = kBackwardMergeLanes * kInFlight;
  if (n < N)
    for (int s = lane; s < slabs; s += kStep) {
      float2 v[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i)
        v[i] = s + i * kBackwardMergeLanes < slabs
                   ? pp[static_cast<long long>(s + i * kBackwardMergeLanes) * N + n]
                   : make_float2(0.f, 0.f);
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        t.x += v[i].x;
        t.y += v[i].y;
      }
    }
  lanes[lane][col] = t;
  __syncthreads();
  if (lane == 0)
    for (int l = 1; l < kBackwardMergeLanes; ++l) {
      t.x += lanes[l][col].x;
      t.y += lanes[l][col].y;
    }
  __syncthreads();  // a second merge in the same kernel reuses `lanes`
  return t;
}

template <class P>
__device__ __forceinline__ void store_param(const BackwardParams& p, void* dst, int n, float v) {
  if (!dst) return;
  P* e = static_cast<P*>(dst) + n;
  *e = from_float<P>(p.accumulate ? to_float(*e) + v : v);
}

// Train mode's da from one element of dy and of saved (c = a - mean_a), with the column's
// coefficients {A, B, C, -} as bn_backward_coef writes them (BackwardParams::ws_coef):
//   da = s dz = s g invstd (dy - dbeta / m - zh dgamma / m),  zh = s invstd c
//      = A dy + B c + C,  A = s g invstd, B = -A s invstd dgamma / m, C = -A dbeta / m.
// Two fused multiply-adds, spelled out so the contraction does not depend on the compiler. (A dX
// GEMM that formed da itself with this function in shared memory, for the same bits, measured
// 1.6-1.8x slower than this pass plus the GEMM reading da: docs/performance.md.)
__device__ __forceinline__ float backward_da(const float4& k, float dy, float saved) {
  return __fmaf_rn(k.x, dy, __fmaf_rn(k.y, saved, k.z));
}

// Train, pass 2: dbeta, dgamma, dscale and dbias, and the coefficients of da. dbias is 0: in train
// mode y does not depend on the bias at all (the batch mean absorbs any shift of z, and the
// variance ignores it), so its gradient is 0 exactly, which a sum of the M values of dz would only
// approximate (to its rounding noise). With zh = s invstd c and
// invstd = (s^2 var(a) + eps)^-1/2, d zh / d s = eps invstd^3 c, so
// dscale = g eps invstd^3 sum dy c: no cancellation. The same quantity as sum dz (a + b), whose
// terms cancel to a fraction eps / (var z + eps) of their size, which the rounding of c in the
// storage type would swamp (bf16: errors of tens of percent).
// One column block's share (every thread of the block calls it).
template <class Spec>
__device__ __forceinline__ void backward_coef_columns(const BackwardParams& p, int column_block) {
  using P = typename Spec::P;
  // {sum dy, sum dy c}
  const float2 t = merge_slabs(p.ws_dy_partials, Spec::N, p.slabs, column_block);
  if (!merge_leader(Spec::N, column_block)) return;
  const int n = merged_column(column_block);
  const BackwardColumn col = backward_column<Spec>(p, n);
  const float invstd = p.save_invstd[n];
  const float dgamma = col.zs * t.y;
  if constexpr (Spec::HAS_AFFINE) {
    store_param<P>(p, p.dbeta, n, t.x);
    store_param<P>(p, p.dgamma, n, dgamma);
  }
  if constexpr (Spec::HAS_SCALE)
    store_param<P>(p, p.dscale, n, col.g * p.eps * invstd * invstd * invstd * t.y);
  if constexpr (Spec::HAS_BIAS) store_param<P>(p, p.dbias, n, 0.f);
  // da's coefficients (backward_da).
  const float inv_m = 1.f / static_cast<float>(p.m);
  const float a = col.s * col.g * invstd;
  reinterpret_cast<float4*>(p.ws_coef)[n] =
      make_float4(a, -a * col.zs * (dgamma * inv_m), -a * (t.x * inv_m), 0.f);
}

template <class Spec>
__device__ void bn_backward_coef(const BackwardParams& p) {
  join_launch_chain();
  backward_coef_columns<Spec>(p, static_cast<int>(blockIdx.x));
}

// The columns' coefficients of da (bn_backward_coef's), zeros past N.
template <class Spec>
__device__ __forceinline__ void load_da_coefficients(const BackwardParams& p,
                                                     const BackwardBlock<Spec>& blk,
                                                     float4 (&k)[BackwardBlock<Spec>::VEC]) {
#pragma unroll
  for (int j = 0; j < BackwardBlock<Spec>::VEC; ++j) {
    const bool here = blk.active && j < blk.n_here;
    k[j] = here ? reinterpret_cast<const float4*>(p.ws_coef)[blk.c + j] : make_float4(0, 0, 0, 0);
  }
}

// da of one block's slab of one strip, from dy and saved in memory.
template <class Spec>
__device__ __forceinline__ void backward_da_unit(const BackwardParams& p,
                                                 const BackwardBlock<Spec>& blk) {
  constexpr int VEC = BackwardBlock<Spec>::VEC;
  if (!blk.active) return;
  float4 k[VEC];
  load_da_coefficients<Spec>(p, blk, k);
  for_each_row<Spec, 4>(p, blk, [&](int r, const float(&dy)[VEC], const float(&sv)[VEC]) {
    float da[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) da[j] = backward_da(k[j], dy[j], sv[j]);
    store_da<Spec, VEC>(p, r, blk.c, blk.n_here, da);
  });
}

// Train, pass 3 (launched only when dx or dW is wanted): da = s dz = s g invstd (dy - dbeta / m
// - zh dgamma / m) (backward_da). Slabs from the bottom up: fj_bwd_reduce read dy and
// saved from the top down, so the last slabs it read are the likeliest to still be in L2 when this
// pass starts; and the rows of da this pass writes last, the top ones, are the ones the dX GEMM's
// raster reads first.
template <class Spec>
__device__ void bn_backward_da(const BackwardParams& p) {
  join_launch_chain();
  backward_da_unit<Spec>(p, BackwardBlock<Spec>(p, static_cast<int>(blockIdx.x), true));
}

// fj_bwd_resident's last step: da of the rows a thread holds, row(t, i) dy's (t = 0) or saved's
// (t = 1) row i (kWhole: its columns are a whole vector, decided once per thread rather than per
// store).
template <class Spec, bool kWhole, class Row>
__device__ __forceinline__ void store_resident_da(const BackwardParams& p,
                                                  const BackwardBlock<Spec>& blk,
                                                  const float4 (&k)[BackwardBlock<Spec>::VEC],
                                                  Row&& row) {
  constexpr int VEC = BackwardBlock<Spec>::VEC;
#pragma unroll
  for (int i = 0; i < kBackwardResidentRows; ++i) {
    const int r = blk.row_begin + blk.ty + i * kBackwardRowThreads;
    if (r >= blk.row_end) break;
    float da[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) da[j] = backward_da(k[j], row(0, i).get(j), row(1, i).get(j));
    store_da<Spec, VEC, kWhole>(p, r, blk.c, blk.n_here, da);
  }
}

// The rows of one unit a thread holds (row i: row_begin + ty + i * kBackwardRowThreads, the
// order fj_bwd_reduce adds them in), read, added into the unit's column partials as
// fj_bwd_reduce adds them, and stored as its partials (every thread of the block calls it: it
// synchronizes). keep() runs between the sums and the partials' exchange: rows it moves to
// shared memory are then not live across the exchange.
template <class Spec, class Keep>
__device__ __forceinline__ void load_held_unit(
    Keep&& keep, const BackwardParams& p, const BackwardBlock<Spec>& blk,
    Packed<typename Spec::T, BackwardBlock<Spec>::VEC> (&dy)[kBackwardResidentRows],
    Packed<typename Spec::T, BackwardBlock<Spec>::VEC> (&sv)[kBackwardResidentRows]) {
  using T = typename Spec::T;
  constexpr int VEC = BackwardBlock<Spec>::VEC;
  constexpr int R = kBackwardResidentRows;
  const int first = blk.row_begin + blk.ty;
  const T* const dy_col = static_cast<const T*>(p.dy) + blk.c;
  const T* const sv_col = static_cast<const T*>(p.saved) + blk.c;
  auto row_offset = [&](int i) {
    return static_cast<long long>(first + i * kBackwardRowThreads) * Spec::LDY;
  };
  auto here = [&](int i) { return first + i * kBackwardRowThreads < blk.row_end; };
  if (blk.active) {
    if (blk.n_here == VEC) {
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (here(i)) {
          dy[i].load(dy_col + row_offset(i));
          sv[i].load(sv_col + row_offset(i));
        }
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (here(i)) {
          dy[i].load_first(dy_col + row_offset(i), blk.n_here);
          sv[i].load_first(sv_col + row_offset(i), blk.n_here);
        }
    }
  }
  float sdy[VEC], sdyu[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) sdy[j] = sdyu[j] = 0.f;
  if (blk.active)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (here(i)) {
        float d[VEC], c[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) d[j] = dy[i].get(j), c[j] = sv[i].get(j);
        add_dy_sums(sdy, sdyu, d, c);
      }
  keep();
  blk.store_partials(reinterpret_cast<float2*>(p.ws_dy_partials), sdy, sdyu);
}

// da of the rows load_held_unit read, with the unit's coefficients: row(t, i) is dy's (t = 0) or
// saved's (t = 1) row i of this thread, wherever it is held.
template <class Spec, class Row>
__device__ __forceinline__ void store_held_da(const BackwardParams& p,
                                              const BackwardBlock<Spec>& blk, Row&& row) {
  constexpr int VEC = BackwardBlock<Spec>::VEC;
  float4 k[VEC];
  load_da_coefficients<Spec>(p, blk, k);
  // Only N's last vector can be partial: where N is whole vectors, no code for one (beside the
  // da loop of the units read again it made ptxas spill 4 bytes, fp16 N = 256).
  if (Spec::N % VEC == 0 || blk.n_here == VEC)
    store_resident_da<Spec, true>(p, blk, k, row);
  else
    store_resident_da<Spec, false>(p, blk, k, row);
}

// bn_backward_resident's body (and bn_backward_resident_shared's), for where a block keeps its
// rows (ResidentRows, common/backward_shape.h). registers: the block has one unit, held in
// registers (with units to read again beside it, the held rows stayed live across their loops
// and merges: ptxas spilled at 64 registers, and 2048x2048x512's backward measured 0.0387 ms,
// against 0.0366 with the paths apart and 0.0380 for the three passes, H200). shared: its first
// unit's rows wait in shared memory, dead in registers while it reads its other units; a kernel
// of its own, since beside the other two in one kernel ptxas spilled 44 bytes (4096x4096 bf16).
template <class Spec, ResidentRows kRows>
__device__ __forceinline__ void backward_resident_units(const BackwardParams& p) {
  using B = BackwardBlock<Spec>;
  using S = BackwardShape<Spec>;
  using Row = Packed<typename Spec::T, B::VEC>;
  constexpr int R = kBackwardResidentRows;
  constexpr bool kHold = kRows == ResidentRows::registers;
  constexpr bool kShared = kRows == ResidentRows::shared;
  // A strip's columns are whole column blocks of the coefficients' merge (the last strip's may
  // be fewer).
  static_assert(S::kCols % kBackwardMergeColumns == 0);
  constexpr int kColumnBlocksPerStrip = S::kCols / kBackwardMergeColumns;
  auto strip_column_blocks = [](int strip) {
    return static_cast<unsigned>(
        min(kColumnBlocksPerStrip, S::kColumnBlocks - strip * kColumnBlocksPerStrip));
  };
  const int units = S::kStrips * p.slabs;
  const int step = static_cast<int>(gridDim.x);
  const int held = static_cast<int>(blockIdx.x);
  // Shared memory's rows: [dy, saved][i][thread], each thread's own (no barrier between its
  // stores and its loads).
  extern __shared__ __align__(16) unsigned char fj_bwd_held_rows[];
  auto shared_row = [&](int t, int i) -> Row& {
    return reinterpret_cast<Row*>(fj_bwd_held_rows)[(t * R + i) * kBackwardThreads + threadIdx.x];
  };
  static_assert(sizeof(Row) <= kBackwardVecBytes, "kBackwardResidentSharedBytes holds the rows");
  // The first unit, read first: the one the other units' reads would push out of L2 soonest.
  if constexpr (kShared) {
    const B blk(p, held, false);
    Row dy[R], sv[R];
    load_held_unit<Spec>(
        [&] {
          if (blk.active)
#pragma unroll
            for (int i = 0; i < R; ++i) shared_row(0, i) = dy[i], shared_row(1, i) = sv[i];
        },
        p, blk, dy, sv);
  }
  // The units read again: all of the block's, those after the first where shared memory holds
  // that one, or none where the block holds its one unit in registers.
  const int reread_first = kHold ? units : kShared ? held + step : held;
  for (int u = reread_first; u < units; u += step) backward_reduce_unit<Spec>(p, B(p, u, false));
  const B blk(p, held, false);
  Row dy[kHold ? R : 1], sv[kHold ? R : 1];
  if constexpr (kHold) load_held_unit<Spec>([] {}, p, blk, dy, sv);
  // The strips' ready counters (kHold) start at zero, ordered before every add by the grid
  // barrier.
  if constexpr (kHold)
    if (blk.slab == 0 && threadIdx.x == 0) p.ws_strip_ready[blk.strip] = 0u;
  // Every unit's partials are stored and the CTA synchronized after them (store_partials ends in
  // a CTA barrier; a block with no unit stored nothing).
  __syncthreads();
  if (threadIdx.x == 0) grid_barrier_arrive_and_wait();
  __syncthreads();
  // The coefficients, column block by column block; where blocks hold their unit in registers,
  // each column block is counted on its strip once stored, and a block waits for its own
  // strip's, not for the whole grid.
  for (int cb = held; cb < S::kColumnBlocks; cb += step) {
    backward_coef_columns<Spec>(p, cb);
    if constexpr (kHold) {
      __syncthreads();
      if (threadIdx.x == 0) counter_release_add(p.ws_strip_ready + cb / kColumnBlocksPerStrip);
    }
  }
  if constexpr (!kHold) __syncthreads();  // the coefficients this block stored, before arriving
  // A block that reads units again forms da in many strips: it waits for the whole grid
  // (waiting on every strip's counter measured 0.6 us slower at 4096^3 bf16, ncu, H200).
  if (threadIdx.x == 0) {
    if constexpr (kHold)
      counter_wait_at_least(p.ws_strip_ready + blk.strip, strip_column_blocks(blk.strip));
    else
      grid_barrier_arrive_and_wait();
  }
  __syncthreads();
  if constexpr (kHold)
    if (blk.active)
      store_held_da<Spec>(p, blk, [&](int t, int i) -> const Row& { return t ? sv[i] : dy[i]; });
  // The units read again, the last read first: the likeliest still in L2.
  if (reread_first < units)
    for (int u = reread_first + (units - 1 - reread_first) / step * step; u >= reread_first;
         u -= step)
      backward_da_unit<Spec>(p, B(p, u, false));
  // The first unit last, from shared memory.
  if constexpr (kShared)
    if (blk.active) store_held_da<Spec>(p, blk, shared_row);
}

// Train, all three passes in one cooperative grid: a block per SM slot the device holds at once
// (at most the strips x slabs units), each walking units blockIdx.x, + gridDim.x, ... through the
// three passes' bodies, with a grid barrier (common/grid_barrier.cuh) after the column sums
// instead of a launch. Where every unit has a block and a thread's rows of a slab fit in its
// registers (backward_slab_in_registers), each block reads its unit once and holds it from the
// column sums to da, and waits only for its strip's coefficients (counts in ws_strip_ready)
// before forming it; elsewhere a second grid barrier follows the coefficients and every unit is
// read again for da, the last read first (the likeliest in L2).
// Why: at mid-size layers the three passes cost the backward more than the bytes they move; at
// 2048x2048x512 bf16 (ncu, H200) fj_bwd_reduce took 8.5 us, fj_bwd_coef 3.2 and fj_bwd_da 7.3,
// and a first build of fj_bwd_resident, whose held path is this one's, 13.8. Each unit's arithmetic
// and its order are the three passes' (the same partials, merge and coefficients), so da and the
// parameter gradients are bit for bit theirs, which gpu_backward_test checks, and a run whose
// cooperative launch is refused takes the three passes with the same result.
template <class Spec>
__device__ void bn_backward_resident(const BackwardParams& p) {
  static_assert(Spec::TRAIN, "eval's one pass forms da already");
  static_assert(kBackwardThreads == kBackwardColumnThreads,
                "the coefficients' merge runs on the elementwise grid's blocks");
  join_launch_chain();
  // ResidentRows::shared has its own kernel (bn_backward_resident_shared); launched here instead
  // (a set without it, or no block with its shared memory fitting), a block reads its rows again.
  // ResidentRows::registers' rule, spelled out: through a function (or ResidentRows) NVRTC's
  // ptxas spilled 4 bytes here at 64 registers (4096x4096 bf16, sm_90a), as written not.
  if (backward_slab_in_registers(p.slab_rows) &&
      BackwardShape<Spec>::kStrips * p.slabs == static_cast<int>(gridDim.x))
    backward_resident_units<Spec, ResidentRows::registers>(p);
  else
    backward_resident_units<Spec, ResidentRows::reread>(p);
}

// fj_bwd_resident where its blocks have more units than one and slabs short enough to hold
// (ResidentRows::shared): each block keeps its first unit's rows in kBackwardResidentSharedBytes
// of dynamic shared memory, so da reads them from there rather than from DRAM. At 4096x4096 bf16
// dy and saved are 64 MB against the 50 MB L2, and fj_bwd_resident's second read of them took
// ~44 MB from DRAM; holding a quarter of the units here took the kernel's DRAM read from 108 to
// 92 MB and its time from 44.4 to 41.5 us (ncu, three launches each, H200). Launched
// only with fewer blocks than units (launch_resident_passes): every block has a first unit.
template <class Spec>
__device__ void bn_backward_resident_shared(const BackwardParams& p) {
  static_assert(Spec::TRAIN, "eval's one pass forms da already");
  join_launch_chain();
  backward_resident_units<Spec, ResidentRows::shared>(p);
}

// Eval, last pass: the parameter gradients fj_bwd_reduce left as partials: dbeta, dgamma,
// dbias = s sum dz and dscale = sum dz u. (Train writes its four in bn_backward_coef.)
template <class Spec>
__device__ void bn_backward_params(const BackwardParams& p) {
  static_assert(!Spec::TRAIN, "train's parameter gradients come from bn_backward_coef");
  using P = typename Spec::P;
  join_launch_chain();
  float2 dy_sums = make_float2(0.f, 0.f), dz_sums = make_float2(0.f, 0.f);
  const int block = static_cast<int>(blockIdx.x);
  if constexpr (Spec::HAS_AFFINE) dy_sums = merge_slabs(p.ws_dy_partials, Spec::N, p.slabs, block);
  if constexpr (Spec::HAS_BIAS || Spec::HAS_SCALE)
    dz_sums = merge_slabs(p.ws_dz_partials, Spec::N, p.slabs, block);
  if (!merge_leader(Spec::N, block)) return;
  const int n = merged_column(block);
  if constexpr (Spec::HAS_AFFINE) {
    store_param<P>(p, p.dbeta, n, dy_sums.x);
    store_param<P>(p, p.dgamma, n, dy_sums.y);
  }
  if constexpr (Spec::HAS_BIAS || Spec::HAS_SCALE) {
    const float2 t = dz_sums;
    const float s = Spec::HAS_SCALE ? load_param<P>(p.scale, n, 1.f) : 1.f;
    if constexpr (Spec::HAS_BIAS) store_param<P>(p, p.dbias, n, s * t.x);
    if constexpr (Spec::HAS_SCALE) store_param<P>(p, p.dscale, n, t.y);
  }
}

}  // namespace fj
