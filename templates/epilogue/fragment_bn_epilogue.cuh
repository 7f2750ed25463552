// The fused BatchNorm epilogue straight from wgmma accumulator registers (warpspec kernel).
// Same results and workspace contract as BnEpilogue (bn_epilogue.cuh): eval affine; train
// single pass; train two-pass writing this tile's (mean, M2) and y = a - tile_mean. It differs
// only in where the accumulators live: instead of spilling the fp32 tile to shared memory and
// reading it back per column, column sums are reduced in registers and warp shuffles, and only
// the rounded outputs pass through a small staging buffer on their way to 16-byte stores.
// That keeps the epilogue's shared memory small enough to sit beside the full stage ring, so a
// persistent CTA's producer can load the next tile while the consumers run this.
//
// TMA_STORE: instead of 128-byte chunks through a warpgroup's staging buffer and 16-byte
// stores that the consumers issue themselves, y leaves through per-warp boxes and TMA stores
// (epilogue/warp_box_store.cuh). On H100 that made bf16 train 1.6-1.8% faster at 4096^3 and
// left eval unchanged (docs/performance.md, sixth session); for fp32 y the boxes, smaller than
// the staging buffer, also let tf32's 128x256 tile keep a 4th stage (same file, "TMA stores of
// fp32 y").
//
// p.saved (optional, laid out like y): eval u = a + b and single-pass train c = a - mean_a leave
// by the same path as y without TMA_STORE; with TMA_STORE through the same boxes, copied out by
// the warp's own 16-byte stores (y's tensor map names y only). Two-pass train leaves it to
// bn_apply, which knows mean_a.
//
// Fragment layout (wgmma m64nNk*, fp32 D): consumer warpgroup `wg` owns rows
// [wg * WG_M, (wg + 1) * WG_M) of the tile, M_ATOMS atoms of 64 rows each; in atom `ma`, warp w
// of the group owns 16 rows and lane (g = lane / 4, q = lane % 4) holds, for every 8-column
// block j, d[4j + 2h + e] at row 64 ma + 16 w + g + 8 h, column 8 j + 2 q + e.
#pragma once
#include "common/cp_async.cuh"
#include "common/grid_barrier.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/select.cuh"
#include "common/types.cuh"
#include "epilogue/bn_math.cuh"
#include "epilogue/column_merge.cuh"
#include "epilogue/warp_box_store.cuh"
#include "mainloop/mbarrier.cuh"
#include "mainloop/tma.cuh"

namespace fj {

// CONSUMERS warpgroups share the tile; they synchronize on named barriers BAR0 (all of them)
// and BAR0 + 1 + wg (warpgroup wg alone), so two teams with different BAR0 can run side by side.
template <class Spec, int CONSUMERS, int M_ATOMS, int BAR0 = 1, bool TMA_STORE = false>
struct FragmentBnEpilogue {
  using T = typename Spec::T;
  static constexpr int BM = Spec::BM, BN = Spec::BN;
  static constexpr int NT = 128 * CONSUMERS;
  static constexpr int kWarps = 4 * CONSUMERS;
  static constexpr int WG_M = 64 * M_ATOMS;
  static constexpr int kRegs = BN / 2;
  static_assert(BM == WG_M * CONSUMERS, "fragment epilogue: BM must be CONSUMERS x 64 x M_ATOMS");
  static_assert(BN % 32 == 0, "fragment epilogue: BN must be a multiple of 32");
  // Stores go out in column chunks of 128 bytes per row, staged per warpgroup. The row pitch
  // pads by 8 * sizeof(T) bytes so that the fragment writes (8 rows x 4 lanes of a warp, 4 or
  // 8 bytes each) land in distinct banks, while the 16-byte reads stay row-contiguous.
  static constexpr int kChunkCols = 128 / static_cast<int>(sizeof(T));
  static constexpr int kChunks = BN / kChunkCols;
  static_assert(BN % kChunkCols == 0, "fragment epilogue: BN must hold whole 128-byte chunks");
  static constexpr int kStageLd = 128 + 8 * static_cast<int>(sizeof(T));
  // TMA_STORE: per warp two boxes of [16 rows][64 bytes].
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "fragment epilogue: y is 16- or 32-bit");
  using Boxes = WarpBoxStore<T, BN, M_ATOMS>;
  static constexpr int kBoxRows = Boxes::kBoxRows, kBoxRowBytes = Boxes::kBoxRowBytes;
  static constexpr int kBoxCols = Boxes::kBoxCols;
  static constexpr int kStagingBytes =
      TMA_STORE ? kWarps * Boxes::kWarpBytes : CONSUMERS * WG_M * kStageLd;
  static constexpr int kRedFloats = kWarps * BN;
  // Staging first: TMA_STORE boxes need the alignment of the swizzle pattern, which the caller
  // gives the scratch base (kScratchAlign).
  static constexpr int kScratchBytes = kStagingBytes + (kRedFloats + 2 * BN) * 4;
  static constexpr int kScratchAlign = TMA_STORE ? Boxes::kAlign : 16;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte store

  using Acc = float[M_ATOMS][kRegs];
  // One fragment pair (columns 8 j + 2 q, + 1 of a row) as store() hands it on: two 16-bit
  // values packed in an unsigned, or two floats.
  using Pair = typename Boxes::Pair;

  // saved = a + offs[c] in eval: offs = eval_saved_offset (the bias, or WS_AFFINE's -mean_a),
  // zero past N; `count` threads from `tid`.
  __device__ __forceinline__ static void eval_saved_offsets(const Params& p, int n0, float* offs,
                                                            int tid, int count) {
    const int cols = min(BN, Spec::N - n0);
    for (int c = tid; c < BN; c += count)
      offs[c] = c < cols ? eval_saved_offset<Spec>(p, n0 + c) : 0.f;
  }

  // Eval coefficients of columns [n0, n0 + BN) into coef_a / coef_b (zero past N), computed by
  // `count` threads starting at `tid`. Eval needs nothing from the accumulators, so a kernel can
  // run this ahead of time on otherwise idle threads and pass the result to run().
  __device__ __forceinline__ static void eval_coefficients(const Params& p, int n0, float* coef_a,
                                                           float* coef_b, int tid, int count) {
    const int cols = min(BN, Spec::N - n0);
    for (int c = tid; c < BN; c += count) {
      Affine f{0.f, 0.f};
      if (c < cols) f = eval_affine<Spec>(p, n0 + c);
      coef_a[c] = f.a;
      coef_b[c] = f.b;
    }
  }

  // tid in [0, NT): the consumer threads, warpgroup-major. `scratch` is kScratchBytes of shared
  // memory, kScratchAlign-byte aligned, owned by this epilogue for the duration of the call
  // (TMA_STORE: and by the stores it leaves in flight, until the next call or drain()). Eval
  // only: `eval_coef` (non-null) holds eval_coefficients() of this tile, [0, BN) = A,
  // [BN, 2 BN) = B, and the call then synchronizes only within each warpgroup (TMA_STORE: each
  // warp, unless p.saved). TMA_STORE: `ty` maps y in boxes of [16 rows][kBoxCols columns],
  // 64-byte swizzle.
  __device__ static void run(const Params& p, Acc& acc, char* scratch, int m0, int n0, int row_tile,
                             int tid, const float* eval_coef = nullptr,
                             const TmaDescriptor* ty = nullptr) {
    char* staging = scratch;
    float* red = reinterpret_cast<float*>(scratch + kStagingBytes);
    float* coef_a = red + kRedFloats;
    float* coef_b = coef_a + BN;
    // saved = a + saved_b[c] (see eval_saved_offsets and the single pass below). It borrows the
    // reduction buffer, which eval never uses and train is done with by then.
    float* saved_b = red;
    if constexpr (!Spec::TRAIN) {
      if (eval_coef) {
        store<false>(p, acc, eval_coef, eval_coef + BN, staging, m0, n0, tid, ty);
        if (p.saved) {
          // This path synchronizes within warpgroups only: each takes its own 4 x BN floats of
          // the buffer, after its own reads of the previous tile's.
          const int wg = tid / 128;
          saved_b = red + wg * 4 * BN;
          group_sync(wg);
          eval_saved_offsets(p, n0, saved_b, tid % 128, 128);
          group_sync(wg);
          store<true>(p, acc, nullptr, saved_b, staging, m0, n0, tid, ty);
        }
        return;
      }
    }
    // The previous tile's epilogue may still be reading the coefficients.
    all_sync();
    if constexpr (!Spec::TRAIN) {
      eval_coefficients(p, n0, coef_a, coef_b, tid, NT);
      if (p.saved) eval_saved_offsets(p, n0, saved_b, tid, NT);
    } else {
      const int rows = min(BM, rows_of<Spec>(p) - m0);
      const int cols = min(BN, Spec::N - n0);
      // Tile mean first, then the sum of squared deviations from it (as BnEpilogue does).
      column_partials<false>(acc, red, nullptr, rows, tid);
      all_sync();
      const float mean_scale = 1.0f / static_cast<float>(rows);
      for (int c = tid; c < BN; c += NT) coef_a[c] = column_total(red, c) * mean_scale;
      all_sync();
      column_partials<true>(acc, red, coef_a, rows, tid);
      all_sync();
      if constexpr (Spec::SINGLE_PASS) {
        const float factor = momentum_factor<Spec>(p);
        for (int c = tid; c < BN; c += NT) {
          Affine f{0.f, 0.f};
          if (c < cols) {
            const float var_a = column_total(red, c) / static_cast<float>(rows_of<Spec>(p));
            f = train_column<Spec>(p, n0 + c, coef_a[c], var_a, factor, true);
          }
          // red[c] belongs to column c, whose sums only this thread reads (just above).
          if (p.saved) saved_b[c] = -coef_a[c];
          coef_a[c] = f.a;
          coef_b[c] = f.b;
        }
      } else {
        float2* partials = reinterpret_cast<float2*>(p.ws_partials);
        for (int c = tid; c < BN; c += NT) {
          const float mean = coef_a[c];
          if (c < cols)
            partials[static_cast<long long>(row_tile) * Spec::N + n0 + c] =
                make_float2(mean, column_total(red, c));
          coef_a[c] = 1.f;
          coef_b[c] = -mean;
        }
        if constexpr (GridSync<Spec>::value) {
          if (p.grid_sync) {
            finish_resident(p, acc, coef_a, coef_b, saved_b, staging, m0, n0, row_tile, tid, ty);
            return;
          }
        }
      }
    }
    // A statistics-only pass stores nothing here, yet keeps the barrier: without it ptxas moved
    // work across the tile loop's back edge and spilled (372 bytes at 65536x256x64 bf16), and the
    // pass took 22.3 us instead of 16.2 (ncu, H200).
    all_sync();
    if constexpr (!StatsOnly<Spec>::value)
      store<false>(p, acc, coef_a, coef_b, staging, m0, n0, tid, ty);
    if constexpr (!Spec::TRAIN || Spec::SINGLE_PASS) {
      if (p.saved) store<true>(p, acc, nullptr, saved_b, staging, m0, n0, tid, ty);
    }
  }

  // A resident run's round: the team's arrival at the round's grid barrier, once its partials
  // (if it had a tile) are written, and its wait for every CTA's. finish_resident meets each
  // round it has a tile in; consume() has a CTA without a tile in the last round (which holds
  // fewer column panels than the grid has room for) meet it all the same, since the barrier
  // counts every CTA.
  __device__ __forceinline__ static void meet_round(int tid) {
    all_sync();  // the team's partials before the arrival that releases them
    if (tid == 0) grid_barrier_arrive_and_wait();
    all_sync();
  }

  // TMA_STORE: before the CTA exits, its last stores must have read the staging boxes (which die
  // with the CTA) and written y (which the next kernel may read).
  __device__ __forceinline__ static void drain(int tid) {
    if constexpr (TMA_STORE) Boxes::drain(tid % 32);
  }

 private:
  // Spec::GRID_SYNC with p.grid_sync (a cooperative launch, one tile per CTA per round; a round
  // holds whole column panels, WarpspecGemm::make_raster): this tile's partials are written;
  // once every CTA's of the round are, each CTA merges its columns over all row tiles
  // itself, in fj_finalize's order (column_merge.cuh), and stores y = A a + B and `saved`
  // straight from its accumulators, as recompute's second pass would from the same ones. The
  // results are then recompute's bit for bit, without its second mainloop, the finalize launch
  // and the GEMM's relaunch. The CTAs of row tile 0 record the running and saved stats; CTA 0
  // bumps num_batches_tracked after its last round (consume()): every CTA read it before the
  // barrier of each round, the last included.
  __device__ static void finish_resident(const Params& p, Acc& acc, float* coef_a, float* coef_b,
                                         float* saved_b, char* staging, int m0, int n0,
                                         int row_tile, int tid, const TmaDescriptor* ty) {
    const int cols = min(BN, Spec::N - n0);
    const float factor = momentum_factor<Spec>(p);
    // This thread's columns' parameters, loaded while the grid gathers (not after the merge).
    constexpr int kColsPerThread = (BN + NT - 1) / NT;
    ColumnParams params[kColsPerThread];
#pragma unroll
    for (int i = 0; i < kColsPerThread; ++i)
      if (tid + i * NT < cols) params[i] = column_params<Spec>(p, n0 + tid + i * NT);
    meet_round(tid);
    const float rows = static_cast<float>(rows_of<Spec>(p));
#pragma unroll
    for (int i = 0; i < kColsPerThread; ++i) {
      const int c = tid + i * NT;
      if (c >= BN) break;
      Affine f{0.f, 0.f};
      float cnt = 0.f, mean = 0.f, m2 = 0.f;
      if (c < cols) {
        merge_column_in_finalize_order<Spec>(p, n0 + c, cnt, mean, m2);
        f = train_column_of<Spec>(p, params[i], n0 + c, mean, m2 / rows, factor, row_tile == 0,
                                  rows);
      }
      coef_a[c] = f.a;
      coef_b[c] = f.b;
      saved_b[c] = -mean;
    }
    all_sync();
    store<false>(p, acc, coef_a, coef_b, staging, m0, n0, tid, ty);
    if (p.saved) store<true>(p, acc, nullptr, saved_b, staging, m0, n0, tid, ty);
  }

  __device__ __forceinline__ static void all_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(BAR0), "n"(NT) : "memory");
  }
  __device__ __forceinline__ static void group_sync(int wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(BAR0 + 1 + wg) : "memory");
  }

  __device__ __forceinline__ static float column_total(const float* red, int c) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w * BN + c];
    return s;
  }

  // red[warp][c] = this warp's sum over its valid rows of v (CENTERED: (v - ref[c])^2) for every
  // column c. Each lane first sums its own rows; then the 8 lanes that share columns (same q)
  // combine in three shuffle rounds, each round halving the values a lane carries (it keeps
  // the half its lane bit selects and sends the other), so a group of 32 columns costs
  // 4 + 2 + 1 shuffles instead of 8 x 3.
  //
  // A tile of BM valid rows (all but a run's last row tile) takes the FULL instance, which has
  // no per-row select. The train epilogue is mostly instruction issue (ncu at 65536x256x64 bf16
  // on H200: ~60% of the statistics-only pass's warp samples, nearly all "selected" or "not
  // selected", ~1,400 instructions per warp and tile), and the selects were a fifth of them:
  // without them the pass issued 4.96M instructions instead of 6.26M and took 15.2 us instead of
  // 15.9 (measured before the rounding below was made explicit). Both instances add a lane's rows
  // in the same order with the same explicitly rounded operations (__fadd_rn, and __fmaf_rn for the
  // squares), so their bits for a row agree, and no kernel's sums depend on whether its compiler
  // chose to fuse a multiply with an add: the schedules that compare partials bit for bit
  // (two-pass, recompute, grid_sync, overlap_apply) compile this in different kernels.
  template <bool CENTERED>
  __device__ __forceinline__ static void column_partials(const Acc& acc, float* red,
                                                         const float* ref, int rows, int tid) {
    if (rows >= BM)
      column_partials<CENTERED, true>(acc, red, ref, rows, tid);
    else
      column_partials<CENTERED, false>(acc, red, ref, rows, tid);
  }

  template <bool CENTERED, bool FULL>
  __device__ __forceinline__ static void column_partials(const Acc& acc, float* red,
                                                         const float* ref, int rows, int tid) {
    const int lane = tid % 32;
    const int warp = tid / 32;  // 0 .. kWarps - 1, warpgroup-major
    const int g = lane / 4, q = lane % 4;
    const int row0 = (warp / 4) * WG_M + (warp % 4) * 16 + g;
    bool valid[M_ATOMS][2];
#pragma unroll
    for (int ma = 0; ma < M_ATOMS; ++ma)
#pragma unroll
      for (int h = 0; h < 2; ++h) valid[ma][h] = row0 + 64 * ma + 8 * h < rows;
    const bool b4 = (lane >> 4) & 1, b3 = (lane >> 3) & 1, b2 = (lane >> 2) & 1;
    float total[BN / 32];
#pragma unroll
    for (int grp = 0; grp < BN / 32; ++grp) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int j = 4 * grp + i / 2, e = i % 2;
        float mean = 0.f;
        if constexpr (CENTERED) mean = ref[8 * j + 2 * q + e];
        float s = 0.f;
#pragma unroll
        for (int ma = 0; ma < M_ATOMS; ++ma)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float a = acc[ma][4 * j + 2 * h + e];
            if (FULL || valid[ma][h]) {
              if constexpr (CENTERED)
                s = __fmaf_rn(a - mean, a - mean, s);
              else
                s = __fadd_rn(s, a);
            }
          }
        v[i] = s;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float send = b4 ? v[i] : v[i + 4];
        const float keep = b4 ? v[i + 4] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float send = b3 ? v[i] : v[i + 2];
        const float keep = b3 ? v[i + 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
      }
      {
        const float send = b2 ? v[0] : v[1];
        const float keep = b2 ? v[1] : v[0];
        v[0] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
      }
      total[grp] = v[0];
    }
    // This lane now holds local index k = 4 b4 + 2 b3 + b2 of every group. (Stored only now:
    // a store to `red` between the groups would hold back the next group's loads of `ref`,
    // which the compiler cannot tell apart from it.)
    const int k = 4 * b4 + 2 * b3 + b2;
#pragma unroll
    for (int grp = 0; grp < BN / 32; ++grp)
      red[warp * BN + 32 * grp + 8 * (k / 2) + 2 * q + (k % 2)] = total[grp];
  }

  // y = coef_a * acc + coef_b, rounded to T, through the staging buffer into 16-byte stores
  // (TMA_STORE: into TMA stores). SAVED: p.saved = acc + coef_b instead (coef_a unused), through
  // the same staging into the threads' own stores.
  template <bool SAVED>
  __device__ __forceinline__ static void store(const Params& p, const Acc& acc, const float* coef_a,
                                               const float* coef_b, char* staging, int m0, int n0,
                                               int tid, const TmaDescriptor* ty) {
    const int q = tid % 4;
    // Columns 8 j + 2 q and 8 j + 2 q + 1 of the fragment's row (64 ma + 16 w + g + 8 h).
    auto value = [&](int ma, int j, int h) {
      const float2 cb = *reinterpret_cast<const float2*>(coef_b + 8 * j + 2 * q);
      float lo = acc[ma][4 * j + 2 * h], hi = acc[ma][4 * j + 2 * h + 1];
      if constexpr (SAVED) {
        lo += cb.x;
        hi += cb.y;
      } else {
        const float2 ca = *reinterpret_cast<const float2*>(coef_a + 8 * j + 2 * q);
        lo = ca.x * lo + cb.x;
        hi = ca.y * hi + cb.y;
      }
      return Boxes::pair(lo, hi);
    };
    if constexpr (TMA_STORE && SAVED) {
      store_boxes_by_threads(p, static_cast<T*>(p.saved), staging, m0, n0, tid, value);
    } else if constexpr (TMA_STORE) {
      const int wg = tid / 128, wq = (tid % 128) / 32;
      Boxes::store(shared_addr(staging + (tid / 32) * Boxes::kWarpBytes), tid % 32,
                   m0 + wg * WG_M + 16 * wq, n0, ty, value);
    } else {
      T* out = static_cast<T*>(SAVED ? p.saved : p.y);
#pragma unroll
      for (int chunk = 0; chunk < kChunks; ++chunk)
        store_chunk(p, out, staging, chunk, m0, n0, tid, [&](int ma, int jj, int h) {
          return value(ma, chunk * (kChunkCols / 8) + jj, h);
        });
    }
  }

  // TMA_STORE's layout without TMA (for `saved`, which has no tensor map): each box is filled as
  // Boxes::store fills it, then the warp copies it to `out` in 16-byte stores, 4 lanes per
  // 64-byte row. Synchronous, so one box serves; both may still be read by y's TMA stores.
  template <class Value>
  __device__ __forceinline__ static void store_boxes_by_threads(const Params& p, T* out,
                                                                char* staging, int m0, int n0,
                                                                int tid, Value value) {
    const int warp = tid / 32, lane = tid % 32;
    const int wg = tid / 128, wq = (tid % 128) / 32;
    char* box_ptr = staging + warp * Boxes::kWarpBytes;
    const unsigned box = shared_addr(box_ptr);
    const int row0 = m0 + wg * WG_M + 16 * wq;
    const int m = rows_of<Spec>(p);
    constexpr int kUnits = kBoxRowBytes / 16;  // 16-byte units per box row
    if (lane == 0) bulk_wait_read<0>();
    __syncwarp();
#pragma unroll
    for (int ma = 0; ma < M_ATOMS; ++ma)
#pragma unroll
      for (int cc = 0; cc < BN / kBoxCols; ++cc) {
        Pair v[kBoxCols / 8][2];
#pragma unroll
        for (int jj = 0; jj < kBoxCols / 8; ++jj)
#pragma unroll
          for (int h = 0; h < 2; ++h) v[jj][h] = value(ma, cc * (kBoxCols / 8) + jj, h);
        Boxes::fill_box(box, lane, v);
        __syncwarp();
#pragma unroll
        for (int i = lane; i < kBoxRows * kUnits; i += 32) {
          const int r = i / kUnits, u = i % kUnits;
          const int grow = row0 + 64 * ma + r;
          const int gcol = n0 + cc * kBoxCols + u * kVec;
          if (grow < m && gcol < Spec::N) {
            const char* src = box_ptr + Boxes::unit_offset(r, u);
            T* dst = out + static_cast<long long>(grow) * Spec::LDY + gcol;
            if (gcol + kVec <= Spec::N) {
              *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
            } else {
              for (int e = 0; e < Spec::N - gcol; ++e) dst[e] = reinterpret_cast<const T*>(src)[e];
            }
          }
        }
        __syncwarp();  // every lane's reads of the box before the next fill
      }
  }

  // Column chunk `chunk` of the tile at (m0, n0) into `out` (y or saved): pair(ma, jj, h) gives
  // the fragment's value in 8-column block jj of the chunk (a float2, or two 16-bit values packed
  // in an unsigned); they go through this warpgroup's staging buffer into 16-byte stores.
  template <class Pair>
  __device__ __forceinline__ static void store_chunk(const Params& p, T* out, char* staging,
                                                     int chunk, int m0, int n0, int tid,
                                                     Pair pair) {
    const int wg = tid / 128, wtid = tid % 128;
    const int lane = tid % 32, wq = wtid / 32;
    const int g = lane / 4, q = lane % 4;
    char* stage = staging + wg * WG_M * kStageLd;
    const int row_base = m0 + wg * WG_M;
    // All of the chunk's values first, then all the shared stores: the compiler cannot tell
    // the staging buffer from the coefficients that pair() reads, so interleaving them makes
    // every coefficient load wait for the previous store (a 60-cycle chain per fragment).
    using V = decltype(pair(0, 0, 0));  // float2 or unsigned
    V v[kChunkCols / 8][M_ATOMS][2];
#pragma unroll
    for (int jj = 0; jj < kChunkCols / 8; ++jj)
#pragma unroll
      for (int ma = 0; ma < M_ATOMS; ++ma)
#pragma unroll
        for (int h = 0; h < 2; ++h) v[jj][ma][h] = pair(ma, jj, h);
    group_sync(wg);  // the previous chunk's reads of the staging buffer are done
#pragma unroll
    for (int jj = 0; jj < kChunkCols / 8; ++jj)
#pragma unroll
      for (int ma = 0; ma < M_ATOMS; ++ma)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 64 * ma + 16 * wq + g + 8 * h;
          char* dst = stage + r * kStageLd + (8 * jj + 2 * q) * static_cast<int>(sizeof(T));
          *reinterpret_cast<V*>(dst) = v[jj][ma][h];
        }
    group_sync(wg);
    const int col_base = n0 + chunk * kChunkCols;
    if constexpr (Spec::VEC_BYTES < 16) {
      // Rows only VEC_BYTES-aligned (KernelConfig::pad_operands): consecutive threads take
      // consecutive VEC_BYTES pieces of a row, so each store instruction of a warp covers one
      // contiguous span. A 16-byte unit per thread in narrower stores spreads every store
      // instruction over 512 bytes of partial sectors: 4097x4095x129 bf16 eval (ldy odd) took
      // 0.144 ms that way and 0.050 ms this way (H100, `fusejit bench`, two device calls).
      constexpr int kPiece = Spec::VEC_BYTES;
      constexpr int kPieceElems = kPiece / static_cast<int>(sizeof(T));
      constexpr int kPieces = 128 / kPiece;  // per staged row
      using Bits =
          typename Select<kPiece == 8, uint2,
                          typename Select<kPiece == 4, unsigned, unsigned short>::type>::type;
      const int m = rows_of<Spec>(p);
      for (int i = wtid; i < WG_M * kPieces; i += 128) {
        const int r = i / kPieces, u = i % kPieces;
        const int grow = row_base + r;
        const int gcol = col_base + u * kPieceElems;
        if (grow < m && gcol < Spec::N) {
          const char* src = stage + r * kStageLd + u * kPiece;
          T* dst = out + static_cast<long long>(grow) * Spec::LDY + gcol;
          if (gcol + kPieceElems <= Spec::N) {
            *reinterpret_cast<Bits*>(dst) = *reinterpret_cast<const Bits*>(src);
          } else {
            for (int e = 0; e < Spec::N - gcol; ++e) dst[e] = reinterpret_cast<const T*>(src)[e];
          }
        }
      }
    } else {
#pragma unroll
      for (int i = wtid; i < WG_M * 8; i += 128) {
        const int r = i / 8, u = i % 8;
        const int grow = row_base + r;
        const int gcol = col_base + u * kVec;
        if (grow < rows_of<Spec>(p) && gcol < Spec::N) {
          const char* src = stage + r * kStageLd + u * 16;
          T* dst = out + static_cast<long long>(grow) * Spec::LDY + gcol;
          if (gcol + kVec <= Spec::N) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
          } else {
            // Column tail: element by element straight from shared memory (a register copy
            // indexed at run time would live in local memory).
            for (int e = 0; e < Spec::N - gcol; ++e) dst[e] = reinterpret_cast<const T*>(src)[e];
          }
        }
      }
    }
  }
};

}  // namespace fj
