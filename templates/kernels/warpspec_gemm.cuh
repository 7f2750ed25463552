// The warpspec variant (sm_90a): a warp-specialized GEMM with the fused BatchNorm epilogue.
//
//   warpgroup 0      producer: one thread streams x and W k-slices into a STAGES-deep ring of
//                    shared-memory stages with TMA (128-byte swizzle), one `full` mbarrier per
//                    stage counting the bytes in; it waits on the stage's `empty` mbarrier
//                    before overwriting it.
//   warpgroups 1..C  consumers: each owns BM / C rows of the tile and issues wgmma.mma_async
//                    (A and B straight from shared memory through matrix descriptors), keeping
//                    one k-slice of wgmma in flight; a stage is released (every consumer warp
//                    arrives on `empty`) as soon as the wgmma that read it have completed. Then
//                    they run the BN epilogue on their accumulators.
//   3xTF32 (tf32x3)  warps 2-3 of warpgroup 0 write W's small parts beside each landed stage and
//                    arrive on the stage's third mbarrier, `split`; the consumers take x from
//                    the stage into registers, split it there and issue wgmma with A from
//                    registers (split3_mainloop, split_ring).
//   overlap_apply    warps 1-3 of warpgroup 0 count the CTA's stored tiles and run the grid-wide
//   (OVERLAP_APPLY)  queue of BatchNorm merge strips and apply units; the consumers join it
//                    after their last tile (kernels/overlap_apply.cuh).
//
// Operands are K-major on both sides (x [M][K], W [N][K]: the nn.Linear layout), which is what
// wgmma wants without transposes, including tf32. TMA zero-fills boxes past M, N and K, so the
// mainloop has no tail code; the epilogues predicate rows and columns.
//
// Options: PERSISTENT (CTAs loop over tiles; the producer runs ahead into the next tile while
// the consumers run the epilogue), CLUSTER_M = 2 (two CTAs on vertically adjacent row tiles
// share each W slice: each loads half and multicasts it to both), and three optional Spec
// fields: FRAGMENT_EPILOGUE (default true: FragmentBnEpilogue from registers; false: the
// shared BnEpilogue over an fp32 AccTile in shared memory), PINGPONG (default false;
// persistent, two consumers, fragment epilogue): instead of splitting each tile's rows, the
// two consumer warpgroups take alternate tiles of BM x BN whole, so one group's epilogue runs
// while the other keeps the tensor cores busy with the next tile, and TMA_STORE (default
// false; fragment epilogue, not pingpong): y leaves through per-warp 1 KiB boxes and TMA
// stores (the kernel's third tensor map, `ty`: y in boxes of 16 rows x 64 bytes, 64-byte
// swizzle; unused otherwise), and SMEM_BYTES (the host's shared-memory count, checked against
// the layout below when given).
//
// Shared memory is one struct, SharedStorage (its sizeof is the layout): the stage ring, the
// barriers, the epilogue's scratch and eval's coefficient buffers. Each role (produce,
// coefficients, consume) gets a Ctx: the storage, its 32-bit shared-window address, the
// barriers as typed arrays, and the cluster rank. The producer tracks the ring with a
// PipelineState, the consumers with a PipelineCounter (mainloop/mbarrier.cuh).
//
// Host launch contract (WarpspecGemm<Spec>::grid_size; M is the run's rows, common/rows.cuh):
//   row_tiles = ceil(M / BM), col_tiles = ceil(N / BN),
//   cluster_tiles = ceil(row_tiles / CLUSTER_M) * col_tiles,
//   grid.x = CLUSTER_M * (PERSISTENT ? min(cluster_tiles, sm_count / CLUSTER_M) : cluster_tiles),
//   block.x = THREADS, dynamic shared memory = kSmemBytes, cluster (CLUSTER_M, 1, 1) when > 1.
// With CLUSTER_M = 1 that is the plain "one CTA per tile" (or min(tiles, sm_count)) grid.
#pragma once
#include "common/grid_dependency.cuh"
#include "common/limits.h"
#include "common/math_kind.cuh"
#include "common/mma.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/select.cuh"
#include "common/spec_flag.cuh"
#include "common/tile.cuh"
#include "common/tma_descriptor.cuh"
#include "common/types.cuh"
#include "epilogue/bn_epilogue.cuh"
#include "epilogue/fragment_bn_epilogue.cuh"
#include "kernels/overlap_apply.cuh"
#include "kernels/tile_scheduler.cuh"
#include "mainloop/mbarrier.cuh"
#include "mainloop/tma.cuh"
#include "mainloop/wgmma.cuh"

namespace fj {

// Spec::FRAGMENT_EPILOGUE (default true), PINGPONG and TMA_STORE (default false).
FJ_SPEC_FLAG(WarpspecFragmentEpilogue, FRAGMENT_EPILOGUE, true);
FJ_SPEC_FLAG(WarpspecPingpong, PINGPONG, false);
FJ_SPEC_FLAG(WarpspecTmaStore, TMA_STORE, false);
// Spec::SMEM_BYTES: the host's shared-memory byte count, checked against the layout (-1: none).
FJ_SPEC_INT(WarpspecHostSmemBytes, SMEM_BYTES, -1);

template <class Spec>
struct WarpspecGemm {
  using T = typename Spec::T;
  static constexpr int BM = Spec::BM, BN = Spec::BN, BK = Spec::BK;
  static constexpr int STAGES = Spec::STAGES;
  static constexpr int CONSUMERS = Spec::CONSUMERS;
  static constexpr int CLUSTER = Spec::CLUSTER_M;
  static constexpr int NT = 128 * CONSUMERS;  // consumer threads

  static_assert(Spec::THREADS == 128 * (CONSUMERS + 1), "THREADS must be 128 * (CONSUMERS + 1)");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "warpspec: 1 or 2 consumer warpgroups");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "warpspec: CLUSTER_M must be 1 or 2");
  static_assert(Spec::MATH != kMathSimtFp32, "warpspec runs on tensor cores (tf32, fp16, bf16)");
  static_assert((Spec::MATH == kMathTf32 || Spec::MATH == kMathTf32x3) == (sizeof(T) == 4),
                "warpspec: tf32 and tf32x3 iff T is float");
  // 3xTF32: each operand is split into big and small parts (W's small parts in shared memory by
  // the splitter warps, split_ring; x in registers by the consumers, split3_mainloop); the
  // consumers issue three wgmma per k-step where tf32 issues one, and add each slice's products
  // to the tile's sums in fp32 themselves.
  static constexpr bool kSplit3 = Spec::MATH == kMathTf32x3;
  // tf32: the copy engine rounds x and W as it loads them (the host's TFLOAT32 tensor maps:
  // to nearest, ties to even); fj_input_stats takes them as these products do.
  static constexpr Tf32Rounding kTf32Rounding = Tf32Rounding::nearest_even;
  // x and W come through TMA (16-byte aligned rows: the host's tensor maps check, and
  // KernelConfig::pad_operands copies rows that are not); VEC_BYTES is y's and saved's store
  // width, which TMA stores need whole.
  static_assert(Spec::VEC_BYTES == 16 || !WarpspecTmaStore<Spec>::value,
                "warpspec: TMA stores need 16-byte aligned rows of y");
  static_assert(Spec::K >= 1, "warpspec: K must be positive");
  // Tile counts are (D + T - 1) / T in int (Problem::validate, KernelConfig::why_invalid).
  static_assert(Spec::M >= 0 && Spec::M <= kMaxDim && Spec::N <= kMaxDim && Spec::K <= kMaxDim,
                "warpspec: M, N and K must be at most kMaxDim (common/limits.h)");
  static_assert(BM <= kMaxTileExtent && BN <= kMaxTileExtent && BK <= kMaxTileExtent,
                "warpspec: BM, BN and BK must be at most kMaxTileExtent (common/limits.h)");

  static constexpr int kElem = static_cast<int>(sizeof(T));
  // One 128-byte swizzled row holds kAtomK elements of K; a stage holds BK / kAtomK such
  // slabs per operand, each [rows][128 bytes].
  static constexpr int kAtomK = 128 / kElem;
  static constexpr int kKAtoms = BK / kAtomK;
  static_assert(BK % kAtomK == 0, "warpspec: BK * sizeof(T) must be a multiple of 128 bytes");
  static constexpr int kMmaK = 32 / kElem;  // k16 for 16-bit inputs, k8 for tf32
  static constexpr int kKSteps = kAtomK / kMmaK;
  static constexpr bool kFragment = WarpspecFragmentEpilogue<Spec>::value;
  static constexpr bool kPingpong = WarpspecPingpong<Spec>::value;
  static_assert(!kPingpong || (CONSUMERS == 2 && Spec::PERSISTENT && kFragment),
                "warpspec: PINGPONG needs two consumers, PERSISTENT and the fragment epilogue");
  static constexpr bool kTmaStore = WarpspecTmaStore<Spec>::value;
  static_assert(!kTmaStore || (kFragment && !kPingpong),
                "warpspec: TMA_STORE needs the fragment epilogue and no PINGPONG");
  // Warpgroups that share one tile (and the epilogue team size in warpgroups).
  static constexpr int kTeam = kPingpong ? 1 : CONSUMERS;
  static constexpr int kWgM = BM / kTeam;
  static constexpr int kMAtoms = kWgM / 64;
  static_assert(kWgM % 64 == 0 && (kMAtoms == 1 || kMAtoms == 2),
                "warpspec: each consumer owns 64 or 128 rows of a tile");
  // A consumer thread holds the tile's sums, a slice's partial sum and two slices' x fragments:
  // 64 + 64 + 2 x 32 registers at 64 rows, BN = 128 and BK = 32; more rows, columns or depth would
  // not fit the 232 a consumer gets (KernelConfig::why_invalid says the same to the host).
  static_assert(!kSplit3 || (kMAtoms == 1 && BN <= 128 && BK == 32),
                "warpspec tf32x3: each consumer owns 64 rows, BN <= 128 and BK = 32");
  static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256,
                "warpspec: BN in {64,128,192,256}");
  static_assert(BM <= 256, "warpspec: a TMA box has at most 256 rows");
  static_assert(BN % (8 * CLUSTER) == 0,
                "warpspec: the multicast W half must be whole 8-row groups");
  // A resident run's CTAs each own one tile per round and meet at a grid barrier each round: no
  // cluster (a CTA past M would skip the epilogue that arrives), no pingpong (tiles alternate
  // between groups), and only the fragment epilogue finishes resident.
  static_assert(!GridSync<Spec>::value ||
                    (StatsOnly<Spec>::value && CLUSTER == 1 && !WarpspecPingpong<Spec>::value &&
                     WarpspecFragmentEpilogue<Spec>::value),
                "warpspec: GRID_SYNC needs STATS_ONLY, CLUSTER_M = 1, no PINGPONG and the "
                "fragment epilogue");

  // Train, two-pass: the BatchNorm apply inside this kernel (kernels/overlap_apply.cuh): the
  // producer warpgroup's warps 1-3 merge and apply finished column panels; the consumers count
  // their stored tiles and join the queue after their last tile.
  static constexpr bool kOverlap = OverlapApply<Spec>::value;
  static_assert(!kOverlap || (Spec::PERSISTENT && Spec::TRAIN && !Spec::SINGLE_PASS &&
                              CLUSTER == 1 && !kPingpong && kFragment && !kSplit3 &&
                              !StatsOnly<Spec>::value && !GridSync<Spec>::value),
                "warpspec: OVERLAP_APPLY needs PERSISTENT two-pass train, CLUSTER_M = 1, no "
                "PINGPONG, the fragment epilogue, no tf32x3 (its splitters are warps 2-3), no "
                "STATS_ONLY or GRID_SYNC");
  using Overlap = OverlapApplyOps<Spec>;

  static constexpr int kASlab = BM * 128;  // bytes of one K slab of the x tile
  static constexpr int kBSlab = BN * 128;
  static constexpr int kKTiles = (Spec::K + BK - 1) / BK;
  // overlap_apply with TMA stores: the k-slice of a tile's mainloop at which the previous tile's
  // stores are counted (a few slices after they were issued, so they have landed).
  static constexpr int kCountAtSlice = kKTiles > 4 ? 4 : kKTiles - 1;
  static constexpr int kWBoxRows = BN / CLUSTER;  // rows of W one CTA's TMA box covers

  static constexpr int kColTiles = (Spec::N + BN - 1) / BN;
  static constexpr int kGroupM = Spec::GROUP_M / CLUSTER > 0 ? Spec::GROUP_M / CLUSTER : 1;
  // Over cluster rows (ceil(row_tiles / CLUSTER)): the run's M sets their count. The host
  // checks that twice the cluster tiles fit int for the largest M (KernelConfig::why_invalid),
  // so the grid and the tile loops' last `ct += tile_stride` stay in range.
  // overlap_apply: GROUP_M counts column tiles per group of the transposed raster.
  using Raster = typename Select<kOverlap, PanelRaster<kColTiles, Spec::GROUP_M>,
                                 GroupedRaster<kColTiles, kGroupM>>::type;

  // Team g's fragment epilogue (pingpong: one per consumer warpgroup, on their own barriers).
  template <int G>
  using FragEpiOf = FragmentBnEpilogue<Spec, kTeam, kMAtoms, 1 + G*(kTeam + 1), kTmaStore>;
  using FragEpi = FragEpiOf<0>;
  using TileEpi = BnEpilogue<Spec, NT>;
  using Tile = AccTile<BM, BN>;
  // Eval with the fragment epilogue: warp 1 of the producer warpgroup (otherwise idle) computes
  // each tile's per-column affine while the consumers are still in the mainloop, into one of
  // two buffers, so the parameter loads' latency stays off the epilogue's critical path.
  static constexpr bool kCoefWarp = kFragment && !Spec::TRAIN;
  // A non-persistent CTA's AccTile may reuse the stage ring: every load has been consumed by
  // then. Everything else gets its own space so the producer can keep loading.
  static constexpr bool kAliasRing = !kFragment && !Spec::PERSISTENT;

  // ---- Shared memory: SharedStorage is the layout; KernelConfig::smem_bytes mirrors it. ----

  // One k-slice of the ring: the x and W tiles as BK / kAtomK slabs of [rows][128 bytes] each,
  // which TMA writes with the 128-byte swizzle. TMA and wgmma agree on that pattern only from
  // 1024-byte aligned addresses, hence the alignment of every slab.
  struct PlainStage {
    alignas(1024) unsigned char a[kKAtoms][BM][128];
    alignas(1024) unsigned char b[kKAtoms][BN][128];
  };
  // 3xTF32: TMA fills a and b with raw fp32; split_ring writes W's small parts beside b in the
  // same swizzled layout (the split is per element, so the layout does not matter to it, and
  // the same descriptors read both). x is split in registers and needs no second slab.
  struct SplitStage {
    alignas(1024) unsigned char a[kKAtoms][BM][128];
    alignas(1024) unsigned char b[kKAtoms][BN][128];
    alignas(1024) unsigned char b_small[kKAtoms][BN][128];
  };
  using Stage = typename Select<kSplit3, SplitStage, PlainStage>::type;
  // What TMA writes into a stage (the full barrier's transaction count).
  static constexpr int kStageTmaBytes = kKAtoms * (kASlab + kBSlab);
  static_assert(sizeof(Stage) == kStageTmaBytes + (kSplit3 ? kKAtoms * kBSlab : 0),
                "warpspec: slabs pack the stage");
  struct PlainBarriers {
    MbarrierSlot full[STAGES];   // the stage's TMA bytes have landed (the producer's arrival)
    MbarrierSlot empty[STAGES];  // every consumer warp of every CTA that got the stage read it
    MbarrierSlot coef_full[2];   // eval coefficient buffer b written (the coefficient warp)
    MbarrierSlot coef_empty[2];  // buffer b read (every thread of the team that used it)
    MbarrierSlot turn[2];        // pingpong: group g may start its next mainloop
  };
  // 3xTF32: the same, and W's small parts of the stage written (every splitter thread).
  struct SplitBarriers {
    MbarrierSlot full[STAGES];
    MbarrierSlot empty[STAGES];
    MbarrierSlot coef_full[2];
    MbarrierSlot coef_empty[2];
    MbarrierSlot turn[2];
    MbarrierSlot split[STAGES];
  };
  using Barriers = typename Select<kSplit3, SplitBarriers, PlainBarriers>::type;
  // Epilogue scratch, owned by the epilogue for the duration of its call (TMA_STORE: and by
  // the stores it leaves in flight).
  struct FragmentScratch {
    char team[CONSUMERS / kTeam][FragEpi::kScratchBytes];  // pingpong: one per warpgroup
  };
  static_assert(CONSUMERS / kTeam == 1 || FragEpi::kScratchBytes % FragEpi::kScratchAlign == 0,
                "warpspec: every team's scratch keeps the epilogue's alignment");
  struct TileScratch {
    float tile[BM][Tile::LD];  // the fp32 AccTile
    float epi[TileEpi::kScratchFloats];
  };
  using Scratch = typename Select<kFragment, FragmentScratch, TileScratch>::type;
  static constexpr int kScratchAlign = kFragment ? FragEpi::kScratchAlign : 16;
  // The three shapes of the storage. Shared-memory epilogue, not persistent: the AccTile reuses
  // the ring. Otherwise the epilogue has its own space, and eval with the fragment epilogue
  // adds the coefficient buffers.
  struct AliasedStorage {
    union {
      Stage ring[STAGES];
      Scratch scratch;
    };
    Barriers bar;
  };
  struct OwnStorage {
    Stage ring[STAGES];
    Barriers bar;
    alignas(kScratchAlign) Scratch scratch;
  };
  // Eval's coefficients from the coefficient warp: [buffer][A, B][column].
  struct OwnStorageCoef {
    Stage ring[STAGES];
    Barriers bar;
    alignas(kScratchAlign) Scratch scratch;
    alignas(16) float coef[2][2][BN];
  };
  // overlap_apply (train: no coefficient buffers): the in-kernel apply's barrier and claims.
  struct OwnStorageOverlap {
    Stage ring[STAGES];
    Barriers bar;
    alignas(kScratchAlign) Scratch scratch;
    typename Overlap::Shared overlap;
  };
  using SharedStorage = typename Select<
      kAliasRing, AliasedStorage,
      typename Select<kCoefWarp, OwnStorageCoef,
                      typename Select<kOverlap, OwnStorageOverlap, OwnStorage>::type>::type>::type;
  static constexpr unsigned kAlign = alignof(SharedStorage);
  static_assert(kAlign == 1024, "warpspec: the ring sets the storage's alignment");
  // The dynamic shared memory base is only 16-byte aligned for sure: run() rounds it up to
  // kAlign, so the launch asks for that much more than the layout.
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage) + kAlign);
  static_assert(kSmemBytes <= 232448, "warpspec: tile and stages exceed 227 KB of shared memory");
  // Codegen passes the host's count (KernelConfig::smem_bytes) as Spec::SMEM_BYTES: the
  // planner prunes and launches with that number, so it must be exactly this layout's.
  static_assert(WarpspecHostSmemBytes<Spec>::value < 0 ||
                    WarpspecHostSmemBytes<Spec>::value == kSmemBytes,
                "warpspec: Spec::SMEM_BYTES (KernelConfig::smem_bytes) disagrees with "
                "sizeof(SharedStorage) + its alignment");

  // Registers per thread after the split (setmaxnreg, with two consumer warpgroups only: with
  // one, the launch cap of 255 already leaves the consumers all they need).
  // overlap_apply: the apply warps hold a 16-byte column unit's coefficients and a row, and the
  // queue's bookkeeping, which do not fit 40 registers (ptxas spilled 140 bytes); the consumers
  // fit 224 without spills at 128x256, and 128 x 56 + 256 x 224 is the same 64512 registers.
  // The apply warps' bulk path (16 floats of coefficients) spills 4 bytes at tf32 and 12 at bf16
  // (ptxas, 128x256); 64 + 216 would not, but would take the registers from the consumers.
  static constexpr int kProducerRegs = kOverlap ? 56 : 40;
  static constexpr int kConsumerRegs = kOverlap ? 224 : 232;
  static_assert(CONSUMERS == 1 ||
                    register_budgets_fit(Spec::THREADS, kProducerRegs, kConsumerRegs, CONSUMERS),
                "warpspec: the warpgroups' register budgets exceed the CTA's");

  // Cluster tiles of a run of m rows.
  __host__ __device__ static constexpr int cluster_tiles(int m) {
    return ((m + BM - 1) / BM + CLUSTER - 1) / CLUSTER * kColTiles;
  }
  // grid.x for the launch (see the header comment).
  __host__ __device__ static constexpr int grid_size(int m, int sm_count) {
    return CLUSTER *
           (Spec::PERSISTENT
                ? (cluster_tiles(m) < sm_count / CLUSTER ? cluster_tiles(m) : sm_count / CLUSTER)
                : cluster_tiles(m));
  }

  __device__ static void run(const Params& p, const TmaDescriptor& tx, const TmaDescriptor& tw,
                             const TmaDescriptor* ty) {
    extern __shared__ __align__(1024) unsigned char fj_warpspec_smem[];
    const unsigned raw = shared_addr(fj_warpspec_smem);
    const unsigned base = (raw + kAlign - 1u) & ~(kAlign - 1u);
    SharedStorage& s = *reinterpret_cast<SharedStorage*>(fj_warpspec_smem + (base - raw));
    const int warpgroup = threadIdx.x / 128;
    const Ctx c(s, base, CLUSTER > 1 ? cluster_rank() : 0u, rows_of<Spec>(p),
                GridSync<Spec>::value && p.grid_sync);

    if (threadIdx.x == 0) {
      tma_prefetch(&tx);
      tma_prefetch(&tw);
      if constexpr (kTmaStore) tma_prefetch(ty);
      for (int i = 0; i < STAGES; ++i) {
        c.full[i].init(1);
        // Every consumer warp of every CTA whose W half lands in this stage releases it.
        c.empty[i].init(4 * kTeam * CLUSTER);
        if constexpr (kSplit3) c.split[i].init(kSplitters);
      }
      if constexpr (kOverlap) {
        c.overlap_ready.init(1);
        c.s.overlap.stored = 0u;
        Overlap::init_slots(c.s.overlap);
      }
      for (int b = 0; b < 2; ++b) {
        c.coef_full[b].init(32);            // every lane of the coefficient warp
        c.coef_empty[b].init(128 * kTeam);  // every thread of the team that used it
        c.turn[b].init(4);                  // every warp of the other group
      }
      mbar_fence_init();
    }
    // Peers arrive on our barriers and multicast into our stages: all must be initialized
    // cluster-wide before anyone issues.
    if constexpr (CLUSTER > 1)
      cluster_sync();
    else
      __syncthreads();

    if (warpgroup == 0) {
      if constexpr (CONSUMERS == 2) regs_release<kProducerRegs>();
      if (threadIdx.x == 0) {
        produce(tx, tw, c);
      } else if (threadIdx.x / 32 == 1) {
        if constexpr (kCoefWarp) {
          if constexpr (WsAffine<Spec>::value) wait_for_prior_grid();  // see consume()
          coefficients(p, c, threadIdx.x % 32);
        }
      } else if (threadIdx.x >= 128 - kSplitters) {
        if constexpr (kSplit3) split_ring(c, threadIdx.x - (128 - kSplitters));
      }
      if constexpr (kOverlap) {
        if (p.overlap && threadIdx.x >= 32) {
          if (threadIdx.x == 32) Overlap::begin(p, c.overlap_ready);
          const int first = first_tile(), stride = tile_stride(c);
          const int own =
              first < c.cluster_tiles ? (c.cluster_tiles - first + stride - 1) / stride : 0;
          Overlap::template apply_warps<96, kApplyWarpsBar, 1, NT / 32>(
              p, c.s.overlap, [&](int k) { return coord(c, first + k * stride).n0 / BN; }, own,
              threadIdx.x - 32);
        }
      }
    } else {
      if constexpr (CONSUMERS == 2) regs_acquire<kConsumerRegs>();
      consume(p, c, threadIdx.x - 128, ty);
      // With no tile left, the consumers help with the last panels' apply.
      if constexpr (kOverlap) {
        if (p.overlap)
          Overlap::template apply_tail<NT, kApplyTailBar, 8>(p, c.s.overlap, c.overlap_ready,
                                                             threadIdx.x - 128);
      }
    }
    // No CTA of a cluster may leave while its peer can still arrive on its barriers.
    if constexpr (CLUSTER > 1) cluster_sync();
  }

 private:
  // Stage i of the ring by shared-window address (what TMA and the wgmma descriptors take).
  struct StageAddr {
    unsigned addr;
    // Row `row` of K slab ka of the x tile (a) or of the W tile (b).
    __device__ __forceinline__ unsigned a(int ka, unsigned row = 0) const {
      return addr + FJ_OFFSETOF(Stage, a) + ka * static_cast<unsigned>(sizeof(Stage::a[0])) +
             row * static_cast<unsigned>(sizeof(Stage::a[0][0]));
    }
    __device__ __forceinline__ unsigned b(int ka, unsigned row = 0) const {
      return addr + FJ_OFFSETOF(Stage, b) + ka * static_cast<unsigned>(sizeof(Stage::b[0])) +
             row * static_cast<unsigned>(sizeof(Stage::b[0][0]));
    }
    // 3xTF32: W's small parts, at the same offsets from their own array.
    __device__ __forceinline__ unsigned b_small(int ka, unsigned row = 0) const {
      return b(ka, row) + FJ_OFFSETOF(Stage, b_small) - FJ_OFFSETOF(Stage, b);
    }
  };

  // What every role of the CTA works with: the storage (ordinary loads and stores go through
  // it), its 32-bit shared-window address `base` with the barriers and stages addressed from
  // it by the layout's offsets (what mbarrier, TMA and wgmma take), and this CTA's rank in its
  // cluster. The role functions are inlined into run(), so it lives in registers or folds into
  // the instructions' address offsets, never in memory.
  struct Ctx {
    SharedStorage& s;
    unsigned base;
    unsigned rank;
    MbarrierArray<STAGES> full, empty, split;  // split: 3xTF32 only
    MbarrierArray<2> coef_full, coef_empty, turn;
    Mbarrier overlap_ready;  // overlap_apply only
    int m;                   // the run's rows
    int cluster_tiles;       // the tiles every role walks, as cluster tiles
    Raster raster;

    // column_panels: a resident run (GRID_SYNC), whose CTAs take their tiles a round at a time.
    __device__ __forceinline__ Ctx(SharedStorage& storage, unsigned shared_base, unsigned cta_rank,
                                   int rows, bool column_panels)
        : s(storage),
          base(shared_base),
          rank(cta_rank),
          m(rows),
          cluster_tiles(WarpspecGemm::cluster_tiles(rows)),
          raster(make_raster(((rows + BM - 1) / BM + CLUSTER - 1) / CLUSTER, column_panels)),
          full{shared_base + FJ_OFFSETOF(SharedStorage, bar.full)},
          empty{shared_base + FJ_OFFSETOF(SharedStorage, bar.empty)},
          split{shared_base + split_barriers_offset()},
          coef_full{shared_base + FJ_OFFSETOF(SharedStorage, bar.coef_full)},
          coef_empty{shared_base + FJ_OFFSETOF(SharedStorage, bar.coef_empty)},
          turn{shared_base + FJ_OFFSETOF(SharedStorage, bar.turn)},
          overlap_ready{shared_base + overlap_ready_offset()} {}

    __device__ __forceinline__ StageAddr stage(unsigned i) const {
      return {base + FJ_OFFSETOF(SharedStorage, ring) + i * static_cast<unsigned>(sizeof(Stage))};
    }
  };

  // A resident run (Spec::GRID_SYNC with Params::grid_sync) is a grid of row_tiles x R CTAs
  // (the host's resident_grid), persistent when it has more tiles than CTAs: each CTA takes one
  // tile per round, and every round ends at the grid barrier in the epilogue, after which each
  // CTA merges its tile's columns over every row tile. So a round must hold whole column
  // panels: the raster walks all row tiles of a column tile before the next (group =
  // row_tiles), and round r covers column tiles r R .. r R + R - 1 (the last round what is
  // left; consume() has the CTAs past it arrive all the same). Any other run walks GROUP_M row
  // tiles at a time, which shares W's tiles in L2.
  __device__ __forceinline__ static Raster make_raster(int cluster_rows, bool column_panels) {
    if constexpr (kOverlap)
      return Raster{cluster_rows};
    else
      return Raster{cluster_rows, column_panels ? cluster_rows : kGroupM};
  }

  __host__ __device__ static constexpr unsigned split_barriers_offset() {
    if constexpr (kSplit3)
      return FJ_OFFSETOF(SharedStorage, bar.split);
    else
      return ~0u;  // no such barriers: an address no shared-memory access can use
  }

  __host__ __device__ static constexpr unsigned overlap_ready_offset() {
    if constexpr (kOverlap)
      return FJ_OFFSETOF(SharedStorage, overlap.ready);
    else
      return ~0u;  // no such barrier
  }
  // Named barriers of the in-kernel apply (the fragment epilogue uses 1 to 3).
  static constexpr int kApplyWarpsBar = 9, kApplyTailBar = 10;

  struct TileCoord {
    int row, m0, n0;
  };
  __device__ __forceinline__ static TileCoord coord(const Ctx& c, int cluster_tile) {
    const auto t = c.raster.tile(cluster_tile);
    const int row = t.row * CLUSTER + static_cast<int>(c.rank);
    return {row, row * BM, t.col * BN};
  }
  __device__ __forceinline__ static int first_tile() {
    return static_cast<int>(blockIdx.x) / CLUSTER;
  }
  __device__ __forceinline__ static int tile_stride(const Ctx& c) {
    return Spec::PERSISTENT ? static_cast<int>(gridDim.x) / CLUSTER : c.cluster_tiles;
  }

  __device__ __forceinline__ static unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
  }
  __device__ __forceinline__ static void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
            : "memory");
  }

  __device__ __forceinline__ static void produce(const TmaDescriptor& tx, const TmaDescriptor& tw,
                                                 const Ctx& c) {
    PipelineState<STAGES> pipe;
    for (int ct = first_tile(); ct < c.cluster_tiles; ct += tile_stride(c)) {
      const TileCoord t = coord(c, ct);
      for (int kt = 0; kt < kKTiles; ++kt) {
        const Mbarrier full = c.full[pipe.index];
        c.empty[pipe.index].wait(pipe.phase ^ 1u);
        // The whole W tile arrives in every CTA of the cluster (half of it from the peer).
        full.arrive_expect_tx(static_cast<unsigned>(kStageTmaBytes));
        const StageAddr stage = c.stage(pipe.index);
#pragma unroll
        for (int ka = 0; ka < kKAtoms; ++ka) {
          const int k = kt * BK + ka * kAtomK;
          tma_load_2d(stage.a(ka), &tx, full.addr, k, t.m0);
          if constexpr (CLUSTER == 1) {
            tma_load_2d(stage.b(ka), &tw, full.addr, k, t.n0);
          } else {
            // This CTA's rows of W, into the same rows of every CTA's stage.
            tma_load_2d_multicast(stage.b(ka, c.rank * kWBoxRows), &tw, full.addr, k,
                                  t.n0 + static_cast<int>(c.rank) * kWBoxRows,
                                  static_cast<unsigned short>((1u << CLUSTER) - 1u));
          }
        }
        pipe.advance();
      }
    }
  }

  // Which coefficient buffer the epilogue of a CTA's tile uses, and how many times that
  // buffer was used before (its phase parity). Cooperative: buffers alternate over the tiles
  // whose epilogue runs. Pingpong: buffer g belongs to consumer g, which takes alternate tiles.
  struct CoefSlot {
    int buf, use;
  };
  __device__ __forceinline__ static CoefSlot coef_slot(int local, int runs, int runs_g) {
    if constexpr (kPingpong)
      return {local & 1, runs_g};
    else
      return {runs & 1, runs >> 1};
  }

  // The coefficient warp: eval affine of every tile this CTA stores, double-buffered. It walks
  // the tiles exactly as consume() does and skips the same ones.
  __device__ __forceinline__ static void coefficients(const Params& p, const Ctx& c, int lane) {
    int runs = 0, runs0 = 0, runs1 = 0;
    int local = 0;
    for (int ct = first_tile(); ct < c.cluster_tiles; ct += tile_stride(c), ++local) {
      const TileCoord t = coord(c, ct);
      if (CLUSTER > 1 && t.m0 >= c.m) continue;
      const CoefSlot slot = coef_slot(local, runs, (local & 1) ? runs1 : runs0);
      c.coef_empty[slot.buf].wait((slot.use & 1) ^ 1u);
      float(&coef)[2][BN] = c.s.coef[slot.buf];
      FragEpi::eval_coefficients(p, t.n0, coef[0], coef[1], lane, 32);
      c.coef_full[slot.buf].arrive();  // release: our shared stores before the handoff
      ++runs;
      if (local & 1)
        ++runs1;
      else
        ++runs0;
    }
  }

  using Acc = float[kMAtoms][BN / 2];

  __device__ __forceinline__ static void consume(const Params& p, const Ctx& c, int ctid,
                                                 const TmaDescriptor* ty) {
    const int group = ctid / 128;  // consumer warpgroup
    const int lane = ctid % 32;
    // Rows of the stage's x tile this group multiplies, and its rank in its epilogue team.
    const int a_row0 = kPingpong ? 0 : group * kWgM;
    const int etid = kPingpong ? ctid % 128 : ctid;
    PipelineCounter<STAGES> slice;  // k-slices of this CTA's ring so far (all tiles, all groups)
    int runs = 0;                   // epilogues this group ran
    int local = 0;                  // this CTA's tiles so far
    // Pingpong turn-taking. A group may only wait on a stage barrier less than one ring lap
    // ahead of its last completed phase (parity waits cannot tell phase k from k + 2), so a
    // group starts its j-th mainloop only after the other group has issued its own previous
    // one: group 1's j-th follows group 0's j-th, group 0's j-th follows group 1's (j-1)-th.
    // turn[g] completes a phase each time the other group has issued a mainloop.
    const Mbarrier turn_mine = c.turn[group];
    const Mbarrier turn_other = c.turn[group ^ 1];
    int loops = 0;           // mainloops this group ran
    bool uncounted = false;  // overlap_apply, TMA stores: the last tile's stores not yet counted
    Acc acc;
    for (int ct = first_tile(); ct < c.cluster_tiles; ct += tile_stride(c), ++local) {
      if (kPingpong && (local & 1) != group) {
        slice.skip(kKTiles);  // the other group's tile
        continue;
      }
      if constexpr (kPingpong) turn_mine.wait((loops + group + 1) & 1);
      const TileCoord t = coord(c, ct);
      if constexpr (kSplit3) {
#pragma unroll
        for (int ma = 0; ma < kMAtoms; ++ma)
#pragma unroll
          for (int j = 0; j < BN / 2; ++j) acc[ma][j] = 0.f;
      }
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) wgmma_fence_operands(acc[ma]);
      if constexpr (kSplit3) {
        split3_mainloop(c, slice, a_row0, ctid, acc);  // waits for every slice
      } else {
        for (int kt = 0; kt < kKTiles; ++kt, slice.advance()) {
          // overlap_apply with TMA stores: the previous tile's stores have had a few slices'
          // time to land. Counted now rather than at the next epilogue, a panel is complete when
          // its last tile's wave ends, not a tile later (which left the last panels but one for
          // the tail).
          if constexpr (kOverlap && kTmaStore) {
            if (uncounted && kt == kCountAtSlice) {
              Overlap::template tile_stored<true>(c.s.overlap, etid);
              uncounted = false;
            }
          }
          const unsigned i = slice.index();
          c.full[i].wait(slice.phase());
          const StageAddr stage = c.stage(i);
          const unsigned long long da = wgmma_desc_sw128(stage.a(0, a_row0));
          const unsigned long long db = wgmma_desc_sw128(stage.b(0));
          wgmma_fence();
          for_each_kstep([&](int ma, unsigned a_off, unsigned b_off, int step) {
            Wgmma<T, BN>::mma(acc[ma], da + a_off, db + b_off, kt == 0 && step == 0 ? 0 : 1);
          });
          wgmma_commit();
          if (kt > 0) {
            // The slice before this one is done: hand its stage back to the producer(s).
            wgmma_wait<1>();
            release(c.empty[slice.previous_index()], lane);
          }
        }
      }
      if constexpr (kPingpong) {
        // Every slice of this tile has landed and its wgmma are issued: the other group may
        // start waiting on the ring now, while ours finish.
        if (lane == 0) turn_other.arrive();
        ++loops;
      }
      if constexpr (!kSplit3) {  // 3xTF32 waited and released every slice already
        wgmma_wait<0>();
        release(c.empty[slice.previous_index()], lane);
      }
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) wgmma_fence_operands(acc[ma]);

      // A CTA of the last cluster row may sit past M when row_tiles is odd: it only fed W.
      if (CLUSTER > 1 && t.m0 >= c.m) continue;
      // Recompute's affine pass is a programmatic dependent launch of fj_finalize, which lets it
      // start at once: its producer and mainloops (x and W only) run beside the finalize, and
      // the consumers wait for it here, before the first epilogue reads its coefficients (the
      // fragment epilogue counts `runs`; the shared-memory one, which codegen does not emit,
      // does not, so it waits before every tile).
      if constexpr (WsAffine<Spec>::value) {
        if (runs == 0) wait_for_prior_grid();
      }
      if constexpr (kFragment) {
        const CoefSlot slot = coef_slot(local, runs, runs);
        const float* coef = nullptr;
        if constexpr (kCoefWarp) {
          c.coef_full[slot.buf].wait(slot.use & 1);
          coef = &c.s.coef[slot.buf][0][0];
        }
        // overlap_apply with TMA stores: the previous tile, if its mainloop did not count it
        // (never today: every mainloop reaches kCountAtSlice; kept so that one that did not
        // still counts).
        if constexpr (kOverlap && kTmaStore) {
          if (uncounted) Overlap::template tile_stored<true>(c.s.overlap, etid);
          uncounted = false;
        }
        if (kPingpong && group == 1) {
          FragEpiOf<kPingpong ? 1 : 0>::run(p, acc, c.s.scratch.team[kPingpong ? 1 : 0], t.m0, t.n0,
                                            t.row, etid, coef);
        } else {
          FragEpi::run(p, acc, c.s.scratch.team[0], t.m0, t.n0, t.row, etid, coef, ty);
        }
        if constexpr (kOverlap && kTmaStore) uncounted = p.overlap;
        if constexpr (kOverlap && !kTmaStore) {
          if (p.overlap) Overlap::template tile_stored<false>(c.s.overlap, etid);
        }
        if constexpr (kCoefWarp) {
          // Every reader arrives itself (rather than one lane per warp after __syncwarp): each
          // thread's own release then orders its reads before the coefficient warp's next
          // writes, which is also what compute-sanitizer's racecheck can follow.
          c.coef_empty[slot.buf].arrive();
        }
        ++runs;
      } else {
        tile_epilogue(p, acc, c.s.scratch, t, ctid);
      }
    }
    // A resident run's last round may hold fewer column panels than the grid has room for: a
    // CTA without a tile in it still meets that round's barrier, which counts every CTA. Every
    // other round is full, so a CTA misses at most that one. (A loop over the missed rounds
    // here made ptxas spill 388 bytes in tf32's 128x256 fj_gemm; this test spills none.)
    if constexpr (GridSync<Spec>::value) {
      if (p.grid_sync) {
        const int rounds = (c.cluster_tiles + tile_stride(c) - 1) / tile_stride(c);
        if (local < rounds) FragEpi::meet_round(etid);
      }
    }
    if constexpr (kFragment) FragEpi::drain(etid);
    if constexpr (kOverlap && kTmaStore) {
      if (uncounted) Overlap::template tile_stored<true>(c.s.overlap, etid);
    }
    // Single-pass train with a fixed momentum: nobody reads num_batches_tracked, so one thread
    // bumps it here (cumulative mode launches bump_batches after the GEMM instead).
    // Recompute's affine pass likewise: it runs after fj_finalize, the counter's last reader. A
    // resident run (GRID_SYNC): CTA 0 is past the grid barrier here, before which every CTA
    // read the counter.
    if constexpr ((Spec::TRAIN && Spec::SINGLE_PASS && !Spec::CUMULATIVE) ||
                  WsAffine<Spec>::value || GridSync<Spec>::value) {
      const bool bumps = !GridSync<Spec>::value || p.grid_sync;
      if (bumps && blockIdx.x == 0 && ctid == 0 && p.num_batches_tracked) {
        // The affine pass: after fj_finalize, which reads the counter. CTA 0's consumers waited
        // before their first epilogue already; this keeps the order without relying on it.
        if constexpr (WsAffine<Spec>::value) wait_for_prior_grid();
        *p.num_batches_tracked += 1;
      }
    }
  }

  // The wgmma of one k-slice in issue order: f(ma, a_off, b_off, step) for each slab ka, k-step
  // ks and M atom ma, with the operands' descriptor offsets in their 16-byte units (slab ka, row
  // 64 ma, byte 32 ks) and the k-step's index in the slice (ka kKSteps + ks; 0: the first).
  template <class F>
  __device__ __forceinline__ static void for_each_kstep(F&& f) {
#pragma unroll
    for (int ka = 0; ka < kKAtoms; ++ka)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
        for (int ma = 0; ma < kMAtoms; ++ma)
          f(ma, static_cast<unsigned>((ka * kASlab + ma * 64 * 128 + ks * 32) >> 4),
            static_cast<unsigned>((ka * kBSlab + ks * 32) >> 4), ka * kKSteps + ks);
  }

  // 3xTF32's mainloop over one tile. x's fragments come from shared memory into registers
  // (ldmatrix) and are split there; the products take them as wgmma's register A operand, so
  // x is neither written back nor read by the tensor cores, and only W's small parts are
  // stored (split_ring). Against splitting both operands in shared memory and reading both
  // through descriptors (docs/performance.md, "3xTF32"), a 128x128x32 slice's shared-memory
  // traffic falls from ~224 KiB to ~144 KiB, and a stage needs no slab for x's small parts.
  //
  // Each slice's three products go into a partial sum that is added to the tile's sums on the
  // CUDA cores: wgmma's own accumulation keeps fewer bits than an fp32 add, and with the whole
  // K summed in it 3xTF32 measured 24-90x strict fp32's error and failed its 2e-5 tolerance at
  // 512x256x4096 (H100); summed per 32-deep slice, 0.8-1.3x. One partial sum: while a slice's
  // products run, the warpgroup already waits for the next stage, loads its x and splits it
  // into the other fragment set; only the add sits between two slices' products, and the other
  // consumer warpgroup's products fill that gap (nothing couples the two warpgroups' slices).
  // Measured on H100 against splitting x after the wait (one fragment set): 0.497x against
  // 0.505x the cuBLASLt SGEMM's time over 12 pairs, within their spread (no loss, perhaps 1-2%
  // gained). Two partial sums of half the columns each, so that the tensor cores always hold
  // queued work, were slower (narrower wgmma, spills): docs/performance.md, "x split in
  // registers". Nothing is in flight across the loop's back edge (ptxas serializes every wgmma
  // when an accumulator is: warning C7514).
  __device__ __forceinline__ static void split3_mainloop(const Ctx& c,
                                                         PipelineCounter<STAGES>& slice, int a_row0,
                                                         int ctid, Acc& acc) {
    const int lane = ctid % 32;
    // ldmatrix_x4's four 8x4 matrices of 32-bit elements are the A fragment's registers: rows
    // 0-7 and 8-15 of the warp's 16 at k 0-3 of a k-step, then the same at k 4-7. Lane l
    // addresses row l % 8 + 8 ((l / 8) % 2) of matrix l / 8. A row's 16-byte unit u sits at
    // unit u ^ (row % 8) (the 128-byte swizzle; the warp's rows start at a multiple of 8).
    const int frag_row = a_row0 + 16 * ((ctid / 32) % 4) + (lane & 7) + ((lane >> 3) & 1) * 8;
    const unsigned unit_hi = static_cast<unsigned>(lane >> 4);
    const unsigned swizzle = static_cast<unsigned>(lane & 7);
    Acc part;
    SliceFrag frag[2];
    // Waits for the next slice's stage and its W split, and loads and splits this warpgroup's
    // rows of x into `fr`.
    auto prepare = [&](SliceFrag& fr) {
      const unsigned i = slice.index();
      c.full[i].wait(slice.phase());   // x landed
      c.split[i].wait(slice.phase());  // W's small parts written
      const StageAddr stage = c.stage(i);
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma)
#pragma unroll
        for (int ka = 0; ka < kKAtoms; ++ka)
#pragma unroll
          for (int ks = 0; ks < kKSteps; ++ks) {
            const int f = ka * kKSteps + ks;
            unsigned raw[4];
            ldmatrix_x4(raw,
                        stage.a(ka, frag_row + 64 * ma) + (((2u * ks + unit_hi) ^ swizzle) << 4));
#pragma unroll
            for (int r = 0; r < 4; ++r) split_tf32(raw[r], fr.big[ma][f][r], fr.small[ma][f][r]);
          }
      slice.advance();
      return i;
    };
    // Issues the slice's products into `part`.
    auto issue = [&](const SliceFrag& fr, unsigned stage_index) {
      const StageAddr stage = c.stage(stage_index);
      const unsigned long long db = wgmma_desc_sw128(stage.b(0));
      const unsigned long long dbs = wgmma_desc_sw128(stage.b_small(0));
      wgmma_fence();
      for_each_kstep([&](int ma, unsigned, unsigned b_off, int step) {
        // small * big and big * small before big * big, as in the tiled mainloop.
        WgmmaRegA<BN>::mma(part[ma], fr.small[ma][step], db + b_off, step == 0 ? 0 : 1);
        WgmmaRegA<BN>::mma(part[ma], fr.big[ma][step], dbs + b_off, 1);
        WgmmaRegA<BN>::mma(part[ma], fr.big[ma][step], db + b_off, 1);
      });
      wgmma_commit();
    };
    // Once the slice's products are done: adds them to the tile's sums and hands the stage back.
    auto retire = [&](SliceFrag& fr, unsigned stage_index) {
      wgmma_wait<0>();
      // The products read fr until here: keep the compiler from reusing its registers.
      fence_fragments(fr);
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) {
        wgmma_fence_operands(part[ma]);
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[ma][j] += part[ma][j];
      }
      release(c.empty[stage_index], lane);
    };
    // Slice by slice, the fragment sets alternating (named at compile time: two slices per
    // iteration, the last one or two peeled).
    unsigned cur = prepare(frag[0]), next;
#pragma unroll 1
    for (int kt = 0; kt + 2 < kKTiles; kt += 2) {
      issue(frag[0], cur);
      next = prepare(frag[1]);
      retire(frag[0], cur);
      issue(frag[1], next);
      cur = prepare(frag[0]);
      retire(frag[1], next);
    }
    issue(frag[0], cur);
    if constexpr (kKTiles % 2 == 0) {
      next = prepare(frag[1]);
      retire(frag[0], cur);
      issue(frag[1], next);
      retire(frag[1], next);
    } else {
      retire(frag[0], cur);
    }
  }
  // x's fragments of one slice for one consumer warpgroup, split: per M atom and k-step
  // (slab-major), wgmma's four A registers.
  using XFrag = unsigned[kMAtoms][kKAtoms * kKSteps][4];
  struct SliceFrag {
    XFrag big, small;
  };
  __device__ __forceinline__ static void fence_fragments(SliceFrag& f) {
#pragma unroll
    for (int ma = 0; ma < kMAtoms; ++ma)
#pragma unroll
      for (int i = 0; i < kKAtoms * kKSteps; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          asm volatile("" : "+r"(f.big[ma][i][r]), "+r"(f.small[ma][i][r])::"memory");
  }

  // 3xTF32: W's part of each stage's split, by the producer warpgroup's last kSplitters
  // threads (otherwise idle), which walk the ring as the producer fills it. W's elements (b)
  // stay as TMA wrote them, the tensor core's truncation of them being their big parts
  // (tf32_small_of_truncated), and b_small gets the small parts; x is split in registers
  // (split3_mainloop) with split_tf32, rounded. Why one operand of each kind: a truncated split
  // writes only its small part, but that part always has its element's sign, so small * small,
  // the product left out, is biased unless the other operand's split is rounded. Measured at
  // 1024x8192x8192 and 4096^3 (H200, both split in shared memory then): 1.45-1.53 ms against
  // 1.59-1.66 with both rounded; both truncated 1.36-1.46, but with every weight positive (all
  // products of one sign) eval's error went from 2.8x strict fp32's to 5.7x (this split: 3.4-3.7x;
  // docs/performance.md "3xTF32"). Each splitter fences its writes for the async proxy (wgmma
  // reads shared memory through it) and arrives on the stage's split barrier, which the
  // consumers wait on beside the full one. The consumers did this split themselves before,
  // and met at a named barrier every slice.
  __device__ __forceinline__ static void split_ring(const Ctx& c, int tid) {
    constexpr int kVecs = 128 / 16;  // uint4 per 128-byte row
    PipelineState<STAGES> pipe;
    for (int ct = first_tile(); ct < c.cluster_tiles; ct += tile_stride(c)) {
      for (int kt = 0; kt < kKTiles; ++kt) {
        c.full[pipe.index].wait(pipe.phase);
        Stage& st = c.s.ring[pipe.index];
#pragma unroll
        for (int ka = 0; ka < kKAtoms; ++ka)
          split_slab<BN * kVecs, kSplitters>(reinterpret_cast<const uint4*>(&st.b[ka][0][0]),
                                             reinterpret_cast<uint4*>(&st.b_small[ka][0][0]), tid);
        fence_async_shared();
        c.split[pipe.index].arrive();
        pipe.advance();
      }
    }
  }
  // Warps 2 and 3 of the producer warpgroup (warp 0 issues TMA, warp 1 is eval's coefficient
  // warp).
  static constexpr int kSplitters = 64;
  static_assert(kSplitters <= 64, "warpspec: the splitters are warps 2-3 of warpgroup 0");
  // One thread's share of a slab (units first, first + STRIDE, ... of COUNT uint4): loads in
  // batches ahead of their splits and stores, so a batch pays the load latency once and its
  // splits run side by side (the compiler may not hoist a load above a store it cannot tell
  // apart from it), and with no bounds tests, which would become branches.
  template <int COUNT, int STRIDE>
  __device__ __forceinline__ static void split_slab(const uint4* x, uint4* small, int first) {
    static_assert(COUNT % STRIDE == 0, "3xTF32 split: whole units per thread");
    constexpr int kPer = COUNT / STRIDE;
    constexpr int kBatch = kPer < 4 ? kPer : 4;
    static_assert(kPer % kBatch == 0, "3xTF32 split: whole batches per thread");
#pragma unroll
    for (int b0 = 0; b0 < kPer; b0 += kBatch) {
      uint4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) v[u] = x[first + (b0 + u) * STRIDE];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        small[first + (b0 + u) * STRIDE] =
            make_uint4(tf32_small_of_truncated(v[u].x), tf32_small_of_truncated(v[u].y),
                       tf32_small_of_truncated(v[u].z), tf32_small_of_truncated(v[u].w));
    }
  }

  // Every warp of this consumer group has finished reading the stage (its wgmma completed).
  __device__ __forceinline__ static void release(Mbarrier empty, int lane) {
    if (lane == 0) {
      if constexpr (CLUSTER == 1) {
        empty.arrive();
      } else {
#pragma unroll
        for (unsigned cta = 0; cta < CLUSTER; ++cta) empty.arrive_cluster(cta);
      }
    }
  }

  // Spills the accumulators into an fp32 AccTile and runs the shared BnEpilogue over it.
  __device__ static void tile_epilogue(const Params& p, Acc& acc, TileScratch& scratch,
                                       const TileCoord& t, int ctid) {
    using Bar = NamedBarrier<1, NT>;
    const Tile tile{&scratch.tile[0][0]};
    // Aliased ring: every consumer's wgmma must be done reading it. Own tile: the previous
    // tile's epilogue must be done reading it.
    Bar{}();
    const int lane = ctid % 32;
    const int row0 = (ctid / 128) * kWgM + ((ctid / 32) % 4) * 16 + lane / 4;
    const int col0 = 2 * (lane % 4);
#pragma unroll
    for (int ma = 0; ma < kMAtoms; ++ma)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(&tile(row0 + 64 * ma + 8 * h, 8 * j + col0)) =
              make_float2(acc[ma][4 * j + 2 * h], acc[ma][4 * j + 2 * h + 1]);
    Bar{}();
    TileEpi::run(p, tile, scratch.epi, t.m0, t.n0, t.row, ctid, Bar{});
  }
};

}  // namespace fj
