// Strict-fp32 GEMM mainloop of the tiled variant: register-blocked FFMA on the CUDA cores, every
// product and sum in IEEE fp32 (no tensor cores, no tf32). Each thread owns an 8x8 block of the
// BM x BN tile, so one k step costs it 4 shared-memory vector loads for 64 FFMAs.
//
// Operands are staged [k][row], so that a thread's 4 consecutive rows (or columns) at one k are
// one 16-byte load. A K-major operand (mainloop/operands.cuh) is transposed by the copy itself:
// 4-byte cp.async per element into the transposed slot (detail::ElementLoader), STAGES deep,
// which keeps the latency of global loads off the FFMA stream without staging registers. Thread
// t copies element k = t % BK of row t / BK (+ a multiple of THREADS / BK): a warp reads 32 / BK
// row segments of 4 * BK bytes (coalesced). With rows padded by 4 floats its writes hit 32
// distinct banks at BK = 8 and conflict 2- and 4-way at BK = 16 and 32; a conflict-free mapping
// (8 k x 4 rows per warp, 4 lines per request) measured 3% slower on H100, so the copy keeps
// whole row segments per warp. An MN-major operand is already [k][row] in memory: it is copied
// in 16-byte chunks (detail::ChunkLoader into a PaddedTile), a warp writing one contiguous k row.
#pragma once
#include "common/cp_async.cuh"
#include "common/math_kind.cuh"
#include "common/select.cuh"
#include "common/smem_layout.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "common/types.cuh"
#include "mainloop/operand_loader.cuh"
#include "mainloop/operands.cuh"

namespace fj {

template <class G>
struct SimtFp32Mainloop {
  static constexpr int BM = G::BM, BN = G::BN, BK = G::BK;
  static constexpr int WARPS_M = G::WARPS_M, WARPS_N = G::WARPS_N;
  static constexpr int STAGES = G::STAGES, THREADS = G::THREADS;
  static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // warp tile
  static constexpr int LM = WTM / 8, LN = WTN / 8;              // lanes along m and n
  static constexpr int SLDA = BM + 4, SLDB = BN + 4;            // padded [k][row] strides, floats
  static constexpr int kStageFloats = BK * (SLDA + SLDB);
  static constexpr int kStageBytes = kStageFloats * 4;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  // k-tiles when the reduction length is a constant (0 when it is the run's: see k_tiles()).
  static constexpr int KT = G::RED > 0 ? (G::RED + BK - 1) / BK : 0;

  static_assert(G::MATH == kMathSimtFp32, "SimtFp32Mainloop: MATH must be kMathSimtFp32");
  static_assert(sizeof(typename G::T) == 4, "SimtFp32Mainloop: T must be float");
  static_assert(G::ROWS >= 0 && G::COLS >= 1 && G::RED >= 0,
                "the column count must be positive, rows and reduction positive or 0 (the run's)");
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

  __device__ __forceinline__ static int k_tiles(const GemmOperands& op) {
    if constexpr (KT > 0)
      return KT;
    else
      return (gemm_red<G>(op) + BK - 1) / BK;
  }

  // Element (k, row) of a [BK][LDS] stage. Offsets are computed per pass (kLinearPeriod = 0:
  // ElementPasses' shortcut is not taken), as they were before it existed: this path spills
  // nowhere, and its speed was measured this way.
  template <int LDS>
  struct KRowSlot {
    static constexpr int kLinearPeriod = 0, kLinearStride = 0;
    FJ_HOST_DEVICE_INLINE static constexpr int offset(int k, int row) {
      return (k * LDS + row) * 4;
    }
  };
  // One operand: TILE output indices x BK of a matrix with NOUT output indices and the reduction
  // (either 0: the run's), stride LD, copied VEC bytes at a time, into a [BK][LDS] stage.
  template <int TILE, int NOUT, int LD, bool MN, int LDS, int VEC>
  struct Operand {
    using Loader = typename Select<
        MN,
        detail::ChunkLoader<float, PaddedTile<BK, LDS * 4>, BK, TILE, G::RED, NOUT, LD, VEC,
                            THREADS, true>,
        detail::ElementLoader<KRowSlot<LDS>, TILE, BK, NOUT, G::RED, LD, THREADS, BK, false>>::type;
    __device__ __forceinline__ static void init(Loader& l, const void* ptr, int o0, int tid,
                                                int nout, int red) {
      if constexpr (MN)
        l.init(ptr, 0, o0, tid, red, nout);
      else
        l.init(ptr, o0, 0, tid, nout, red);
    }
  };
  using OpA = Operand<BM, G::ROWS, G::LDA, G::A_MN_MAJOR, SLDA, G::A_VEC_BYTES>;
  using OpB = Operand<BN, G::COLS, G::LDB, G::B_MN_MAJOR, SLDB, G::B_VEC_BYTES>;
  using LoaderA = typename OpA::Loader;
  using LoaderB = typename OpB::Loader;

  // Multiplies k tiles [k.begin, k.end) (all k_tiles() of them, or one split-K share) of the
  // operands `op` for the output tile at (m0, n0).
  __device__ __forceinline__ static void run(const GemmOperands& op, char* smem, int m0, int n0,
                                             KRange k, AccTile<BM, BN> tile) {
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
    OpA::init(la, op.a, m0, tid, gemm_rows<G>(op), gemm_red<G>(op));
    OpB::init(lb, op.b, n0, tid, G::COLS, gemm_red<G>(op));
    const unsigned s0 = smem_u32(smem);
    const float* sf = reinterpret_cast<const float*>(smem);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nkt) {
        la.issue(s0 + s * kStageBytes, k.begin + s);
        lb.issue(s0 + s * kStageBytes + BK * SLDA * 4, k.begin + s);
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
        lb.issue(s0 + ws * kStageBytes + BK * SLDA * 4, k.begin + kt + STAGES - 1);
      }
      cp_async_commit();
      ws = ws + 1 == STAGES ? 0 : ws + 1;

      const float* As = sf + rs * kStageFloats;
      const float* Bs = As + BK * SLDA;
#pragma unroll
      for (int k = 0; k < BK; ++k) {
        const float4 a0 = *reinterpret_cast<const float4*>(As + k * SLDA + ra);
        const float4 a1 = *reinterpret_cast<const float4*>(As + k * SLDA + ra + WTM / 2);
        const float4 b0 = *reinterpret_cast<const float4*>(Bs + k * SLDB + cb);
        const float4 b1 = *reinterpret_cast<const float4*>(Bs + k * SLDB + cb + WTN / 2);
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
