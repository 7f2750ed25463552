// Train statistics from x, before the GEMM (KernelConfig::input_stats, issue 16's third item).
// The column statistics of a = x W^T follow from x's mean and centred covariance S (K x K):
//   mean_a = W xbar,   var_a[n] = w_n^T S w_n.
// Reducing S reads x once and costs M K^2 products, against recompute's first GEMM pass, which
// multiplies all of x W^T again and reduces M x N accumulators; so when K is small against N the
// statistics cost a fraction of that pass, and the affine GEMM after them is the only pass over
// y. The reference beside it: bench/stats_before_gemm_study.py (numpy), and the float64 checks of
// tests/gpu/input_stats_test.cpp.
//
// One cooperative kernel, three phases split by grid barriers:
//  1. Each CTA takes row tiles of kInputStatsTileRows rows in turn. Per tile it centres the rows
//     on the tile's own column mean (so large column means cancel before anything is squared),
//     splits each centred value d into three bf16 parts (hi + mid + lo keeps d's 24 bits) and
//     forms the tile's d^T d on the tensor cores from six of the nine part products (the three
//     left out are below 2^-24 of |d|^2). Tiles merge into the CTA's (rows, mean, sum of
//     squares) with Chan's formula, in tile order.
//  2. xbar over all CTAs, then S = (1/M) sum_g [C_g + n_g (mean_g - xbar)(mean_g - xbar)^T]:
//     no subtraction of large sums, every term's order fixed (deterministic, no float atomics).
//  3. Per column n: mean_a, var_a, and how much the quadratic form cancels,
//     sum |w_j S_jk w_k| / w^T S w. fp32 leaves var_a a relative error of about 2^-24 times
//     that factor (the study above), which no plan-time rule can bound (it depends on the data:
//     correlated features and a weight row that takes their difference). Above the dtype's
//     limit the column is not trusted: the kernel raises the region's flag, and the run's
//     statistics GEMM (which otherwise returns at once) and fj_finalize (which otherwise only
//     records what this kernel left) take the statistics from the GEMM's accumulators instead,
//     as recompute does (bit for bit recompute's then).
#pragma once
#include "common/cp_async.cuh"
#include "common/grid_barrier.cuh"
#include "common/input_stats.h"
#include "common/input_stats_flag.cuh"
#include "common/math_kind.cuh"
#include "common/mma.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/types.cuh"

namespace fj {

// The largest cancellation factor a column's var_a is trusted with. At 2^-24 per unit of factor
// (bench/stats_before_gemm_study.py, one rounding, M = 8192), 1024 leaves var_a within ~6e-5
// and invstd within ~3e-5: under a sixtieth of tf32's 2e-3 tolerance and far under the 16-bit
// types'. Strict fp32 and 3xTF32 are held to 2e-5, so they get 128 (~4e-6 on invstd). This
// kernel rounds more often than that model (Chan merges per CTA, a merge over the CTAs), so
// these margins are estimates, checked by the tests up to 40000 rows.
template <class Spec>
__device__ __forceinline__ constexpr float input_stats_cancellation_limit() {
  return Spec::MATH == kMathSimtFp32 || Spec::MATH == kMathTf32x3 ? 128.f : 1024.f;
}

// bf16 bits of f, rounded to nearest even.
__device__ __forceinline__ unsigned short bf16_bits_rn(float f) {
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
__device__ __forceinline__ float bf16_bits_value(unsigned short b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}

template <class Spec>
struct InputStats {
  using T = typename Spec::T;
  static constexpr int K = Spec::K;
  static constexpr int KP = input_stats_kp(K);
  static constexpr int R = kInputStatsTileRows;
  static constexpr int kThreads = kInputStatsThreads;
  static constexpr int kWarps = kThreads / 32;
  // 16 bytes of padding per row: ldmatrix's eight row addresses then fall in distinct banks.
  static constexpr int kPitch = KP + 8;
  static constexpr int kTileSide = KP / 16;
  static constexpr int kOutTiles = kTileSide * kTileSide;  // 16x16 tiles of d^T d
  static constexpr int kTilesPerWarp = (kOutTiles + kWarps - 1) / kWarps;
  // The loads: thread t always takes column t % KP, in rows t / KP + i * kColGroups.
  static constexpr int kColGroups = kThreads / KP;
  static constexpr int kLoads = R * KP / kThreads;
  static_assert(K <= kInputStatsMaxK, "input_stats: K above kInputStatsMaxK");
  static_assert(kThreads % KP == 0 && (R * KP) % kThreads == 0 && R % 16 == 0,
                "input_stats: the block must tile the rows and columns");

  struct SharedStorage {
    union {
      unsigned short planes[3][R][kPitch];  // phase 1: d's hi, mid and lo parts, bf16
      float s[KP * KP];                     // phase 3: S
    } u;
    float tile_mean[KP];
    float run_mean[KP];
    float part[kColGroups][KP];
    float mu[KP];
    float w[KP];
    float red[3][kWarps];
  };

  using Acc = float[kTilesPerWarp][2][4];

  __device__ static void zero(Acc& a) {
#pragma unroll
    for (int q = 0; q < kTilesPerWarp; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[q][h][i] = 0.f;
  }

  // The tile's d^T d into `acc` from the three bf16 planes: warp w takes 16x16 output tiles
  // w, w + 8, ...; A = d^T (rows j) and B = d (columns k) both come from the [row][column]
  // planes through ldmatrix.trans.
  __device__ static void tile_products(SharedStorage& sh, Acc& acc) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    zero(acc);
    // The part products kept, small ones first: hi*lo, lo*hi, mid*mid, hi*mid, mid*hi, hi*hi.
    constexpr int kPairs[6][2] = {{0, 2}, {2, 0}, {1, 1}, {0, 1}, {1, 0}, {0, 0}};
#pragma unroll
    for (int q = 0; q < kTilesPerWarp; ++q) {
      const int ot = warp + q * kWarps;
      if (ot >= kOutTiles) break;
      const int tj = ot / kTileSide, tk = ot % kTileSide;
#pragma unroll
      for (int s = 0; s < R / 16; ++s) {
        unsigned a[3][4], b[3][4];
#pragma unroll
        for (int pl = 0; pl < 3; ++pl) {
          // A's four 8x8 matrices: (j 0-7, rows 0-7), (j 8-15, rows 0-7), (j 0-7, rows 8-15),
          // (j 8-15, rows 8-15), stored [row][j].
          ldmatrix_x4_trans(a[pl], smem_u32(&sh.u.planes[pl][s * 16 + (lane >> 4) * 8 + (lane & 7)]
                                                        [tj * 16 + ((lane >> 3) & 1) * 8]));
          // B's: (k 0-7, rows 0-7), (k 0-7, rows 8-15), (k 8-15, rows 0-7), (k 8-15, rows 8-15).
          ldmatrix_x4_trans(b[pl],
                            smem_u32(&sh.u.planes[pl][s * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)]
                                                 [tk * 16 + (lane >> 4) * 8]));
        }
#pragma unroll
        for (int pr = 0; pr < 6; ++pr)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const unsigned bb[2] = {b[kPairs[pr][1]][2 * h], b[kPairs[pr][1]][2 * h + 1]};
            mma_16x8<kMathBf16>(acc[q][h], a[kPairs[pr][0]], bb);
          }
      }
    }
  }

  // Entry (j, k) of accumulator register (q, h, i) of this lane, in the 16x16 tile layout of
  // mma_16x8's D.
  __device__ static int entry_j(int q, int i) {
    const int ot = threadIdx.x / 32 + q * kWarps;
    return (ot / kTileSide) * 16 + (threadIdx.x % 32) / 4 + 8 * (i >> 1);
  }
  __device__ static int entry_k(int q, int h, int i) {
    const int ot = threadIdx.x / 32 + q * kWarps;
    return (ot % kTileSide) * 16 + h * 8 + 2 * (threadIdx.x % 4) + (i & 1);
  }

  // A butterfly over the warp: every lane ends with the same bits (each level adds the same
  // two values, in either order).
  __device__ static float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }

  // f(q, h, i, j, k) for each accumulator register (q, h, i) of this thread that holds an entry
  // (j, k) of d^T d (a warp past the output tiles holds none).
  template <class F>
  __device__ static void for_each_entry(F&& f) {
#pragma unroll
    for (int q = 0; q < kTilesPerWarp; ++q) {
      if (threadIdx.x / 32 + q * kWarps >= kOutTiles) break;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) f(q, h, i, entry_j(q, i), entry_k(q, h, i));
    }
  }

  // The block's sum of (v0, v1, v2) in a fixed order (lanes by a butterfly, then warps in
  // order); valid in thread 0.
  __device__ static void block_sum3(SharedStorage& sh, float& v0, float& v1, float& v2) {
    v0 = warp_sum(v0), v1 = warp_sum(v1), v2 = warp_sum(v2);
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) sh.red[0][warp] = v0, sh.red[1][warp] = v1, sh.red[2][warp] = v2;
    __syncthreads();
    if (threadIdx.x == 0) {
      v0 = sh.red[0][0], v1 = sh.red[1][0], v2 = sh.red[2][0];
      for (int w = 1; w < kWarps; ++w) v0 += sh.red[0][w], v1 += sh.red[1][w], v2 += sh.red[2][w];
    }
  }

  // Issues the loads of row tile `tile` of x as this thread takes it (column t % KP of rows
  // t / KP + i * kColGroups) into `raw`, which the caller reads only when it needs the values,
  // so the loads of the next tile are in flight while this one is multiplied. Every load goes
  // out, from a clamped address: loads under a condition went out one at a time (ncu: 16
  // dependent round trips per tile, 87 us at 65536x256x64 bf16, 13% of issue slots used).
  __device__ static void load_tile(const T* x, int m, int tile, T (&raw)[kLoads]) {
    const int t = threadIdx.x, col = t % KP;
    const long long row0 = static_cast<long long>(tile) * R;
    const long long last = static_cast<long long>(m) - 1;
    const int c = col < K ? col : K - 1;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const long long r = row0 + t / KP + i * kColGroups;
      raw[i] = x[(r < last ? r : last) * Spec::LDX + c];
    }
  }

  __device__ static void run(const Params& p) {
    __shared__ SharedStorage sh;
    constexpr InputStatsLayout L = input_stats_layout(Spec::N, KP);
    const int t = threadIdx.x;
    const int m = rows_of<Spec>(p);
    const int tiles = (m + R - 1) / R;
    const int ctas = static_cast<int>(gridDim.x);
    float* ws = p.ws_xstats;
    const T* x = static_cast<const T*>(p.x);
    const int col = t % KP;

    // Phase 1: this CTA's row tiles.
    Acc run_c, acc;
    zero(run_c);
    if (t < KP) sh.run_mean[t] = 0.f;
    float run_n = 0.f;
    T raw[kLoads];
    load_tile(x, m, blockIdx.x, raw);
    for (int tile = blockIdx.x; tile < tiles; tile += ctas) {
      const int valid = min(R, m - tile * R);
      // Zero past the rows and past K.
      float v[kLoads];
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        v[i] = t / KP + i * kColGroups < valid && col < K ? to_float(raw[i]) : 0.f;
        sum += v[i];
      }
      sh.part[t / KP][col] = sum;
      __syncthreads();
      if (t < KP) {
        float s = sh.part[0][t];
        for (int g = 1; g < kColGroups; ++g) s += sh.part[g][t];
        sh.tile_mean[t] = s / static_cast<float>(valid);
      }
      __syncthreads();
      const float mean = sh.tile_mean[col];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int r = t / KP + i * kColGroups;
        const float d = r < valid && col < K ? v[i] - mean : 0.f;
        const unsigned short hi = bf16_bits_rn(d);
        const float rest = d - bf16_bits_value(hi);
        const unsigned short mid = bf16_bits_rn(rest);
        sh.u.planes[0][r][col] = hi;
        sh.u.planes[1][r][col] = mid;
        sh.u.planes[2][r][col] = bf16_bits_rn(rest - bf16_bits_value(mid));
      }
      if (tile + ctas < tiles) load_tile(x, m, tile + ctas, raw);
      __syncthreads();
      tile_products(sh, acc);
      const float nt = static_cast<float>(valid);
      if (run_n == 0.f) {
#pragma unroll
        for (int q = 0; q < kTilesPerWarp; ++q)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) run_c[q][h][i] = acc[q][h][i];
        if (t < KP) sh.run_mean[t] = sh.tile_mean[t];
      } else {
        // Chan: C += C_t + (n n_t / (n + n_t)) delta delta^T, delta = mean_t - mean.
        const float tot = run_n + nt;
        const float w = run_n * nt / tot;
        for_each_entry([&](int q, int h, int i, int j, int k) {
          const float dj = sh.tile_mean[j] - sh.run_mean[j];
          const float dk = sh.tile_mean[k] - sh.run_mean[k];
          run_c[q][h][i] += acc[q][h][i] + w * dj * dk;
        });
        __syncthreads();  // every thread has read run_mean before it moves
        if (t < KP) sh.run_mean[t] += (sh.tile_mean[t] - sh.run_mean[t]) * (nt / tot);
      }
      run_n += nt;
      __syncthreads();  // the planes and tile_mean are the next tile's
    }
    float* mine = ws + L.partials + static_cast<long long>(blockIdx.x) * L.partial_stride;
    if (t == 0) mine[0] = run_n;
    if (t < KP) mine[4 + t] = sh.run_mean[t];
    for_each_entry(
        [&](int q, int h, int i, int j, int k) { mine[4 + KP + j * KP + k] = run_c[q][h][i]; });
    // Phase 3 raises the flag; it is cleared here, before the barriers that order the two.
    if (blockIdx.x == 0 && t == 0) reinterpret_cast<unsigned*>(ws)[L.flag] = 0u;
    __syncthreads();
    if (t == 0) grid_barrier_arrive_and_wait();
    __syncthreads();

    // Phase 2: this CTA's entries of S, a warp per entry; lane l takes CTAs l, l + 32, ..., all
    // loads at once (this phase waits on memory, not arithmetic). The warp first sums xbar_j and
    // xbar_k from the same registers: every warp that needs xbar_j gets the same bits (same
    // lanes, same butterfly), and the warp of the diagonal entry (j, j) stores it.
    const float rows = static_cast<float>(m);
    {
      constexpr int kPerLane = (kInputStatsMaxCtas + 31) / 32;
      const int lane = t % 32, warp = t / 32;
      const int per_cta = (KP * KP + ctas - 1) / ctas;
      for (int local = warp; local < per_cta; local += kWarps) {
        const int e = blockIdx.x * per_cta + local;
        if (e >= KP * KP) break;
        const int j = e / KP, k = e % KP;
        float ng[kPerLane], mj[kPerLane], mk[kPerLane];
        float sj = 0.f, sk = 0.f, c = 0.f;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int g = lane + 32 * i;
          ng[i] = mj[i] = mk[i] = 0.f;
          if (g < ctas) {
            const float* pg = ws + L.partials + static_cast<long long>(g) * L.partial_stride;
            ng[i] = pg[0], mj[i] = pg[4 + j], mk[i] = pg[4 + k];
            c += pg[4 + KP + e];
          }
        }
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) sj += ng[i] * mj[i], sk += ng[i] * mk[i];
        sj = warp_sum(sj), sk = warp_sum(sk);
        const float muj = sj / rows, muk = sk / rows;
        // Lanes past the grid hold zeros: their terms add +0.
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) c += ng[i] * (mj[i] - muj) * (mk[i] - muk);
        c = warp_sum(c);
        if (lane == 0) {
          ws[L.merged + KP + e] = c / rows;
          if (j == k) ws[L.merged + j] = muj;
        }
      }
    }
    __syncthreads();
    if (t == 0) grid_barrier_arrive_and_wait();
    __syncthreads();

    // Phase 3: columns blockIdx.x, + ctas, ...
    if (static_cast<int>(blockIdx.x) >= Spec::N) return;
    static_assert((KP * KP) % kThreads == 0, "input_stats: S loads in whole rounds");
#pragma unroll
    for (int i = 0; i < KP * KP / kThreads; ++i)
      sh.u.s[t + i * kThreads] = ws[L.merged + KP + t + i * kThreads];
    if (t < KP) sh.mu[t] = ws[L.merged + t];
    const T* wt = static_cast<const T*>(p.w);
    float2* columns = reinterpret_cast<float2*>(ws + L.columns);
    for (int n = blockIdx.x; n < Spec::N; n += ctas) {
      __syncthreads();  // S is in; the previous column's w and sums are read
      if (t < KP) sh.w[t] = t < K ? to_float(wt[static_cast<long long>(n) * Spec::LDW + t]) : 0.f;
      __syncthreads();
      float var = 0.f, bound = 0.f, mean = t < KP ? sh.w[t] * sh.mu[t] : 0.f;
      for (int e = t; e < KP * KP; e += kThreads) {
        const float q = sh.w[e / KP] * sh.u.s[e] * sh.w[e % KP];
        var += q;
        bound += fabsf(q);
      }
      block_sum3(sh, mean, var, bound);
      if (t == 0) {
        columns[n] = make_float2(mean, var);
        // Also false for a negative or NaN var; 0 <= 0 for a column that is constant.
        if (!(bound <= input_stats_cancellation_limit<Spec>() * var))
          atomicOr(reinterpret_cast<unsigned*>(ws) + L.flag, 1u);
      }
    }
  }
};

}  // namespace fj
