// Tensor-core GEMM mainloop of the tiled variant (sm_80+): a STAGES-deep cp.async ring of
// XOR-swizzled operand tiles in shared memory, ldmatrix into registers, mma.sync with fp32
// accumulators. One CTA computes acc(r, c) = sum_k A(m0 + r, k) B(n0 + c, k) for a BM x BN tile,
// each operand K-major or MN-major (mainloop/operands.cuh).
//
// fp16/bf16: mma.m16n8k16. A K-major operand is staged as it is stored, [row][k] (a SwizzledTile
// of BM rows of BK elements), and read with ldmatrix. An MN-major one is staged as it is stored
// too, [k][row] (a SwizzledTile of BK rows, the k's, of BM elements: 16-byte chunks along the
// output index), and read with ldmatrix.trans, which hands out the same fragments (the lane ->
// address mapping is spelled out at MnFrags below).
//
// tf32 (fp32 storage): mma.m16n8k8 on fp32 data. ldmatrix works on it unchanged because an 8x8
// matrix of 16-bit elements is an 8x4 matrix of 32-bit ones, and the lane -> (row, word) mapping
// it produces is the m16n8k8 tf32 fragment layout. ldmatrix.trans cannot transpose 32-bit
// elements, so an MN-major tf32 operand is turned around by its copy instead: 4-byte cp.async
// per element into the K-major stage (detail::ElementLoader), after which everything is the
// K-major path. The cost is in the copy only (4x the cp.async instructions, 32-byte global
// segments instead of 128-byte lines); the fragment loads, done once per warp that reads the
// stage, stay one ldmatrix.x4 per 16x8 tile.
//
// The fp32 values are rounded to tf32 as they leave ldmatrix (round to nearest, ties away: the
// cvt.rna / cuBLAS result, see to_tf32) unless the description sets
// `static constexpr bool TF32_ROUND = false;`, which feeds raw fp32 bits and lets the tensor core
// ignore the low mantissa bits (truncation: faster, but biased toward zero).
#pragma once
#include "common/cp_async.cuh"
#include "common/math_kind.cuh"
#include "common/mma.cuh"
#include "common/select.cuh"
#include "common/smem_layout.cuh"
#include "common/spec_flag.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "common/types.cuh"
#include "mainloop/operand_loader.cuh"
#include "mainloop/operands.cuh"

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

// G::TF32_ROUND if the description declares it, else true (round like cuBLAS does).
FJ_SPEC_FLAG(Tf32Round, TF32_ROUND, true);

// One operand of the mma mainloop: TILE output indices (BM for A, BN for B) x BK, of a matrix with
// NOUT output indices (0: the run's) and RED reductions (0: the run's), stride LD, K-major or
// MN-major. Picks the stage layout and the loader; kTrans says the fragments need ldmatrix.trans.
template <class T, int TILE, int BK, int NOUT, int RED, int LD, bool MN, int VEC, int THREADS>
struct MmaOperand {
  static constexpr int kEpc = 16 / int(sizeof(T));
  static constexpr bool kTrans = MN && sizeof(T) == 2;
  static constexpr bool kTurn = MN && sizeof(T) == 4;  // MN-major tf32: transposed by the copy
  // [TILE][BK] unless the fragments come from ldmatrix.trans, then [BK][TILE].
  using Layout =
      typename Select<kTrans, SwizzledTile<BK, TILE / kEpc>, SwizzledTile<TILE, BK / kEpc>>::type;
  using Loader = typename Select<
      !MN, ChunkLoader<T, Layout, TILE, BK, NOUT, RED, LD, VEC, THREADS, false>,
      typename Select<kTrans, ChunkLoader<T, Layout, BK, TILE, RED, NOUT, LD, VEC, THREADS, true>,
                      ElementLoader<SwizzledWords<Layout>, BK, TILE, RED, NOUT, LD, THREADS, 8,
                                    true>>::type>::type;
  static_assert(!kTurn || VEC >= 4, "tf32 operands must be at least 4-byte aligned");
  static_assert(!kTrans || (TILE == 8 || TILE == 16 || TILE == 32 || TILE == 64 || TILE == 128 ||
                            TILE == 256),
                "an MN-major fp16/bf16 operand is staged [BK][tile]: its tile (BM for A, BN for "
                "B) must be a power of two from 8 to 256");

  // Tile of k-tile 0 at output index o0; the matrix has nout x red valid elements.
  __device__ __forceinline__ static void init(Loader& l, const void* ptr, int o0, int tid, int nout,
                                              int red) {
    if constexpr (MN)
      l.init(ptr, 0, o0, tid, red, nout);
    else
      l.init(ptr, o0, 0, tid, nout, red);
  }
};

}  // namespace detail

template <class G>
struct TiledMmaMainloop {
  using T = typename G::T;
  static constexpr int MATH = G::MATH;
  static constexpr int BM = G::BM, BN = G::BN, BK = G::BK;
  static constexpr int WARPS_M = G::WARPS_M, WARPS_N = G::WARPS_N;
  static constexpr int STAGES = G::STAGES, THREADS = G::THREADS;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
  static constexpr int MT = WM / 16, NT = WN / 8;             // mma tiles per warp
  // k-tiles when the reduction length is a constant (0 when it is the run's: see k_tiles()).
  static constexpr int KT = G::RED > 0 ? (G::RED + BK - 1) / BK : 0;

  static_assert(MATH == kMathBf16 || MATH == kMathFp16 || MATH == kMathTf32 || MATH == kMathTf32x3,
                "TiledMmaMainloop: MATH must be kMathBf16, kMathFp16, kMathTf32 or kMathTf32x3 "
                "(strict fp32 uses SimtFp32Mainloop)");
  static_assert((MATH == kMathBf16 && detail::IsSame<T, bf16_t>::value) ||
                    (MATH == kMathFp16 && detail::IsSame<T, half_t>::value) ||
                    ((MATH == kMathTf32 || MATH == kMathTf32x3) && detail::IsSame<T, float>::value),
                "TiledMmaMainloop: T must be bf16_t for bf16, half_t for fp16, float for tf32 and "
                "tf32x3");
  static_assert(G::ROWS >= 0 && G::COLS >= 1 && G::RED >= 0,
                "the column count must be positive, rows and reduction positive or 0 (the run's)");
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

  using OpA = detail::MmaOperand<T, BM, BK, G::ROWS, G::RED, G::LDA, G::A_MN_MAJOR, G::A_VEC_BYTES,
                                 THREADS>;
  using OpB = detail::MmaOperand<T, BN, BK, G::COLS, G::RED, G::LDB, G::B_MN_MAJOR, G::B_VEC_BYTES,
                                 THREADS>;
  using LoaderA = typename OpA::Loader;
  using LoaderB = typename OpB::Loader;
  using LayoutA = typename OpA::Layout;
  using LayoutB = typename OpB::Layout;
  static constexpr int KS = BK * int(sizeof(T)) / 32;  // mma k-steps per k-tile (2 chunks each)
  static constexpr int kStageBytes = LayoutA::kBytes + LayoutB::kBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  static_assert(kSmemBytes <= 227 * 1024,
                "the cp.async ring needs more than 227 KB of shared memory: lower STAGES or BK");
  static constexpr bool kTf32Round = MATH == kMathTf32 && detail::Tf32Round<G>::value;
  static constexpr bool kSplit3 = MATH == kMathTf32x3;

  __device__ __forceinline__ static int k_tiles(const GemmOperands& op) {
    if constexpr (KT > 0)
      return KT;
    else
      return (gemm_red<G>(op) + BK - 1) / BK;
  }

  using FragA = unsigned[MT][4];
  using FragB = unsigned[NT][2];

  // This lane's ldmatrix addresses inside a stage, for an operand staged [row][k] (K-major, or
  // tf32 turned around by its copy). A (x4 per 16x16 tile): lanes 0-15 address rows 0-15 of the
  // step's first chunk, lanes 16-31 the same rows of its second chunk. B (x4 per two 8-row n
  // tiles): lane l addresses row 8 * (l / 16) + l % 8 of chunk (l / 8) % 2 (x2: lanes 0-15, one n
  // tile). Held per k-step; the per-tile offsets are multiples of 16 rows (8 for the odd x2),
  // which the swizzle maps to plain additions (see SwizzledTile).
  template <class Layout, bool IS_A>
  struct KFrags {
    int off[KS];
    __device__ __forceinline__ void init(int lane, int w) {
      const int r = IS_A ? w * WM + (lane & 15) : w * WN + ((lane >> 4) << 3) + (lane & 7);
      const int c = IS_A ? lane >> 4 : (lane >> 3) & 1;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) off[ks] = Layout::offset(r, 2 * ks + c);
    }
    // tile: 16-row tiles (A's mt, B's n pair), or 8-row ones for B's odd last tile (x2).
    __device__ __forceinline__ unsigned at(unsigned st, int ks, int tile16, int tile8) const {
      return st + off[ks] + tile16 * 16 * Layout::kRowBytes + tile8 * 8 * Layout::kRowBytes;
    }
  };

  // The same for an operand staged [k][row] (MN-major fp16/bf16), read with ldmatrix.trans. An
  // 8x8 matrix is then 8 k rows x 8 output indices (one 16-byte chunk of each k row), and .trans
  // gives lane l the elements (k = 2 (l % 4) + 0..1, index l / 4) of it: the fragment that
  // ldmatrix gives from the [index][k] matrix. So the lanes address the same 8x8 blocks as the
  // K-major path, with rows and chunks exchanged (g = l / 8: the matrix lanes 8g..8g+7 address):
  //   A, m16k16 tile (x4): matrix g -> a[g]: index rows 8 (g % 2) .. +7, k 8 (g / 2) .. +7;
  //      lane l addresses k row 8 (l / 16) + l % 8, chunk (index / 8) of the tile + (l / 8) % 2.
  //   B, two n8k16 tiles (x4): matrix g -> b[n tile g / 2][g % 2]: index rows 8 (g / 2) .. +7,
  //      k 8 (g % 2) .. +7; lane l addresses k row 8 ((l / 8) % 2) + l % 8, chunk + l / 16.
  //   B, one n8k16 tile (x2, odd NT): lanes 0-15 as above with l / 16 = 0.
  // Held per tile (the swizzle permutes chunks within a row, so a tile's chunk offset is not an
  // addition); the k-steps move 16 rows, a multiple of the swizzle's period: plain additions.
  template <class Layout, bool IS_A>
  struct MnFrags {
    static constexpr int kTiles = IS_A ? MT : (NT + 1) / 2;
    int off[kTiles];
    __device__ __forceinline__ void init(int lane, int w) {
      const int r = IS_A ? ((lane >> 4) << 3) + (lane & 7) : (((lane >> 3) & 1) << 3) + (lane & 7);
      const int c = IS_A ? (lane >> 3) & 1 : lane >> 4;
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        // A: 16-index tiles; B: pairs of 8-index tiles, or the odd last tile alone.
        const int first = (IS_A ? w * WM : w * WN) + t * 16;
        off[t] = Layout::offset(r, (first >> 3) + c);
      }
    }
    __device__ __forceinline__ unsigned at(unsigned st, int ks, int tile16, int tile8) const {
      // The odd last B tile (tile8 = NT - 1) is entry NT / 2 of off: its first index is
      // 16 * (NT / 2), and lanes 0-15, the only ones x2 reads, address its chunk.
      return st + off[tile16 + tile8 / 2] + ks * 16 * Layout::kRowBytes;
    }
  };

  using AddrA = typename Select<OpA::kTrans, MnFrags<LayoutA, true>, KFrags<LayoutA, true>>::type;
  using AddrB = typename Select<OpB::kTrans, MnFrags<LayoutB, false>, KFrags<LayoutB, false>>::type;

  template <bool TRANS>
  __device__ __forceinline__ static void ld_x4(unsigned (&r)[4], unsigned addr) {
    if constexpr (TRANS)
      ldmatrix_x4_trans(r, addr);
    else
      ldmatrix_x4(r, addr);
  }

  // Loads the A and B fragments of mma k-step ks from the stage at `st`.
  __device__ __forceinline__ static void load_frags(FragA& a, FragB& b, const AddrA& pa,
                                                    const AddrB& pb, unsigned st, int ks) {
    const unsigned sb = st + LayoutA::kBytes;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ld_x4<OpA::kTrans>(a[mt], pa.at(st, ks, mt, 0));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned r[4];
      ld_x4<OpB::kTrans>(r, pb.at(sb, ks, np, 0));
      b[2 * np][0] = r[0];
      b[2 * np][1] = r[1];
      b[2 * np + 1][0] = r[2];
      b[2 * np + 1][1] = r[3];
    }
    if constexpr (NT % 2 == 1) {
      if constexpr (OpB::kTrans)
        ldmatrix_x2_trans(b[NT - 1][0], b[NT - 1][1], pb.at(sb, ks, 0, NT - 1));
      else
        ldmatrix_x2(b[NT - 1][0], b[NT - 1][1], pb.at(sb, ks, 0, NT - 1));
    }
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

  // Multiplies k tiles [k.begin, k.end) (all k_tiles() of them, or one split-K share) of the
  // operands `op` for the output tile at (m0, n0).
  __device__ __forceinline__ static void run(const GemmOperands& op, char* smem, int m0, int n0,
                                             KRange k, AccTile<BM, BN> tile) {
    const int nkt = k.end - k.begin;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WARPS_N;
    const int wn = warp % WARPS_N;

    LoaderA la;
    LoaderB lb;
    OpA::init(la, op.a, m0, tid, gemm_rows<G>(op), gemm_red<G>(op));
    OpB::init(lb, op.b, n0, tid, G::COLS, gemm_red<G>(op));
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

    AddrA pa;
    AddrB pb;
    pa.init(lane, wm);
    pb.init(lane, wn);

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
    load_frags(fa[0], fb[0], pa, pb, s0, 0);

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
          load_frags(fa[nxt], fb[nxt], pa, pb, s0 + rs * kStageBytes, nks);
        }
        round_frags(fa[cur], fb[cur]);
        if constexpr (kSplit3) {
          // 3xTF32: the fragments become their big parts, sa / sb hold the small ones; the
          // small products go first so they are not lost against a large running sum.
          unsigned sa[MT][4], sb[NT][2];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) split_tf32(fa[cur][mt][i], fa[cur][mt][i], sa[mt][i]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i) split_tf32(fb[cur][nt][i], fb[cur][nt][i], sb[nt][i]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const int n = (mt & 1) ? NT - 1 - nt : nt;
              // The step's three products are summed apart, from zero, and added to the running
              // sum in fp32: the mma's own accumulation keeps fewer bits than an fp32 add, and with
              // the whole K summed in it this kernel missed strict fp32's 2e-5 tolerance at
              // K = 4096 and 8192 (2.4e-5 to 5.0e-5, H200; docs/performance.md, "3xTF32"), as the
              // warpspec kernel did before it summed per slice. Four registers, not a second tile.
              float step[4] = {0.f, 0.f, 0.f, 0.f};
              mma_16x8<MATH>(step, sa[mt], fb[cur][n]);
              mma_16x8<MATH>(step, fa[cur][mt], sb[n]);
              mma_16x8<MATH>(step, fa[cur][mt], fb[cur][n]);
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][n][i] += step[i];
            }
        } else {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              // Serpentine over n so consecutive mmas share an A fragment or a B fragment.
              const int n = (mt & 1) ? NT - 1 - nt : nt;
              mma_16x8<MATH>(acc[mt][n], fa[cur][mt], fb[cur][n]);
            }
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
