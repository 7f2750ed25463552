// The gradient GEMMs on Hopper tensor cores (sm_90a, bf16/fp16/tf32): GradGemm's contract
// (kernels/grad_gemm.cuh: C [ROWS][LDC] = or += sum over RED of A(r, k) B(c, k), fp32
// accumulation, ROWS or RED = 0 meaning the run's GemmParams::m) on the forward warpspec
// variant's pipeline: one producer thread streams A and B k-slices into a STAGES-deep ring with
// TMA (128-byte swizzle), CONSUMERS warpgroups multiply them with wgmma straight from shared
// memory. Why a second kernel rather than WarpspecGemm: its operands are both K-major and its
// epilogue is the BatchNorm's; here each operand may be MN-major and the epilogue is a store.
//
// MN-major operands (dX's W, dW's dA^T and x: their reduction index is the row of a row-major
// matrix) are what wgmma's transpose bits read for 16-bit inputs, so neither GEMM needs a
// transposed copy of rows TMA can load: TMA copies boxes of 64 MN-elements (one 128-byte swizzle
// row) by BK K-rows, and the descriptor says where the next 64 MN-elements (the leading offset)
// and the next 8 K-rows (the stride offset) lie (mainloop/wgmma.cuh). tf32 has no transpose
// bits: its GEMMs read K-major copies the plan makes first (W^T, dA^T, x^T:
// kernels/transpose.cuh), so both of its operands are K-major here; 16-bit layers whose rows TMA
// cannot load read K-major copies of W and x the same way, and dA (whose rows fj_bwd_da and
// fj_bwd_resident pad) in place.
//
// The epilogue, two ways. Thread stores: each thread's accumulator pairs straight from
// registers (the wgmma fragment: 2 adjacent columns per row). TMA_STORE: each warp writes its
// rows of the tile, rounded, through its two boxes in shared memory to TMA stores
// (epilogue/warp_box_store.cuh, the forward's y stores) and goes straight on to its next tile's
// mainloop while the copy engine writes them out: with a short reduction (dW's is the batch)
// the stores are a large part of a tile's time. The boxes take 2 KiB a warp where a whole
// staged tile took bm x bn x 2 bytes, which cost 128x256 tiles their 4th ring stage.
// Accumulating runs (C += A B) take the thread stores either way, since they read C first. With
// PERSISTENT the producer keeps loading the next tile meanwhile in both cases. SPLIT_K > 1 (no
// TMA_STORE): blockIdx.y is the split, each multiplies its share of the reduction
// (common/split_k.h) and stores fp32 pairs into its slice of GemmParams::partials;
// kernels/grad_split_sum.cuh adds the slices into C.
//
// Host launch contract: grid.x = PERSISTENT ? min(tiles, max(1, SMs / SPLIT_K)) : tiles with
// tiles = ceil(rows / BM) * ceil(COLS / BN), grid.y = SPLIT_K; block.x = THREADS = 128 * (CONSUMERS
// + 1); dynamic shared memory kSmemBytes; tensor maps `ta`, `tb` (plan/backward_core.cpp; of the
// workspace's K-major copies where the GEMM reads them): a K-major operand [rows][red] in boxes of
// (its tile rows) x 128 bytes, an MN-major one [red][rows] in boxes of BK x 128 bytes, elements
// past the matrix read as zero; with TMA_STORE `tc`, C [rows][COLS] in WarpBoxStore's boxes (16
// rows x 64 bytes, 64-byte swizzle; unused otherwise).
#pragma once
#include "common/gemm_params.h"
#include "common/grid_dependency.cuh"
#include "common/limits.h"
#include "common/select.cuh"
#include "common/split_k.h"
#include "common/tile.cuh"
#include "common/tma_descriptor.cuh"
#include "common/types.cuh"
#include "epilogue/warp_box_store.cuh"
#include "kernels/tile_scheduler.cuh"
#include "mainloop/mbarrier.cuh"
#include "mainloop/tma.cuh"
#include "mainloop/wgmma.cuh"

namespace fj {

// One operand's tile of ROWS_ (the tile's M or N extent) x BK in a ring stage, as TMA writes it
// and wgmma reads it. K-major: BK / kAtom slabs of [ROWS_][128 bytes]; MN-major: ROWS_ / kAtom
// slabs of [BK][128 bytes] (kAtom: the elements of a 128-byte row). Either way a slab is a whole
// number of 1024-byte swizzle atoms.
template <class T, bool MN_MAJOR, int ROWS_, int BK>
struct WgmmaOperandTile {
  static constexpr int kAtom = 128 / static_cast<int>(sizeof(T));  // elements of a swizzle row
  static_assert(ROWS_ % 64 == 0 && BK % kAtom == 0,
                "operand tiles are whole blocks of 64 rows x 128 bytes");
  static constexpr int kSlabs = MN_MAJOR ? ROWS_ / kAtom : BK / kAtom;
  static constexpr int kSlabBytes = (MN_MAJOR ? BK : ROWS_) * 128;
  static constexpr int kBytes = kSlabs * kSlabBytes;
  static constexpr int kBoxRows = MN_MAJOR ? BK : ROWS_;  // the tensor map's box (x kAtom)

  // Descriptor of rows [64 * block, ...) of the tile at reduction offset kk (a multiple of the
  // instruction's k: 16, or 8 for tf32): the block and kk are plain address offsets in either
  // layout.
  __device__ __forceinline__ static unsigned long long desc(unsigned tile, int block, int kk) {
    if constexpr (MN_MAJOR)
      return wgmma_desc_sw128_mn<BK>(tile + block * kSlabBytes + kk * 128);
    else
      return wgmma_desc_sw128(tile + (kk / kAtom) * kSlabBytes + block * 64 * 128 +
                              (kk % kAtom) * static_cast<int>(sizeof(T)));
  }
  // The TMA copies of the tile for rows r0.. and reduction k0.. (the map's innermost coordinate
  // is the contiguous one: the reduction for K-major, the rows for MN-major).
  __device__ __forceinline__ static void load(unsigned tile, const TmaDescriptor* map, unsigned bar,
                                              int r0, int k0) {
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) {
      if constexpr (MN_MAJOR)
        tma_load_2d(tile + s * kSlabBytes, map, bar, r0 + s * kAtom, k0);
      else
        tma_load_2d(tile + s * kSlabBytes, map, bar, k0 + s * kAtom, r0);
    }
  }
};

template <class G>
struct GradWgmma {
  using T = typename G::T;
  static constexpr int BM = G::BM, BN = G::BN, BK = G::BK, STAGES = G::STAGES;
  static constexpr int CONSUMERS = G::CONSUMERS, COLS = G::COLS, LDC = G::LDC;
  static_assert(sizeof(T) == 2 || (sizeof(T) == 4 && !G::A_MN_MAJOR && !G::B_MN_MAJOR),
                "grad wgmma: 16-bit inputs, or tf32 with both operands K-major (no transposed "
                "tf32 wgmma)");
  static constexpr int kMmaK = 32 / static_cast<int>(sizeof(T));  // k16, or k8 for tf32
  static_assert(G::THREADS == 128 * (CONSUMERS + 1), "THREADS must be 128 * (CONSUMERS + 1)");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "grad wgmma: 1 or 2 consumer warpgroups");
  static_assert(G::ROWS >= 0 && G::ROWS <= kMaxDim && G::COLS >= 1 && G::COLS <= kMaxDim &&
                    G::RED >= 0 && G::RED <= kMaxDim,
                "ROWS, COLS and RED must be at most kMaxDim (common/limits.h), COLS positive");
  static_assert(
      LDC >= COLS && (LDC % 2 == 0 || G::VEC_BYTES < 2 * static_cast<int>(sizeof(T))),
      "LDC must cover COLS, and keep column pairs aligned where they are stored as pairs");
  static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256, "grad wgmma: BN in {64..256}");
  static_assert(BK <= 256, "grad wgmma: a TMA box has at most 256 rows");
  static constexpr int kWgM = BM / CONSUMERS;  // rows of a tile one consumer owns
  static constexpr int kMAtoms = kWgM / 64;
  static_assert(kWgM % 64 == 0 && (kMAtoms == 1 || kMAtoms == 2),
                "grad wgmma: each consumer owns 64 or 128 rows of a tile");

  using TileA = WgmmaOperandTile<T, G::A_MN_MAJOR, BM, BK>;
  using TileB = WgmmaOperandTile<T, G::B_MN_MAJOR, BN, BK>;
  using Mma = Wgmma<T, BN, G::A_MN_MAJOR ? 1 : 0, G::B_MN_MAJOR ? 1 : 0>;
  static constexpr int kColTiles = (COLS + BN - 1) / BN;
  using Raster = GroupedRaster<kColTiles, G::GROUP_M>;
  static constexpr bool kTmaStore = G::TMA_STORE;
  using Boxes = WarpBoxStore<T, BN, kMAtoms>;
  static constexpr int kSplits = G::SPLIT_K;
  static_assert(kSplits >= 1 && !(kSplits > 1 && kTmaStore),
                "grad wgmma: SPLIT_K >= 1; split slices are fp32 thread stores, no TMA_STORE");

  // ---- Shared memory: SharedStorage is the layout. ----
  struct Stage {
    alignas(1024) unsigned char a[TileA::kBytes];
    alignas(1024) unsigned char b[TileB::kBytes];
  };
  // TMA_STORE: each consumer warp's two boxes.
  struct OutBoxes {
    alignas(Boxes::kAlign) unsigned char warp[4 * CONSUMERS][Boxes::kWarpBytes];
  };
  struct NoBoxes {};
  struct SharedStorage {
    Stage ring[STAGES];
    MbarrierSlot full[STAGES];   // the stage's TMA bytes have landed
    MbarrierSlot empty[STAGES];  // every consumer warp's wgmma that read it completed
    typename Select<kTmaStore, OutBoxes, NoBoxes>::type out;
  };
  static constexpr unsigned kAlign = alignof(SharedStorage);
  static_assert(kAlign == 1024, "the ring sets the storage's alignment");
  // The dynamic shared memory base is only 16-byte aligned for sure: run() rounds it up.
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage) + kAlign);
  static_assert(kSmemBytes <= 232448, "grad wgmma: stages exceed 227 KB of shared memory");
  // The host prunes configs and launches with its own count (grad_wgmma_smem_bytes).
  static_assert(G::SMEM_BYTES == kSmemBytes,
                "grad wgmma: Spec::SMEM_BYTES (grad_wgmma_smem_bytes) disagrees with the layout");
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert(CONSUMERS == 1 ||
                    register_budgets_fit(G::THREADS, kProducerRegs, kConsumerRegs, CONSUMERS),
                "grad wgmma: the warpgroups' register budgets exceed the CTA's");

  __device__ static void run(const GemmParams& p, const TmaDescriptor& ta, const TmaDescriptor& tb,
                             const TmaDescriptor& tc) {
    extern __shared__ __align__(1024) unsigned char fj_grad_wgmma_smem[];
    const unsigned raw = shared_addr(fj_grad_wgmma_smem);
    const unsigned base = (raw + kAlign - 1u) & ~(kAlign - 1u);
    const Ctx c{base, p.m};
    if (threadIdx.x == 0) {
      tma_prefetch(&ta);
      tma_prefetch(&tb);
      if constexpr (kTmaStore) tma_prefetch(&tc);
      for (int i = 0; i < STAGES; ++i) {
        c.full[i].init(1);
        c.empty[i].init(4 * CONSUMERS);
      }
      mbar_fence_init();
    }
    __syncthreads();
    // The barriers' set-up and the maps' prefetch above overlap the previous kernel's end.
    if (!p.beside_prior) join_launch_chain();
    if (threadIdx.x < 128) {
      if constexpr (CONSUMERS == 2) regs_release<kProducerRegs>();
      if (threadIdx.x == 0) produce(ta, tb, c);
    } else {
      if constexpr (CONSUMERS == 2) regs_acquire<kConsumerRegs>();
      consume(p, c, threadIdx.x - 128, &tc);
    }
    if (p.beside_prior) join_launch_chain();  // at its exit: see beside_prior
  }

 private:
  struct Ctx {
    unsigned base;
    int m;
    __device__ __forceinline__ Ctx(unsigned shared_base, int run_rows)
        : base(shared_base),
          m(run_rows),
          full{shared_base + FJ_OFFSETOF(SharedStorage, full)},
          empty{shared_base + FJ_OFFSETOF(SharedStorage, empty)} {}
    MbarrierArray<STAGES> full, empty;
    __device__ __forceinline__ int rows() const { return G::ROWS > 0 ? G::ROWS : m; }
    // This CTA's k tiles: all of them, or its split's share (empty where a run's reduction has
    // fewer k tiles than splits: the split then stores zeros, which the sum needs).
    __device__ __forceinline__ KRange k_range() const {
      const int k_tiles = ((G::RED > 0 ? G::RED : m) + BK - 1) / BK;
      return kSplits == 1 ? KRange{0, k_tiles}
                          : split_k_range(k_tiles, kSplits, static_cast<int>(blockIdx.y));
    }
    __device__ __forceinline__ Raster raster() const { return Raster{(rows() + BM - 1) / BM}; }
    __device__ __forceinline__ unsigned a(unsigned i) const {
      return base + FJ_OFFSETOF(SharedStorage, ring) + i * unsigned(sizeof(Stage)) +
             FJ_OFFSETOF(Stage, a);
    }
    // TMA_STORE: consumer warp w's boxes.
    __device__ __forceinline__ unsigned out(int w) const {
      return base + FJ_OFFSETOF(SharedStorage, out) + static_cast<unsigned>(w * Boxes::kWarpBytes);
    }
    __device__ __forceinline__ unsigned b(unsigned i) const {
      return base + FJ_OFFSETOF(SharedStorage, ring) + i * unsigned(sizeof(Stage)) +
             FJ_OFFSETOF(Stage, b);
    }
  };
  __device__ __forceinline__ static int tile_stride(const Ctx& c) {
    return G::PERSISTENT ? static_cast<int>(gridDim.x) : c.raster().tiles();
  }

  __device__ __forceinline__ static void produce(const TmaDescriptor& ta, const TmaDescriptor& tb,
                                                 const Ctx& c) {
    PipelineState<STAGES> pipe;
    const Raster raster = c.raster();
    const KRange k = c.k_range();
    for (int t = blockIdx.x; t < raster.tiles(); t += tile_stride(c)) {
      const auto tile = raster.tile(t);
      for (int kt = k.begin; kt < k.end; ++kt) {
        const Mbarrier full = c.full[pipe.index];
        c.empty[pipe.index].wait(pipe.phase ^ 1u);
        full.arrive_expect_tx(static_cast<unsigned>(TileA::kBytes + TileB::kBytes));
        TileA::load(c.a(pipe.index), &ta, full.addr, tile.row * BM, kt * BK);
        TileB::load(c.b(pipe.index), &tb, full.addr, tile.col * BN, kt * BK);
        pipe.advance();
      }
    }
  }

  using Acc = float[kMAtoms][BN / 2];

  __device__ __forceinline__ static void consume(const GemmParams& p, const Ctx& c, int ctid,
                                                 const TmaDescriptor* tc) {
    const int a_block0 = (ctid / 128) * kMAtoms;  // this group's first 64-row block of A
    const int lane = ctid % 32;
    const Raster raster = c.raster();
    const KRange k = c.k_range();
    const int k_tiles = k.end - k.begin;
    PipelineCounter<STAGES> slice;
    Acc acc;
    for (int t = blockIdx.x; t < raster.tiles(); t += tile_stride(c)) {
      const auto tile = raster.tile(t);
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[ma][i] = 0.f;  // a run with no reduction stores 0
        wgmma_fence_operands(acc[ma]);
      }
      for (int kt = 0; kt < k_tiles; ++kt, slice.advance()) {
        const unsigned i = slice.index();
        c.full[i].wait(slice.phase());
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK; kk += kMmaK)
#pragma unroll
          for (int ma = 0; ma < kMAtoms; ++ma)
            Mma::mma(acc[ma], TileA::desc(c.a(i), a_block0 + ma, kk), TileB::desc(c.b(i), 0, kk),
                     (kt | kk) != 0 ? 1 : 0);
        wgmma_commit();
        if (kt > 0) {
          // The slice before this one is done: hand its stage back to the producer.
          wgmma_wait<1>();
          if (lane == 0) c.empty[slice.previous_index()].arrive();
        }
      }
      if (k_tiles > 0) {
        wgmma_wait<0>();
        if (lane == 0) c.empty[slice.previous_index()].arrive();
      }
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) wgmma_fence_operands(acc[ma]);
      const int m0 = tile.row * BM + a_block0 * 64, n0 = tile.col * BN;
      if constexpr (kSplits > 1)
        store_slice(p, acc, m0, n0, c.rows(), ctid % 128);
      else if (kTmaStore && p.accumulate == 0)
        store_tma(acc, c, tc, m0, n0, ctid);
      else
        store(p, acc, m0, n0, c.rows(), ctid % 128);
    }
    if constexpr (kTmaStore) Boxes::drain(lane);
  }

  // TMA_STORE: the warp's rows of the tile, rounded, through its boxes (rows past the run's and
  // columns past COLS are clipped by the tensor map's bounds).
  __device__ __forceinline__ static void store_tma(const Acc& acc, const Ctx& c,
                                                   const TmaDescriptor* tc, int m0, int n0,
                                                   int ctid) {
    const int warp = ctid / 32;
    Boxes::store(c.out(warp), ctid % 32, m0 + 16 * (warp % 4), n0, tc, [&](int ma, int j, int h) {
      return Boxes::pair(acc[ma][4 * j + 2 * h], acc[ma][4 * j + 2 * h + 1]);
    });
  }

  // The wgmma fragment (PTX's m64nNk16 D layout): warp w of the group holds rows 16 w + lane / 4
  // and + 8, columns 8 j + 2 (lane % 4) and + 1, as acc[4 j + 2 h + {0, 1}] for row + 8 h.
  // f(row, col, v0, v1) for each of this thread's pairs with row < rows and col < COLS (col + 1
  // may be COLS when COLS is odd).
  template <class F>
  __device__ __forceinline__ static void for_each_pair(const Acc& acc, int m0, int n0, int rows,
                                                       int wtid, F&& f) {
    const int r0 = m0 + 16 * (wtid / 32) + (wtid % 32) / 4;
    const int c0 = n0 + 2 * (wtid % 4);
#pragma unroll
    for (int ma = 0; ma < kMAtoms; ++ma)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 64 * ma + 8 * h;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = c0 + 8 * j;
          if (col < COLS) f(r, col, acc[ma][4 * j + 2 * h], acc[ma][4 * j + 2 * h + 1]);
        }
      }
  }

  // SPLIT_K: the fragment's fp32 pairs into this split's slice (a pair starting inside COLS ends
  // inside the slice's row, whose stride is a multiple of 8).
  __device__ __forceinline__ static void store_slice(const GemmParams& p, const Acc& acc, int m0,
                                                     int n0, int rows, int wtid) {
    constexpr int kLd = split_slice_ld(COLS);
    float* const slice =
        p.partials + static_cast<long long>(blockIdx.y) * rows * static_cast<long long>(kLd);
    for_each_pair(acc, m0, n0, rows, wtid, [&](int r, int col, float v0, float v1) {
      *reinterpret_cast<float2*>(slice + static_cast<long long>(r) * kLd + col) =
          make_float2(v0, v1);
    });
  }

  // C = (or +=) the fragment, a pair of T per store (one element at an odd COLS's end), or each
  // element alone where C's rows are aligned to one element only (VEC_BYTES: an odd LDC in a
  // 16-bit type, or tf32 rows of 4 bytes; such GEMMs read their operands from padded copies).
  __device__ __forceinline__ static void store(const GemmParams& p, const Acc& acc, int m0, int n0,
                                               int rows, int wtid) {
    T* const out = static_cast<T*>(p.c);
    const bool accumulate = p.accumulate != 0;
    for_each_pair(acc, m0, n0, rows, wtid, [&](int r, int col, float v0, float v1) {
      T* const dst = out + static_cast<long long>(r) * LDC + col;
      if constexpr (G::VEC_BYTES < 2 * static_cast<int>(sizeof(T))) {
        dst[0] = from_float<T>(v0 + (accumulate ? to_float(dst[0]) : 0.f));
        if (col + 1 < COLS) dst[1] = from_float<T>(v1 + (accumulate ? to_float(dst[1]) : 0.f));
      } else if constexpr (sizeof(T) == 4) {
        if (COLS % 2 == 0 || col + 1 < COLS) {
          float2 v = make_float2(v0, v1);
          if (accumulate) {
            const float2 old = *reinterpret_cast<const float2*>(dst);
            v.x += old.x;
            v.y += old.y;
          }
          *reinterpret_cast<float2*>(dst) = v;
        } else {
          dst[0] = v0 + (accumulate ? dst[0] : 0.f);
        }
      } else if (COLS % 2 == 0 || col + 1 < COLS) {
        if (accumulate) {
          const float2 old = unpack2<T>(*reinterpret_cast<const unsigned*>(dst));
          v0 += old.x;
          v1 += old.y;
        }
        *reinterpret_cast<unsigned*>(dst) = pack2<T>(v0, v1);
      } else {
        dst[0] = from_float<T>(v0 + (accumulate ? to_float(dst[0]) : 0.f));
      }
    });
  }
};

}  // namespace fj
