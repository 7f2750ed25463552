// Train statistics from x, before the GEMM (KernelConfig::input_stats, issue 16's third item).
// The column statistics of a = x W^T follow from x's mean and centred covariance S (K x K):
//   mean_a = W xbar,   var_a[n] = w_n^T S w_n.
// Reducing S reads x once and costs M K^2 products, against recompute's first GEMM pass, which
// multiplies all of x W^T again and reduces M x N accumulators; so when K is small against N the
// statistics cost a fraction of that pass, and the affine GEMM after them is the only pass over
// y. The reference beside it: bench/stats_before_gemm_study.py (numpy), and the float64 checks of
// tests/gpu/input_stats_test.cpp.
//
// One cooperative kernel, four phases split by grid barriers, and the run's only pass before
// the affine GEMM (a programmatic dependent launch of this kernel):
//  1. Every CTA takes a shift from x's first kInputStatsTileRows rows (their column means; for
//     16-bit x rounded to x's type, or 0 where the mean is within eight standard deviations),
//     the same bits in every CTA. Then each warp takes 16-row slabs of d = x - shift in turn,
//     its mma fragments straight from its own loads: where every d of the slab is a value of x's
//     16-bit type, one exact product per tile of d^T d; otherwise each d split into three bf16
//     parts (hi + mid + lo keeps d's 24 bits) and six of the nine part products (the three left
//     out are below 2^-24 of |d|^2). Only the tiles on and above the diagonal; the sums run over
//     all of the warp's slabs in its accumulators (no per-slab reduction or merge: the shift
//     already took the large column means out), then over the CTA's warps in warp order.
//  2. The CTAs' sums added in a fixed order (deterministic, no float atomics).
//  3. Per column n: dbar = sum d / M, xbar = shift + dbar, S = sum d d^T / M - dbar dbar^T;
//     mean_a = w_n . xbar, var_a = w_n^T S w_n, and how much of the quadratic form cancels,
//     sum |w_j| (|sum d d^T / M| + |dbar dbar^T|)_jk |w_k| / var_a: the terms S's rounding is
//     relative to, so both the form's cancellation and the shift's subtraction count. fp32
//     leaves var_a a relative error of about 2^-24 times that factor
//     (bench/stats_before_gemm_study.py), which no plan-time rule can bound (it depends on the
//     data: correlated features and a weight row that takes their difference). A trusted column
//     is recorded here (running and saved stats, the affine GEMM's coefficients: what
//     fj_finalize does for the other schedules); above the dtype's limit it is flagged.
//  4. Only when a column was flagged: those columns' statistics from a itself, a = x w_n on the
//     CUDA cores, summed around mean_a and added over the CTAs in a fixed order. This costs M K
//     products per flagged column, but it keeps the fallback inside this kernel: the runs whose
//     columns are all trusted (all but adversarial data) launch nothing else before the affine
//     GEMM. (A fallback through recompute's statistics GEMM and fj_finalize, which this kernel
//     had first, kept those two launches in every run: 3.0 + 4.0 us under ncu at 65536x256x64
//     bf16 though both returned at once; without them that run went from 0.0359 to 0.0336 ms,
//     H200.)
#pragma once
#include "common/grid_barrier.cuh"
#include "common/grid_dependency.cuh"
#include "common/input_stats.h"
#include "common/math_kind.cuh"
#include "common/mma.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/types.cuh"
#include "epilogue/bn_math.cuh"

namespace fj {

// The largest cancellation factor a column's var_a is trusted with. At 2^-24 per unit of factor
// (bench/stats_before_gemm_study.py, one rounding, M = 8192), 1024 leaves var_a within ~6e-5
// and invstd within ~3e-5: under a sixtieth of tf32's 2e-3 tolerance. 16-bit types get 16384
// (var_a within ~1e-3, y within ~5e-4: under a quarter of bf16's own rounding of y, a twentieth
// of the sweep's 1e-2), which the unshifted sums of columns whose mean is up to eight standard
// deviations need: their factor counts the mean's square in every entry of the bound, times
// ~0.7 K for a dense weight row of mixed signs (~6,000 at eight deviations and K = 64). Strict
// fp32 and 3xTF32 are held to 2e-5, so they get 128 (~4e-6 on invstd). This kernel rounds more
// often than that model (sums over a warp's slabs, its CTA and the CTAs), so these margins are
// estimates, checked by the tests up to 40000 rows.
template <class Spec>
__device__ __forceinline__ constexpr float input_stats_cancellation_limit() {
  if constexpr (Spec::MATH == kMathSimtFp32 || Spec::MATH == kMathTf32x3)
    return 128.f;
  else if constexpr (Spec::MATH == kMathTf32)
    return 1024.f;
  else
    return 16384.f;
}

// Gemm: the affine GEMM the statistics feed (its kTf32Rounding).
template <class Spec, class Gemm>
struct InputStats {
  using T = typename Spec::T;
  static constexpr int K = Spec::K;
  static constexpr int KP = input_stats_kp(K);
  static constexpr int R = kInputStatsTileRows;
  static constexpr int kThreads = kInputStatsThreads;
  static constexpr int kWarps = kInputStatsWarps;
  // Column blocks of 16: a warp's mma A fragment of block b over a 16-row slab of d holds d's
  // columns 16 b + g and 16 b + 8 + g (g = lane / 4) in rows 2 q, 2 q + 1, 2 q + 8 and 2 q + 9
  // (q = lane % 4), and so does the B fragment of the same columns (mma_16x8: A row-major, B
  // column-major, and here A = d^T, B = d).
  static constexpr int kBlocks = KP / 16;
  // d^T d is symmetric: only its 16x16 tiles on and above the diagonal are multiplied (10 of 16
  // at KP = 64), and the partials mirror the others.
  static constexpr int kOutTiles = kBlocks * (kBlocks + 1) / 2;
  // A lane's elements of a slab: 4 rows x 2 columns per block.
  static constexpr int kElems = 8 * kBlocks;
  // The first tile's loads (the shift): thread t takes column t % KP, rows t / KP + i * kColGroups.
  static constexpr int kColGroups = kThreads / KP;
  static constexpr int kLoads = R * KP / kThreads;
  // 16-bit x: d = x - shift is most often a value of x's own type (the shift 0, or a value of
  // that type near the column's values), and then one product of d in that type replaces the six
  // of its three bf16 parts. Per slab and warp: one element that is not exact sends the slab
  // down the three-part path.
  static constexpr bool kExactPath = sizeof(T) == 2;
  static constexpr int kExactMath = Spec::MATH == kMathFp16 ? kMathFp16 : kMathBf16;
  // A warp's sums as it leaves them in shared memory: its accumulators register by register
  // ([tile][half][register][lane]), then its column sums ([block][side][g], which is column
  // order). A CTA's partial and the merged sums keep this order (input_stats_sums): no index
  // arithmetic between the warps' registers and the partial (writing each entry at its place
  // in S, and its mirror, took a fifth of this kernel's samples at 65536x256x64 bf16), and only
  // the upper tiles to add in phase 2; phase 3 finds S's entries with entry_index.
  static constexpr int kWarpAcc = kOutTiles * 2 * 4 * 32;
  static constexpr int kWarpSums = kWarpAcc + 2 * kBlocks * 8;
  static constexpr int kSumsPerThread = (kWarpSums + kThreads - 1) / kThreads;
  static_assert(kWarpSums == input_stats_sums(KP), "input_stats: the partial's layout");
  // The CTAs each warp adds in phase 2, and its chunks of 32 entries.
  static constexpr int kSums = kWarpSums;
  static constexpr int kChunks = (kSums + 31) / 32;
  static constexpr int kCtasPerWarp = (kInputStatsMaxCtas + kWarps - 1) / kWarps;
  static_assert(K <= kInputStatsMaxK, "input_stats: K above kInputStatsMaxK");
  static_assert(kThreads % KP == 0 && (R * KP) % kThreads == 0,
                "input_stats: the block must tile the first tile's rows and columns");
  // Phase 4: chunks of kFbRows rows of x in shared memory, a thread per row and column group,
  // each group kFbPerThread of the round's kInputStatsFallbackCols columns.
  static constexpr int kFbRows = 64;
  static constexpr int kFbGroups = kThreads / kFbRows;
  static constexpr int kFbPerThread = kInputStatsFallbackCols / kFbGroups;
  static constexpr int kFbWarpsPerGroup = kFbRows / 32;
  static_assert(kThreads % kFbRows == 0 && kInputStatsFallbackCols % kFbGroups == 0 &&
                    2 * kInputStatsFallbackCols <= kThreads,
                "input_stats: the fallback's rows and columns must tile the block");

  struct SharedStorage {
    union {
      float warp_sums[kWarps / 2][kWarpSums];  // phase 1's end: half of the warps' sums
      struct {
        float s[KP * KP];      // S
        float bound[KP * KP];  // |R / M| + |dbar dbar^T|: what S's rounding is relative to
        float2 col[kThreads];  // a batch of the CTA's columns: (mean_a, var_a)
        int trusted[kThreads];
        float w[kWarps][KP];  // each warp's column's row of W
      } q;                    // phase 3
      struct {
        // x's rows and the round's W rows, a word of padding per row: the threads of a warp
        // read consecutive rows' same element, in distinct banks.
        float x[kFbRows][KP + 1];
        float w[kInputStatsFallbackCols][KP + 1];
        float shift[kInputStatsFallbackCols];
        float red[kWarps][kFbPerThread][2];
      } fb;  // phase 4
    } u;
    float shift[KP];
    float part[kColGroups][KP];
    float part2[kColGroups][KP];
    float dbar[KP];
    float xbar[KP];
    float chunk[kWarps][32];
    unsigned slabs[kWarps][2];  // exact, three-part: counted for the tests (InputStatsLayout)
  };

  using Acc = float[kOutTiles][2][4];
  // d's three bf16 parts as mma fragments: [part][block][register].
  using Frags = unsigned[3][kBlocks][4];

  // f(u, tj, tk) for each upper 16x16 tile (tj <= tk), u numbering them row-major. Nested
  // unrolled loops, so that every index folds (a loop to find (tj, tk) from u left the fragments
  // indexed at run time: in local memory).
  template <class F>
  __device__ __forceinline__ static void for_each_upper(F&& f) {
#pragma unroll
    for (int tj = 0; tj < kBlocks; ++tj)
#pragma unroll
      for (int tk = tj; tk < kBlocks; ++tk) f(tj * kBlocks - tj * (tj - 1) / 2 + tk - tj, tj, tk);
  }

  // Element e of a lane's share of a slab: register r = e / 2 of block b = e / 8 (a0..a3 as
  // above), and its lower (e even: rows 2 q or 2 q + 8) or upper half.
  __device__ static int elem_row(int e) {
    const int q = threadIdx.x % 4;
    return 2 * q + ((e / 2) % 4 >= 2 ? 8 : 0) + (e % 2);
  }
  __device__ static int elem_col(int e) {
    const int g = (threadIdx.x % 32) / 4;
    return 16 * (e / 8) + ((e / 2) % 2) * 8 + g;
  }

  // Where S's entry (j, k) is among the sums (kWarpSums' order): in its upper tile, as lane
  // (j % 8) * 4 + (k % 8) / 2 of the mma accumulators holds it (register 2 (j % 16 / 8) + k % 2
  // of half k % 16 / 8). An entry below the diagonal tiles is its mirror's; a diagonal tile
  // holds both of its entries itself (they may differ in their last bit: the part products
  // add in another order).
  __device__ static int entry_index(int j, int k) {
    if (j / 16 > k / 16) {
      const int swap = j;
      j = k;
      k = swap;
    }
    const int tj = j / 16, tk = k / 16, jj = j % 16, kk = k % 16;
    const int u = tj * kBlocks - tj * (tj - 1) / 2 + tk - tj;
    const int lane = (jj % 8) * 4 + (kk % 8) / 2, reg = 2 * (jj / 8) + kk % 2, half = kk / 8;
    return ((u * 2 + half) * 4 + reg) * 32 + lane;
  }

  // An element of x or W as the affine GEMM multiplies it: in tf32 rounded as that kernel's
  // products take it (Gemm::kTf32Rounding), so that the statistics are those of the a it
  // normalizes. Taken at full fp32 precision, they missed it where tf32's rounding is large
  // against a column's spread: x ~ 1000 + N(0, 1), whose tf32 steps are 0.5, shifted y by 17%
  // (input_stats_test, H200). tf32 products of these values are exact in fp32, as 16-bit ones
  // are.
  __device__ static float operand(T v) {
    if constexpr (Spec::MATH == kMathTf32)
      return tf32_operand_value<Gemm::kTf32Rounding>(to_float(v));
    else
      return to_float(v);
  }

  // Issues the loads of this lane's elements of the slab at `row0` into `raw`, from clamped
  // addresses (every load goes out; loads under a condition went out one at a time: ncu, 87 us
  // at 65536x256x64 bf16 in this kernel's first build).
  __device__ static void load_slab(const T* x, int m, int row0, T (&raw)[kElems]) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      const int r = min(row0 + elem_row(e), m - 1), c = min(elem_col(e), K - 1);
      raw[e] = x[static_cast<long long>(r) * Spec::LDX + c];
    }
  }

  // d of the slab's element pair (e, e + 1): x - shift, zero past the rows and past K (exact
  // where x and the shift are within 2^16 of each other in magnitude, one rounding otherwise).
  __device__ static void pair_d(const T (&raw)[kElems], const float (&shift)[kBlocks][2], int m,
                                int row0, int e, float& d0, float& d1) {
    const int b = e / 8, side = (e / 2) % 2;
    const bool col_ok = elem_col(e) < K;
    d0 = col_ok && row0 + elem_row(e) < m ? operand(raw[e]) - shift[b][side] : 0.f;
    d1 = col_ok && row0 + elem_row(e + 1) < m ? operand(raw[e + 1]) - shift[b][side] : 0.f;
  }

  // The pair (lo, hi) rounded to P and packed as an mma register (pack2), and what the rounding
  // left of each.
  template <class P>
  __device__ static unsigned split_pair(float& lo, float& hi) {
    const unsigned b = pack2<P>(lo, hi);
    const float2 v = unpack2<P>(b);
    lo -= v.x;
    hi -= v.y;
    return b;
  }

  // The pair (d0, d1) in x's own 16-bit type as one mma register; `exact` stays true while every
  // such pair came back unchanged.
  __device__ static unsigned pack_exact(float d0, float d1, bool& exact) {
    const unsigned b = pack2<T>(d0, d1);
    const float2 back = unpack2<T>(b);
    exact = exact && back.x == d0 && back.y == d1;
    return b;
  }

  // The slab's d as single fragments of x's type (kExactPath), and its column sums into `dsum`;
  // returns whether every element of this lane was exact.
  __device__ static bool exact_fragments(const T (&raw)[kElems], const float (&shift)[kBlocks][2],
                                         int m, int row0, unsigned (&f)[kBlocks][4],
                                         float (&dsum)[kBlocks][2]) {
    bool exact = true;
#pragma unroll
    for (int e = 0; e < kElems; e += 2) {
      float d0, d1;
      pair_d(raw, shift, m, row0, e, d0, d1);
      const int b = e / 8, side = (e / 2) % 2;
      dsum[b][side] += d0;
      dsum[b][side] += d1;
      f[b][(e / 2) % 4] = pack_exact(d0, d1, exact);
    }
    return exact;
  }

  // The slab's d as three bf16 parts (hi + mid + lo keeps d's 24 bits); with `dsum`, its column
  // sums too (the exact path took them already otherwise).
  __device__ static void split_fragments(const T (&raw)[kElems], const float (&shift)[kBlocks][2],
                                         int m, int row0, Frags& f, float (&dsum)[kBlocks][2],
                                         bool sums) {
#pragma unroll
    for (int e = 0; e < kElems; e += 2) {
      float d0, d1;
      pair_d(raw, shift, m, row0, e, d0, d1);
      const int b = e / 8, side = (e / 2) % 2, reg = (e / 2) % 4;
      if (sums) {
        dsum[b][side] += d0;
        dsum[b][side] += d1;
      }
      f[0][b][reg] = split_pair<bf16_t>(d0, d1);
      f[1][b][reg] = split_pair<bf16_t>(d0, d1);
      f[2][b][reg] = split_pair<bf16_t>(d0, d1);
    }
  }

  // The slab's d^T d added to `acc` from single fragments of x's type: one product per upper tile
  // and half, exact.
  __device__ static void exact_products(const unsigned (&f)[kBlocks][4], Acc& acc) {
    for_each_upper([&](int u, int tj, int tk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned bb[2] = {f[tk][h], f[tk][h + 2]};
        mma_16x8<kExactMath>(acc[u][h], f[tj], bb);
      }
    });
  }

  // The slab's d^T d added to `acc`: per upper tile and half, six of the nine part products,
  // small ones first (hi*lo, lo*hi, mid*mid, hi*mid, mid*hi, hi*hi; the three left out are below
  // 2^-24 of |d|^2).
  __device__ static void slab_products(const Frags& f, Acc& acc) {
    constexpr int kPairs[6][2] = {{0, 2}, {2, 0}, {1, 1}, {0, 1}, {1, 0}, {0, 0}};
#pragma unroll
    for (int pr = 0; pr < 6; ++pr)
      for_each_upper([&](int u, int tj, int tk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned bb[2] = {f[kPairs[pr][1]][tk][h], f[kPairs[pr][1]][tk][h + 2]};
          mma_16x8<kMathBf16>(acc[u][h], f[kPairs[pr][0]][tj], bb);
        }
      });
  }

  // A butterfly over the warp: every lane ends with the same bits (each level adds the same
  // two values, in either order).
  __device__ static float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }

  // The shift, from x's first R rows, which every CTA computes from the same loads in the same
  // order, so that all of them subtract the same bits: the column's mean there, which takes a
  // large column mean out of the sums (it would cancel when S subtracts dbar dbar^T). For 16-bit
  // x, the mean rounded to x's type, and 0 where the mean is within eight standard deviations of
  // it (little to cancel): d then stays a value of x's type (kExactPath).
  __device__ static void first_tile_shift(SharedStorage& sh, const T* x, int m) {
    const int t = threadIdx.x, col = t % KP, grp = t / KP;
    const int valid = min(R, m);
    T first[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int r = min(grp + i * kColGroups, m - 1);
      first[i] = x[static_cast<long long>(r) * Spec::LDX + min(col, K - 1)];
    }
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
      if (grp + i * kColGroups < valid && col < K) {
        const float v = operand(first[i]);
        s1 += v;
        s2 += v * v;
      }
    sh.part[grp][col] = s1;
    sh.part2[grp][col] = s2;
    __syncthreads();
    if (t < KP) {
      float c1 = sh.part[0][t], c2 = sh.part2[0][t];
      for (int g = 1; g < kColGroups; ++g) c1 += sh.part[g][t], c2 += sh.part2[g][t];
      const float n = static_cast<float>(valid);
      float shift = c1 / n;
      if constexpr (kExactPath) {
        // A rough variance: it only decides whether to shift. Unshifted, a column whose mean is
        // within eight standard deviations stays under the 16-bit cancellation limit (above).
        // A lower bar shifted columns of U[0, 1) data (mean 1.7 deviations), whose small values
        // then lost their low bits (d = x - 0.5 needs 17 at x = 0.001) and sent every slab down
        // the three-part path.
        const float var = fmaxf(c2 / n - shift * shift, 0.f);
        shift = shift * shift > 64.f * var ? to_float(from_float<T>(shift)) : 0.f;
      }
      sh.shift[t] = shift;
    }
    __syncthreads();
  }

  // Element t of W's row n as the GEMM multiplies it (0 past K).
  __device__ static float w_row(const Params& p, int n, int t) {
    const T* wt = static_cast<const T*>(p.w);
    return t < K ? operand(wt[static_cast<long long>(n) * Spec::LDW + t]) : 0.f;
  }

  // Phase 3's warp per column: lane l holds W's elements l, l + 32, ... of the column's row.
  static constexpr int kWSlots = (KP + 31) / 32;
  __device__ static void load_w_slots(const Params& p, int n, float (&wv)[kWSlots]) {
#pragma unroll
    for (int i = 0; i < kWSlots; ++i) wv[i] = w_row(p, n, threadIdx.x % 32 + 32 * i);
  }

  // Column n's mean_a = w . xbar, var_a = w^T S w and the bound of its rounding, |w|^T bound
  // |w|, by one warp: lane l takes S's columns l, l + 32, ... (consecutive words: no bank
  // conflict), each summed over S's rows in order; then the lanes by a butterfly.
  __device__ static void column_form(SharedStorage& sh, const float (&wv)[kWSlots], float& mean,
                                     float& var, float& bound) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float* w = sh.u.q.w[warp];
#pragma unroll
    for (int i = 0; i < kWSlots; ++i)
      if (lane + 32 * i < KP) w[lane + 32 * i] = wv[i];
    __syncwarp();
    mean = var = bound = 0.f;
#pragma unroll
    for (int i = 0; i < kWSlots; ++i) {
      const int k = lane + 32 * i;
      if (k >= KP) continue;
      float u = 0.f, ub = 0.f;
#pragma unroll 8
      for (int j = 0; j < KP; ++j) {
        u = fmaf(w[j], sh.u.q.s[j * KP + k], u);
        ub = fmaf(fabsf(w[j]), sh.u.q.bound[j * KP + k], ub);
      }
      mean = fmaf(wv[i], sh.xbar[k], mean);
      var = fmaf(wv[i], u, var);
      bound = fmaf(fabsf(wv[i]), ub, bound);
    }
    mean = warp_sum(mean);
    var = warp_sum(var);
    bound = warp_sum(bound);
    __syncwarp();  // w is read before the warp's next column overwrites it
  }

  __device__ static void run(const Params& p) {
    __shared__ SharedStorage sh;
    constexpr InputStatsLayout L = input_stats_layout(Spec::N, KP);
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int m = rows_of<Spec>(p);
    const int ctas = static_cast<int>(gridDim.x);
    float* ws = p.ws_xstats;
    const T* x = static_cast<const T*>(p.x);
    // The affine GEMM after this kernel waits for all of it before its epilogues (and reads
    // nothing this kernel writes before them): let it launch now, so that its CTAs take the SMs
    // as this grid's leave them.
    allow_dependent_launch();

    // Centred on the shift, the sums below hold no large column mean, and dbar, the rest of the
    // mean, is about the first tile's sampling error (~1/8 of the spread) or, unshifted, at most
    // eight standard deviations.
    const int slabs = (m + 15) / 16;
    const int warps = ctas * kWarps;
    T raw[kElems];
    int slab = static_cast<int>(blockIdx.x) * kWarps + warp;
    if (slab < slabs) load_slab(x, m, slab * 16, raw);  // in flight while the shift is found
    first_tile_shift(sh, x, m);
    float shift[kBlocks][2];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
#pragma unroll
      for (int side = 0; side < 2; ++side) shift[b][side] = sh.shift[elem_col(8 * b + 2 * side)];

    // Phase 1: each warp takes 16-row slabs in turn, its fragments straight from its loads (no
    // shared memory, no block barrier); d^T d in the tensor cores' accumulators and the column
    // sums of d in registers, over all of the warp's slabs. (Centring each 64-row tile on its
    // own mean with the block, as this kernel first did, cost 32 us at 65536x256x64 bf16: two
    // block barriers, a Chan merge of every accumulator and a split through shared memory per
    // tile.)
    Acc acc;
#pragma unroll
    for (int u = 0; u < kOutTiles; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[u][h][i] = 0.f;
    float dsum[kBlocks][2];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) dsum[b][0] = dsum[b][1] = 0.f;
    unsigned exact_slabs = 0, split_slabs = 0;
    for (; slab < slabs; slab += warps) {
      const int row0 = slab * 16, next = slab + warps;
      bool exact = false;
      unsigned one[kBlocks][4];
      if constexpr (kExactPath)
        exact = __all_sync(0xffffffffu, exact_fragments(raw, shift, m, row0, one, dsum));
      if (exact) {
        ++exact_slabs;
        if (next < slabs) load_slab(x, m, next * 16, raw);
        exact_products(one, acc);
      } else {
        ++split_slabs;
        Frags f;
        split_fragments(raw, shift, m, row0, f, dsum, !kExactPath);
        if (next < slabs) load_slab(x, m, next * 16, raw);
        slab_products(f, acc);
      }
    }
    // The four lanes of a column (same g) hold its sums over their rows: a butterfly over q.
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
#pragma unroll
      for (int side = 0; side < 2; ++side) {
        float v = dsum[b][side];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        dsum[b][side] = v;
      }
    if (lane == 0) sh.slabs[warp][0] = exact_slabs, sh.slabs[warp][1] = split_slabs;
    // The CTA's sums: the warps' leave theirs in shared memory, half of them at a time, and
    // each thread adds its entries over the warps in warp order.
    float total[kSumsPerThread];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (warp / (kWarps / 2) == half) {
        float* mine = sh.u.warp_sums[warp % (kWarps / 2)];
        for_each_upper([&](int u, int, int) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) mine[((u * 2 + h) * 4 + i) * 32 + lane] = acc[u][h][i];
        });
        if (lane % 4 == 0) {
#pragma unroll
          for (int b = 0; b < kBlocks; ++b)
#pragma unroll
            for (int side = 0; side < 2; ++side)
              mine[kWarpAcc + (b * 2 + side) * 8 + lane / 4] = dsum[b][side];
        }
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kSumsPerThread; ++i) {
        const int f = t + i * kThreads;
        if (f >= kWarpSums) break;
#pragma unroll
        for (int w = 0; w < kWarps / 2; ++w) {
          const float v = sh.u.warp_sums[w][f];
          total[i] = half == 0 && w == 0 ? v : total[i] + v;
        }
      }
      __syncthreads();
    }
    // Into the CTA's partial, in the warps' order (kWarpSums).
    float* partial = ws + L.partials + static_cast<long long>(blockIdx.x) * L.partial_stride;
#pragma unroll
    for (int i = 0; i < kSumsPerThread; ++i) {
      const int f = t + i * kThreads;
      if (f >= kWarpSums) break;
      partial[f] = total[i];
    }
    // Phase 3 raises the flag, counts the slabs and lists the flagged columns; the counts are
    // cleared here, before the barriers that order the two.
    if (blockIdx.x == 0 && t == 0) {
      unsigned* words = reinterpret_cast<unsigned*>(ws);
      words[L.flag] = words[L.flagged] = 0u;
      words[L.exact_slabs] = words[L.split_slabs] = 0u;
    }
    __syncthreads();
    if (t == 0) grid_barrier_arrive_and_wait();
    __syncthreads();

    // Phase 2: the CTAs' sums added, 32 consecutive entries per block at a time (coalesced):
    // warp w adds CTAs w, w + 8, ... (all loads at once, from clamped addresses), then the
    // warps' totals add in warp order.
    for (int ch = blockIdx.x; ch < kChunks; ch += ctas) {
      const int e = ch * 32 + lane;
      const int ec = e < kSums ? e : kSums - 1;
      float v[kCtasPerWarp];
#pragma unroll
      for (int u = 0; u < kCtasPerWarp; ++u) {
        const int g = min(warp + u * kWarps, ctas - 1);
        v[u] = ws[L.partials + static_cast<long long>(g) * L.partial_stride + ec];
      }
      float s = 0.f;
#pragma unroll
      for (int u = 0; u < kCtasPerWarp; ++u)
        if (warp + u * kWarps < ctas) s += v[u];
      sh.chunk[warp][lane] = s;
      __syncthreads();
      if (warp == 0 && e < kSums) {
        float total = sh.chunk[0][lane];
        for (int w = 1; w < kWarps; ++w) total += sh.chunk[w][lane];
        ws[L.merged + e] = total;
      }
      __syncthreads();
    }
    __syncthreads();
    if (t == 0) grid_barrier_arrive_and_wait();
    __syncthreads();

    // Phase 3: columns blockIdx.x, + ctas, ..., a warp each, in batches of one per thread (which
    // records it). Every CTA derives xbar, S and its bound from the sums the same way: dbar =
    // sum d / M, S = sum d d^T / M - dbar dbar^T. (One column at a time by the whole block, as
    // this phase first ran, waited for each column's row of W and three block barriers per
    // column: with eight columns a CTA, at 16384x1024x64 bf16, the run was 5.4 us behind
    // recompute's, where at 65536x256x64's two it was 1.3 us ahead.)
    if (t == 0) {
      unsigned exact = 0, split = 0;
      for (int w = 0; w < kWarps; ++w) exact += sh.slabs[w][0], split += sh.slabs[w][1];
      atomicAdd(reinterpret_cast<unsigned*>(ws) + L.exact_slabs, exact);
      atomicAdd(reinterpret_cast<unsigned*>(ws) + L.split_slabs, split);
    }
    const float inv_rows = 1.f / static_cast<float>(m);
    const float factor = momentum_factor<Spec>(p);
    static_assert((KP * KP) % kThreads == 0, "input_stats: S in whole rounds");
    constexpr int kPerThread = KP * KP / kThreads;
    // All of this thread's loads go out before the barrier: S's entries, and the row of W of
    // the warp's first column.
    float r[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = t + i * kThreads;
      r[i] = ws[L.merged + entry_index(e / KP, e % KP)] * inv_rows;
    }
    const int first_n = static_cast<int>(blockIdx.x) + warp * ctas;
    float wv[kWSlots];
    if (first_n < Spec::N) load_w_slots(p, first_n, wv);
    if (t < KP) {
      const float db = ws[L.merged + kWarpAcc + t] * inv_rows;
      sh.dbar[t] = db;
      sh.xbar[t] = sh.shift[t] + db;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = t + i * kThreads;
      const float dd = sh.dbar[e / KP] * sh.dbar[e % KP];
      sh.u.q.s[e] = r[i] - dd;
      sh.u.q.bound[e] = fabsf(r[i]) + fabsf(dd);
    }
    __syncthreads();
    float2* columns = reinterpret_cast<float2*>(ws + L.columns);
    for (int base = blockIdx.x; base < Spec::N; base += kThreads * ctas) {
      // Thread i records the batch's column i: its parameters' loads in flight meanwhile.
      const int mine = base + t * ctas;
      const ColumnParams cp = mine < Spec::N ? column_params<Spec>(p, mine) : ColumnParams{};
      const int count = min(kThreads, (Spec::N - base + ctas - 1) / ctas);
      for (int i = warp; i < count; i += kWarps) {
        const int n = base + i * ctas;
        if (n != first_n) load_w_slots(p, n, wv);
        float mean, var, bound;
        column_form(sh, wv, mean, var, bound);
        // Also false for a negative or NaN var. A constant column gives 0 <= 0 where the shift
        // is its value (16-bit x); an fp32 column's shift, a mean of 64 equal values, can miss
        // it by a rounding, and the column then takes the fallback.
        if (lane == 0) {
          sh.u.q.col[i] = make_float2(mean, var);
          sh.u.q.trusted[i] = bound <= input_stats_cancellation_limit<Spec>() * var;
        }
      }
      __syncthreads();
      if (mine < Spec::N) {
        const float2 mv = sh.u.q.col[t];
        columns[mine] = mv;  // a flagged column's mean_a: phase 4's shift
        if (sh.u.q.trusted[t]) {
          record(p, cp, mine, mv.x, mv.y, factor);
        } else {
          unsigned* words = reinterpret_cast<unsigned*>(ws);
          const unsigned slot = atomicAdd(words + L.flagged, 1u);
          reinterpret_cast<int*>(ws + L.flagged_columns)[slot] = mine;
          atomicOr(words + L.flag, 1u);
        }
      }
      __syncthreads();  // the batch's results are read before the next batch writes its own
    }
    __syncthreads();
    if (t == 0) grid_barrier_arrive_and_wait();
    __syncthreads();
    // A plain load: the barrier's acquire ordered it after every CTA's count (a volatile one,
    // a system-scope load, drew 7% of this kernel's samples at 65536x256x64 bf16).
    const int flagged = static_cast<int>(reinterpret_cast<const unsigned*>(ws)[L.flagged]);
    if (flagged > 0) fallback(p, sh, m, flagged, factor);
  }

  // The column's batch statistics recorded (running and saved stats) and folded into the
  // affine GEMM's coefficients, as fj_finalize writes them for the other schedules.
  __device__ static void record(const Params& p, const ColumnParams& cp, int n, float mean_a,
                                float var_a, float factor) {
    const Affine f = train_column_of<Spec>(p, cp, n, mean_a, var_a, factor, true,
                                           static_cast<float>(rows_of<Spec>(p)));
    store_column_coefficients(p, n, f, mean_a);
  }

  // Phase 4: the flagged columns' statistics from a = x w_n itself, in fp32 on the CUDA cores
  // (the products of 16-bit and tf32 operands exact; strict fp32's and 3xTF32's rounded once
  // each, as phase 1's three parts keep them), as sums of a - mean_a (phase 3's W xbar, which a
  // cancelling quadratic form does not disturb: the shift only keeps the squares small), a thread's
  // rows in order, then its warp by a butterfly, its group's warps and the CTAs in order. Rounds of
  // kInputStatsFallbackCols columns: each CTA adds its 64-row chunks of x for the round's
  // columns into its partial, a grid barrier, and each of the round's columns merged and
  // recorded by one CTA.
  __device__ static void fallback(const Params& p, SharedStorage& sh, int m, int flagged,
                                  float factor) {
    constexpr InputStatsLayout L = input_stats_layout(Spec::N, KP);
    constexpr int kCols = kInputStatsFallbackCols;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int row = t % kFbRows, grp = t / kFbRows;
    const int ctas = static_cast<int>(gridDim.x);
    float* ws = p.ws_xstats;
    const int* list = reinterpret_cast<const int*>(ws + L.flagged_columns);
    const float2* columns = reinterpret_cast<const float2*>(ws + L.columns);
    const T* x = static_cast<const T*>(p.x);
    for (int c0 = 0; c0 < flagged; c0 += kCols) {
      const int nc = min(kCols, flagged - c0);
      __syncthreads();  // the previous round's shared memory, or phase 3's, is read
      for (int e = t; e < kCols * KP; e += kThreads) {
        const int j = e / KP, k = e % KP;
        sh.u.fb.w[j][k] = j < nc ? w_row(p, list[c0 + j], k) : 0.f;
      }
      if (t < kCols) sh.u.fb.shift[t] = t < nc ? columns[list[c0 + t]].x : 0.f;
      float s1[kFbPerThread], s2[kFbPerThread];
#pragma unroll
      for (int j = 0; j < kFbPerThread; ++j) s1[j] = s2[j] = 0.f;
      for (int chunk = blockIdx.x; chunk * kFbRows < m; chunk += ctas) {
        __syncthreads();  // the round's W rows are in; the previous chunk's rows are read
        for (int e = t; e < kFbRows * KP; e += kThreads) {
          const int rr = e / KP, k = e % KP, xr = chunk * kFbRows + rr;
          sh.u.fb.x[rr][k] =
              xr < m && k < K ? operand(x[static_cast<long long>(xr) * Spec::LDX + k]) : 0.f;
        }
        __syncthreads();
        if (chunk * kFbRows + row >= m) continue;
        float xv[KP];
#pragma unroll
        for (int k = 0; k < KP; ++k) xv[k] = sh.u.fb.x[row][k];
#pragma unroll
        for (int j = 0; j < kFbPerThread; ++j) {
          const int c = grp * kFbPerThread + j;
          float a = 0.f;
#pragma unroll
          for (int k = 0; k < KP; ++k) a = fmaf(xv[k], sh.u.fb.w[c][k], a);
          const float d = a - sh.u.fb.shift[c];
          s1[j] += d;
          s2[j] = fmaf(d, d, s2[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kFbPerThread; ++j) {
        s1[j] = warp_sum(s1[j]);
        s2[j] = warp_sum(s2[j]);
      }
      if (lane == 0)
#pragma unroll
        for (int j = 0; j < kFbPerThread; ++j)
          sh.u.fb.red[warp][j][0] = s1[j], sh.u.fb.red[warp][j][1] = s2[j];
      __syncthreads();
      if (t < 2 * kCols) {
        const int c = t / 2, g = c / kFbPerThread, j = c % kFbPerThread;
        float v = sh.u.fb.red[g * kFbWarpsPerGroup][j][t % 2];
        for (int w = 1; w < kFbWarpsPerGroup; ++w)
          v += sh.u.fb.red[g * kFbWarpsPerGroup + w][j][t % 2];
        ws[L.fallback + static_cast<long long>(blockIdx.x) * 2 * kCols + t] = v;
      }
      __syncthreads();
      if (t == 0) grid_barrier_arrive_and_wait();
      __syncthreads();
      if (warp == 0)
        for (int j = blockIdx.x; j < nc; j += ctas) {
          float v1 = 0.f, v2 = 0.f;
          for (int g = lane; g < ctas; g += 32) {
            v1 += ws[L.fallback + static_cast<long long>(g) * 2 * kCols + 2 * j];
            v2 += ws[L.fallback + static_cast<long long>(g) * 2 * kCols + 2 * j + 1];
          }
          v1 = warp_sum(v1);
          v2 = warp_sum(v2);
          if (lane == 0) {
            const int n = list[c0 + j];
            const float db = v1 / static_cast<float>(m);
            const float mean = sh.u.fb.shift[j] + db;
            const float var = fmaxf(v2 / static_cast<float>(m) - db * db, 0.f);
            reinterpret_cast<float2*>(ws + L.columns)[n] = make_float2(mean, var);
            record(p, column_params<Spec>(p, n), n, mean, var, factor);
          }
        }
      // The next round writes the partials again once every CTA has read this round's.
      if (c0 + kCols < flagged) {
        __syncthreads();
        if (t == 0) grid_barrier_arrive_and_wait();
      }
    }
  }
};

}  // namespace fj
