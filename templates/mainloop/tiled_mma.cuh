// Tensor-core GEMM mainloop of the tiled variant (sm_80+): a STAGES-deep cp.async ring of
// XOR-swizzled operand tiles in shared memory, ldmatrix into registers, mma.sync with fp32
// accumulators. One CTA computes acc(r, c) = sum_k x[m0 + r][k] * W[n0 + c][k] for a BM x BN
// tile; every operand is K-contiguous (x [M][LDX], W [N][LDW]: the nn.Linear "TN" GEMM), so
// both go through the same loader and the same non-transposed ldmatrix.
//
// fp16/bf16: mma.m16n8k16. tf32 (fp32 storage): mma.m16n8k8 on fp32 data. ldmatrix works on it
// unchanged because an 8x8 matrix of 16-bit elements is an 8x4 matrix of 32-bit ones, and the
// lane -> (row, word) mapping it produces is the m16n8k8 tf32 fragment layout. The fp32 values
// are rounded to tf32 as they leave ldmatrix (round to nearest, ties away: the cvt.rna /
// cuBLAS result, see to_tf32) unless the Spec sets `static constexpr bool TF32_ROUND = false;`,
// which feeds raw fp32 bits and lets the tensor core ignore the low mantissa bits (truncation:
// faster, but biased toward zero).
#pragma once
#include "common/cp_async.cuh"
#include "common/math_kind.cuh"
#include "common/mma.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/smem_layout.cuh"
#include "common/spec_flag.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "common/types.cuh"

namespace fj {

namespace detail {

template <class A, class B>
struct IsSame {
  static constexpr bool value = false;
};
template <class A>
struct IsSame<A, A> {
  static constexpr bool value = true;
};

// Spec::TF32_ROUND if the Spec declares it, else true (round like cuBLAS does).
FJ_SPEC_FLAG(Tf32Round, TF32_ROUND, true);

__device__ __forceinline__ int clamp_bytes(int v, int hi) {
  return v < 0 ? 0 : (v > hi ? hi : v);
}

// Copies ROWS x BK slices of a K-contiguous matrix [NROWS][LD] (first row `row0`) into one
// swizzled stage. NROWS is the row count when it is a compile-time constant, 0 when it is the
// run's (x's M, common/rows.cuh): init() is given it either way. Thread t owns chunk column t % CPR
// of rows t / CPR + i * kRowStep, so a warp reads whole contiguous row segments (coalesced) and
// writes whole 128-byte lines of shared memory (conflict-free). Rows >= NROWS and k >= K are
// zero-filled: zero rows keep garbage out of the accumulators and zero k columns (in both operands)
// add nothing to the dot products.
template <class T, int ROWS, int BK, int NROWS, int K, int LD, int VEC, int THREADS>
struct OperandLoader {
  static constexpr int kEpc = 16 / int(sizeof(T));  // elements per 16-byte chunk
  static constexpr int CPR = BK / kEpc;
  using Layout = SwizzledTile<ROWS, CPR>;
  static constexpr int kChunks = ROWS * CPR;
  static constexpr int kIters = (kChunks + THREADS - 1) / THREADS;
  static constexpr int kRowStep = THREADS / CPR;
  // Successive chunks of a thread keep the same swizzle key: their offsets differ by a constant.
  static constexpr bool kLinearRows = kRowStep % Layout::kPeriod == 0;
  // Some tile has rows past the matrix (always possible when the row count is the run's).
  static constexpr bool kRowTail = NROWS == 0 || NROWS % ROWS != 0;
  static constexpr bool kKTail = K % BK != 0;  // the last k-tile is partial
  static_assert(THREADS % CPR == 0, "OperandLoader: THREADS must be a multiple of BK*sizeof(T)/16");
  static_assert(VEC == 16 || VEC == 8 || VEC == 4 || (VEC == 2 && sizeof(T) == 2),
                "VEC_BYTES must be 16, 8, 4, or 2 for 16-bit types (and at least sizeof(T))");

  const T* base;  // a valid, aligned address for copies that read nothing
  const T* g;     // this thread's first chunk, k-tile 0
  int row;        // this thread's first row inside the tile
  int chunk;      // this thread's chunk column
  int rows_left;  // rows of the matrix at or after this thread's first row
  int soff;       // swizzled byte offset of the first chunk in a stage

  __device__ __forceinline__ void init(const void* ptr, int row0, int tid, int nrows) {
    base = static_cast<const T*>(ptr);
    chunk = tid % CPR;
    row = tid / CPR;
    rows_left = nrows - row0 - row;
    g = base + static_cast<long long>(row0 + row) * LD + chunk * kEpc;
    soff = Layout::offset(row, chunk);
  }

  __device__ __forceinline__ void issue(unsigned stage, int kt) const {
    const int k0 = kt * BK + chunk * kEpc;
    // Elements before converting to bytes: (K - k0) * sizeof(T) passes 2^31 once K > 2^30.
    const int left = K - k0;
    const int kbytes = !kKTail || left >= kEpc ? 16 : clamp_bytes(left * int(sizeof(T)), 16);
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      if (kChunks % THREADS != 0 && row + i * kRowStep >= ROWS) break;
      const bool row_ok = !kRowTail || i * kRowStep < rows_left;
      const int bytes = row_ok ? kbytes : 0;
      const unsigned dst = stage + (kLinearRows ? soff + i * kRowStep * Layout::kRowBytes
                                                : Layout::offset(row + i * kRowStep, chunk));
      const T* src = g + static_cast<long long>(i) * kRowStep * LD + kt * BK;
      if constexpr (VEC == 16) {
        cp_async<16>(dst, bytes > 0 ? src : base, bytes);
      } else if constexpr (VEC >= 4) {
        // The operand rows are only VEC-aligned: split the chunk into VEC-byte copies, each
        // with its own share of the valid bytes.
#pragma unroll
        for (int j = 0; j < 16 / VEC; ++j) {
          const int b = clamp_bytes(bytes - j * VEC, VEC);
          const char* s = reinterpret_cast<const char*>(src) + j * VEC;
          cp_async<VEC>(dst + j * VEC, b > 0 ? s : reinterpret_cast<const char*>(base), b);
        }
      } else {
        // 2-byte alignment: cp.async needs at least 4. Load elements synchronously and store
        // the assembled chunk; the pipeline's barriers order it like a completed cp.async.
        unsigned short v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = e * 2 < bytes ? src[e].bits : 0;
        st_shared_v4(dst, v[0] | (unsigned(v[1]) << 16), v[2] | (unsigned(v[3]) << 16),
                     v[4] | (unsigned(v[5]) << 16), v[6] | (unsigned(v[7]) << 16));
      }
    }
  }
};

}  // namespace detail

template <class Spec>
struct TiledMmaMainloop {
  using T = typename Spec::T;
  static constexpr int MATH = Spec::MATH;
  static constexpr int BM = Spec::BM, BN = Spec::BN, BK = Spec::BK;
  static constexpr int WARPS_M = Spec::WARPS_M, WARPS_N = Spec::WARPS_N;
  static constexpr int STAGES = Spec::STAGES, THREADS = Spec::THREADS;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
  static constexpr int MT = WM / 16, NT = WN / 8;             // mma tiles per warp
  static constexpr int KT = (Spec::K + BK - 1) / BK;          // k-tiles

  static_assert(MATH == kMathBf16 || MATH == kMathFp16 || MATH == kMathTf32,
                "TiledMmaMainloop: MATH must be kMathBf16, kMathFp16 or kMathTf32 (strict fp32 "
                "uses SimtFp32Mainloop)");
  static_assert((MATH == kMathBf16 && detail::IsSame<T, bf16_t>::value) ||
                    (MATH == kMathFp16 && detail::IsSame<T, half_t>::value) ||
                    (MATH == kMathTf32 && detail::IsSame<T, float>::value),
                "TiledMmaMainloop: T must be bf16_t for bf16, half_t for fp16, float for tf32");
  static_assert(Spec::M >= 0 && Spec::N >= 1 && Spec::K >= 1,
                "N and K must be positive, M positive or 0 (the run's)");
  static_assert(THREADS == WARPS_M * WARPS_N * 32, "THREADS must be WARPS_M * WARPS_N * 32");
  static_assert(BM % (16 * WARPS_M) == 0,
                "BM must be a multiple of 16 * WARPS_M (a warp owns whole 16-row mma tiles)");
  static_assert(BN % (8 * WARPS_N) == 0,
                "BN must be a multiple of 8 * WARPS_N (a warp owns whole 8-column mma tiles)");
  static_assert((BK * int(sizeof(T))) % 32 == 0,
                "BK must be a multiple of the mma k-step: 16 for fp16/bf16, 8 for tf32");
  static_assert(STAGES >= 2, "STAGES must be at least 2 (one tile computing, one loading)");
  static_assert(MT * NT * 4 <= 128,
                "warp tile too large: over 128 fp32 accumulators per thread would spill");

  using LoaderA =
      detail::OperandLoader<T, BM, BK, Spec::M, Spec::K, Spec::LDX, Spec::VEC_BYTES, THREADS>;
  using LoaderB =
      detail::OperandLoader<T, BN, BK, Spec::N, Spec::K, Spec::LDW, Spec::VEC_BYTES, THREADS>;
  using LayoutA = typename LoaderA::Layout;
  using LayoutB = typename LoaderB::Layout;
  static constexpr int CPR = LoaderA::CPR;
  static constexpr int KS = CPR / 2;  // mma k-steps per k-tile: each consumes two 16-byte chunks
  static constexpr int kStageBytes = LayoutA::kBytes + LayoutB::kBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static_assert(kSmemBytes <= 227 * 1024,
                "the cp.async ring needs more than 227 KB of shared memory: lower STAGES or BK");
  static constexpr bool kTf32Round = MATH == kMathTf32 && detail::Tf32Round<Spec>::value;

  using FragA = unsigned[MT][4];
  using FragB = unsigned[NT][2];

  // Loads the A and B fragments of one mma k-step. `sa`/`sb` already include this lane's
  // swizzled offset for the k-step; the per-tile offsets are multiples of 16 rows, which the
  // swizzle maps to plain additions (see SwizzledTile).
  __device__ __forceinline__ static void load_frags(FragA& a, FragB& b, unsigned sa, unsigned sb) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], sa + mt * 16 * LayoutA::kRowBytes);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned r[4];
      ldmatrix_x4(r, sb + np * 16 * LayoutB::kRowBytes);
      b[2 * np][0] = r[0];
      b[2 * np][1] = r[1];
      b[2 * np + 1][0] = r[2];
      b[2 * np + 1][1] = r[3];
    }
    if constexpr (NT % 2 == 1)
      ldmatrix_x2(b[NT - 1][0], b[NT - 1][1], sb + (NT - 1) * 8 * LayoutB::kRowBytes);
  }

  // tf32 rounding of the fragments about to be multiplied. Done at the point of use, not right
  // after ldmatrix: issue is in order, so rounding freshly loaded registers would stall the warp
  // on the shared-memory latency in front of the previous step's mmas (seen: 40% slower).
  __device__ __forceinline__ static void round_frags(FragA& a, FragB& b) {
    if constexpr (kTf32Round) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[mt][i] = to_tf32(a[mt][i]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i) b[nt][i] = to_tf32(b[nt][i]);
    }
  }

  // Multiplies k tiles [k.begin, k.end) (all KT of them, or one split-K share).
  __device__ __forceinline__ static void run(const Params& p, char* smem, int m0, int n0, KRange k,
                                             AccTile<BM, BN> tile) {
    const int nkt = k.end - k.begin;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WARPS_N;
    const int wn = warp % WARPS_N;

    LoaderA la;
    LoaderB lb;
    la.init(p.x, m0, tid, rows_of<Spec>(p));
    lb.init(p.w, n0, tid, Spec::N);
    const unsigned s0 = smem_u32(smem);

    // Prologue: STAGES-1 tiles in flight. One commit per slot, even when empty, so that
    // "wait until at most STAGES-2 groups are pending" always means "the next tile landed".
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < nkt) {
        la.issue(s0 + s * kStageBytes, k.begin + s);
        lb.issue(s0 + s * kStageBytes + LayoutA::kBytes, k.begin + s);
      }
      cp_async_commit();
    }

    // This lane's ldmatrix offsets per k-step. A: lanes 0-15 address rows 0-15 of the first
    // chunk of the step, lanes 16-31 the same rows of the second chunk. B (two 8-row n tiles per
    // x4): lane l addresses row 8 * (l / 16) + l % 8 of chunk (l / 8) % 2.
    int a_off[KS], b_off[KS];
    {
      const int ar = wm * WM + (lane & 15);
      const int br = wn * WN + ((lane >> 4) << 3) + (lane & 7);
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        a_off[ks] = LayoutA::offset(ar, 2 * ks + (lane >> 4));
        b_off[ks] = LayoutB::offset(br, 2 * ks + ((lane >> 3) & 1));
      }
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

    // Fragments are double-buffered across k-steps so the ldmatrix of step s+1 overlaps the
    // mma of step s. With an even KS the buffer index is the step's parity (compile-time);
    // with an odd KS the parity would flip between k-tiles, so buffer 1 is copied back instead.
    constexpr bool kPingPong = KS % 2 == 0;
    unsigned fa[2][MT][4], fb[2][NT][2];

    cp_async_wait<STAGES - 2>();
    __syncthreads();
    load_frags(fa[0], fb[0], s0 + a_off[0], s0 + LayoutA::kBytes + b_off[0]);

    int rs = 0;           // stage being read
    int ws = STAGES - 1;  // stage the next tile goes to
    for (int kt = 0; kt < nkt; ++kt) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const int cur = kPingPong ? (ks & 1) : 0;
        const int nxt = kPingPong ? (cur ^ 1) : 1;
        if (ks == 0) {
          // Refill the stage read during k-tile kt-1: every thread finished its ldmatrix of it
          // before the barrier of the previous k-tile.
          if (kt + STAGES - 1 < nkt) {
            la.issue(s0 + ws * kStageBytes, k.begin + kt + STAGES - 1);
            lb.issue(s0 + ws * kStageBytes + LayoutA::kBytes, k.begin + kt + STAGES - 1);
          }
          cp_async_commit();
          ws = ws + 1 == STAGES ? 0 : ws + 1;
        }
        if (ks == KS - 1) {
          // Before reading the next k-tile: it must have landed (this thread's copies) and be
          // visible (everyone's), and all reads of this tile's stage must be done before anyone
          // refills it at the top of the next k-tile.
          cp_async_wait<STAGES - 2>();
          __syncthreads();
          rs = rs + 1 == STAGES ? 0 : rs + 1;
        }
        if (ks < KS - 1 || kt + 1 < nkt) {
          const int nks = ks + 1 == KS ? 0 : ks + 1;
          const unsigned st = s0 + rs * kStageBytes;
          load_frags(fa[nxt], fb[nxt], st + a_off[nks], st + LayoutA::kBytes + b_off[nks]);
        }
        round_frags(fa[cur], fb[cur]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            // Serpentine over n so consecutive mmas share an A fragment or a B fragment.
            const int n = (mt & 1) ? NT - 1 - nt : nt;
            mma_16x8<MATH>(acc[mt][n], fa[cur][mt], fb[cur][n]);
          }
        if constexpr (!kPingPong) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) fa[0][mt][i] = fa[1][mt][i];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i) fb[0][nt][i] = fb[1][nt][i];
        }
      }
    }

    // The tile may alias the ring: no copy may still be landing and no warp still reading.
    cp_async_wait<0>();
    __syncthreads();
    const int r0 = wm * WM + (lane >> 2);
    const int c0 = wn * WN + (lane & 3) * 2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float2 lo, hi;
        lo.x = acc[mt][nt][0];
        lo.y = acc[mt][nt][1];
        hi.x = acc[mt][nt][2];
        hi.y = acc[mt][nt][3];
        *reinterpret_cast<float2*>(&tile(r0 + mt * 16, c0 + nt * 8)) = lo;
        *reinterpret_cast<float2*>(&tile(r0 + mt * 16 + 8, c0 + nt * 8)) = hi;
      }
    __syncthreads();
  }
};

}  // namespace fj
