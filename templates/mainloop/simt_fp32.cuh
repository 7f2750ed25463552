// Strict-fp32 GEMM mainloop of the tiled variant: register-blocked FFMA on the CUDA cores, every
// product and sum in IEEE fp32 (no tensor cores, no tf32). Each thread owns an 8x8 block of the
// BM x BN tile, so one k step costs it 4 shared-memory vector loads for 64 FFMAs.
//
// Operands are staged transposed, [k][row], so that a thread's 4 consecutive rows (or columns)
// at one k are one 16-byte load. The transpose happens in the copy itself: 4-byte cp.async per
// element into the transposed slot, STAGES deep, which keeps the latency of global loads off the
// FFMA stream without staging registers. Thread t copies element k = t % BK of row t / BK (+ a
// multiple of THREADS / BK): a warp reads 32 / BK row segments of 4 * BK bytes (coalesced). With
// rows padded by 4 floats its writes hit 32 distinct banks at BK = 8 and conflict 2- and 4-way
// at BK = 16 and 32; a conflict-free mapping (8 k x 4 rows per warp, 4 lines per request) measured
// 3% slower on H100, so the copy keeps whole row segments per warp.
//
// A thread's 8 rows are two groups of 4, half a warp tile apart (and likewise its columns):
// then the 8 lanes of a 16-byte shared-memory phase read 8 distinct consecutive vectors or the
// same one (broadcast), never two vectors in the same banks.
#pragma once
#include "common/cp_async.cuh"
#include "common/math_kind.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "common/types.cuh"

namespace fj {

template <class Spec>
struct SimtFp32Mainloop {
  static constexpr int BM = Spec::BM, BN = Spec::BN, BK = Spec::BK;
  static constexpr int WARPS_M = Spec::WARPS_M, WARPS_N = Spec::WARPS_N;
  static constexpr int STAGES = Spec::STAGES, THREADS = Spec::THREADS;
  static constexpr int M = Spec::M, N = Spec::N, K = Spec::K;
  static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
  static constexpr int LM = WTM / 8, LN = WTN / 8;              // lanes along m and n
  static constexpr int LDA = BM + 4, LDB = BN + 4;              // padded [k][row] strides, floats
  static constexpr int kStageFloats = BK * (LDA + LDB);
  static constexpr int kStageBytes = kStageFloats * 4;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static constexpr int KT = (K + BK - 1) / BK;

  static_assert(Spec::MATH == kMathSimtFp32, "SimtFp32Mainloop: MATH must be kMathSimtFp32");
  static_assert(sizeof(typename Spec::T) == 4, "SimtFp32Mainloop: T must be float");
  static_assert(M >= 0 && N >= 1 && K >= 1,
                "N and K must be positive, M positive or 0 (the run's, common/rows.cuh)");
  static_assert(THREADS == WARPS_M * WARPS_N * 32, "THREADS must be WARPS_M * WARPS_N * 32");
  static_assert(BM % WARPS_M == 0 && BN % WARPS_N == 0,
                "BM and BN must divide evenly among WARPS_M and WARPS_N");
  static_assert(WTM % 8 == 0 && WTN % 8 == 0 && LM * LN == 32,
                "each lane owns an 8x8 block: (BM / WARPS_M) * (BN / WARPS_N) must be 32 * 64 "
                "with both sides multiples of 8 (e.g. 128x128 with 2x4 warps)");
  static_assert(BK >= 1 && BK <= 32 && (BK & (BK - 1)) == 0,
                "BK must be a power of two up to 32 (a warp copies whole k rows)");
  static_assert(STAGES >= 2, "STAGES must be at least 2 (one tile computing, one loading)");
  static_assert(kSmemBytes <= 227 * 1024,
                "the cp.async ring needs more than 227 KB of shared memory: lower STAGES or BK");

  // One operand's transposed copy: ROWS x BK elements of the K-contiguous [NROWS][LD] matrix
  // into [BK][LDS] floats.
  template <int ROWS, int NROWS, int LD, int LDS>
  struct Loader {
    static constexpr int kElems = ROWS * BK;
    static constexpr int kIters = (kElems + THREADS - 1) / THREADS;
    static constexpr int kRowStep = THREADS / BK;
    static constexpr bool kRowTail = NROWS == 0 || NROWS % ROWS != 0;  // 0: the run's count
    const float* base;
    const float* g;  // this thread's element of k-tile 0
    int k;           // this thread's k inside a tile
    int row;         // this thread's first row inside the tile
    int rows_left;

    __device__ __forceinline__ void init(const void* ptr, int row0, int tid, int nrows) {
      base = static_cast<const float*>(ptr);
      k = tid % BK;
      row = tid / BK;
      rows_left = nrows - row0 - row;
      g = base + static_cast<long long>(row0 + row) * LD + k;
    }
    __device__ __forceinline__ void issue(unsigned stage, int kt) const {
      const bool k_ok = K % BK == 0 || kt * BK + k < K;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        if (kElems % THREADS != 0 && row + i * kRowStep >= ROWS) break;
        const bool ok = k_ok && (!kRowTail || i * kRowStep < rows_left);
        const float* src = g + static_cast<long long>(i) * kRowStep * LD + kt * BK;
        cp_async<4>(stage + (k * LDS + row + i * kRowStep) * 4, ok ? src : base, ok ? 4 : 0);
      }
    }
  };
  using LoaderA = Loader<BM, M, Spec::LDX, LDA>;
  using LoaderB = Loader<BN, N, Spec::LDW, LDB>;

  // Multiplies k tiles [k.begin, k.end) (all KT of them, or one split-K share).
  __device__ __forceinline__ static void run(const Params& p, char* smem, int m0, int n0, KRange k,
                                             AccTile<BM, BN> tile) {
    const int nkt = k.end - k.begin;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int lm = lane % LM;
    const int ln = lane / LM;
    // First row / column of this thread's two 4-wide groups (the second is half a warp tile on).
    const int ra = (warp / WARPS_N) * WTM + lm * 4;
    const int cb = (warp % WARPS_N) * WTN + ln * 4;

    LoaderA la;
    LoaderB lb;
    la.init(p.x, m0, tid, rows_of<Spec>(p));
    lb.init(p.w, n0, tid, Spec::N);
    const unsigned s0 = smem_u32(smem);
    const float* sf = reinterpret_cast<const float*>(smem);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nkt) {
        la.issue(s0 + s * kStageBytes, k.begin + s);
        lb.issue(s0 + s * kStageBytes + BK * LDA * 4, k.begin + s);
      }
      cp_async_commit();  // one group per slot, even empty, so the wait count below is exact
    }

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    int rs = 0;           // stage being read
    int ws = STAGES - 1;  // stage the next tile goes to
    for (int kt = 0; kt < nkt; ++kt) {
      // Tile kt has landed (this thread's copies) and is visible (everyone's); everyone is done
      // reading the stage that tile kt-1 used, which is the one refilled next.
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      if (kt + STAGES - 1 < nkt) {
        la.issue(s0 + ws * kStageBytes, k.begin + kt + STAGES - 1);
        lb.issue(s0 + ws * kStageBytes + BK * LDA * 4, k.begin + kt + STAGES - 1);
      }
      cp_async_commit();
      ws = ws + 1 == STAGES ? 0 : ws + 1;

      const float* As = sf + rs * kStageFloats;
      const float* Bs = As + BK * LDA;
#pragma unroll
      for (int k = 0; k < BK; ++k) {
        const float4 a0 = *reinterpret_cast<const float4*>(As + k * LDA + ra);
        const float4 a1 = *reinterpret_cast<const float4*>(As + k * LDA + ra + WTM / 2);
        const float4 b0 = *reinterpret_cast<const float4*>(Bs + k * LDB + cb);
        const float4 b1 = *reinterpret_cast<const float4*>(Bs + k * LDB + cb + WTN / 2);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
      }
      rs = rs + 1 == STAGES ? 0 : rs + 1;
    }

    // The tile may alias the ring: no copy may still be landing and no warp still reading.
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = ra + (i & 3) + (i >> 2) * (WTM / 2);
      float4 lo, hi;
      lo.x = acc[i][0], lo.y = acc[i][1], lo.z = acc[i][2], lo.w = acc[i][3];
      hi.x = acc[i][4], hi.y = acc[i][5], hi.z = acc[i][6], hi.w = acc[i][7];
      *reinterpret_cast<float4*>(&tile(r, cb)) = lo;
      *reinterpret_cast<float4*>(&tile(r, cb + WTN / 2)) = hi;
    }
    __syncthreads();
  }
};

}  // namespace fj
