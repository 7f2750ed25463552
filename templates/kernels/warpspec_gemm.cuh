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
// false; fragment epilogue, not pingpong, 16-bit y): y leaves through per-warp 1 KiB boxes and
// TMA stores (the kernel's third tensor map, `ty`: y in boxes of 16 rows x 32 columns, 64-byte
// swizzle; unused otherwise).
//
// Host launch contract (WarpspecGemm<Spec>::grid_size):
//   row_tiles = ceil(M / BM), col_tiles = ceil(N / BN),
//   cluster_tiles = ceil(row_tiles / CLUSTER_M) * col_tiles,
//   grid.x = CLUSTER_M * (PERSISTENT ? min(cluster_tiles, sm_count / CLUSTER_M) : cluster_tiles),
//   block.x = THREADS, dynamic shared memory = kSmemBytes, cluster (CLUSTER_M, 1, 1) when > 1.
// With CLUSTER_M = 1 that is the plain "one CTA per tile" (or min(tiles, sm_count)) grid.
#pragma once
#include "common/limits.h"
#include "common/math_kind.cuh"
#include "common/params.h"
#include "common/spec_flag.cuh"
#include "common/tile.cuh"
#include "common/tma_descriptor.cuh"
#include "common/types.cuh"
#include "epilogue/bn_epilogue.cuh"
#include "epilogue/fragment_bn_epilogue.cuh"
#include "kernels/tile_scheduler.cuh"
#include "mainloop/mbarrier.cuh"
#include "mainloop/tma.cuh"
#include "mainloop/wgmma.cuh"

namespace fj {

// Spec::FRAGMENT_EPILOGUE (default true), PINGPONG and TMA_STORE (default false).
FJ_SPEC_FLAG(WarpspecFragmentEpilogue, FRAGMENT_EPILOGUE, true);
FJ_SPEC_FLAG(WarpspecPingpong, PINGPONG, false);
FJ_SPEC_FLAG(WarpspecTmaStore, TMA_STORE, false);

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
  static_assert((Spec::MATH == kMathTf32) == (sizeof(T) == 4), "warpspec: tf32 iff T is float");
  static_assert(Spec::VEC_BYTES == 16, "warpspec: TMA and the stores need 16-byte aligned rows");
  static_assert(Spec::K >= 1, "warpspec: K must be positive");
  // Tile counts are (D + T - 1) / T in int (Problem::validate, KernelConfig::why_invalid).
  static_assert(Spec::M <= kMaxDim && Spec::N <= kMaxDim && Spec::K <= kMaxDim,
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
  static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256,
                "warpspec: BN in {64,128,192,256}");
  static_assert(BM <= 256, "warpspec: a TMA box has at most 256 rows");
  static_assert(BN % (8 * CLUSTER) == 0,
                "warpspec: the multicast W half must be whole 8-row groups");

  static constexpr int kASlab = BM * 128;  // bytes of one K slab of the x tile
  static constexpr int kBSlab = BN * 128;
  static constexpr int kAStage = kKAtoms * kASlab;
  static constexpr int kBStage = kKAtoms * kBSlab;
  static constexpr int kStageBytes = kAStage + kBStage;
  static constexpr int kRingBytes = STAGES * kStageBytes;
  // full[STAGES], empty[STAGES], coef_full[2], coef_empty[2] (eval coefficient handoff), then
  // turn[2] (pingpong: whose mainloop is next).
  static constexpr int kBarBytes = (2 * STAGES + 6) * 8;
  static constexpr int kKTiles = (Spec::K + BK - 1) / BK;
  static constexpr int kWBoxRows = BN / CLUSTER;  // rows of W one CTA's TMA box covers

  static constexpr int kRowTiles = (Spec::M + BM - 1) / BM;
  static constexpr int kColTiles = (Spec::N + BN - 1) / BN;
  static constexpr int kClusterRows = (kRowTiles + CLUSTER - 1) / CLUSTER;
  // Twice the cluster tiles fit int: the grid (CLUSTER of them) and the tile loops' last
  // `ct += tile_stride()` (at most kClusterTiles - 1 + kClusterTiles) stay in range.
  static_assert(fits_int(2LL * kClusterRows * kColTiles),
                "warpspec: twice the cluster tiles must fit int (KernelConfig::why_invalid)");
  static constexpr int kClusterTiles = kClusterRows * kColTiles;
  static constexpr int kGroupM = Spec::GROUP_M / CLUSTER > 0 ? Spec::GROUP_M / CLUSTER : 1;
  using Raster = GroupedRaster<kClusterRows, kColTiles, kGroupM>;

  // Team g's fragment epilogue (pingpong: one per consumer warpgroup, on their own barriers).
  template <int G>
  using FragEpiOf = FragmentBnEpilogue<Spec, kTeam, kMAtoms, 1 + G*(kTeam + 1), kTmaStore>;
  using FragEpi = FragEpiOf<0>;
  using TileEpi = BnEpilogue<Spec, NT>;
  using Tile = AccTile<BM, BN>;
  static constexpr int kEpiBytes = kFragment ? FragEpi::kScratchBytes * (CONSUMERS / kTeam)
                                             : Tile::kBytes + TileEpi::kScratchBytes;
  // Eval with the fragment epilogue: warp 1 of the producer warpgroup (otherwise idle) computes
  // each tile's per-column affine while the consumers are still in the mainloop, into one of
  // two buffers, so the parameter loads' latency stays off the epilogue's critical path.
  static constexpr bool kCoefWarp = kFragment && !Spec::TRAIN;
  static constexpr int kCoefBytes = kCoefWarp ? 2 * 2 * BN * 4 : 0;
  // A non-persistent CTA's AccTile may reuse the stage ring: every load has been consumed by
  // then. Everything else gets its own space so the producer can keep loading.
  static constexpr bool kAliasRing = !kFragment && !Spec::PERSISTENT;
  static constexpr int kBarOffset =
      kAliasRing ? ((kEpiBytes > kRingBytes ? kEpiBytes : kRingBytes) + 15) / 16 * 16 : kRingBytes;
  static constexpr int kEpiAlign = kFragment ? FragEpi::kScratchAlign : 16;
  static constexpr int kEpiOffset =
      kAliasRing ? 0 : (kBarOffset + kBarBytes + kEpiAlign - 1) / kEpiAlign * kEpiAlign;
  static constexpr int kCoefOffset = kEpiOffset + (kEpiBytes + 15) / 16 * 16;
  static constexpr int kUsedBytes = kAliasRing ? kBarOffset + kBarBytes : kCoefOffset + kCoefBytes;
  // +1024: the dynamic shared memory base is only 16-byte aligned for sure, and the 128-byte
  // swizzle pattern (TMA and wgmma agree on it only from a 1024-byte aligned base) needs more.
  static constexpr int kSmemBytes = kUsedBytes + 1024;
  static_assert(kSmemBytes <= 232448, "warpspec: tile and stages exceed 227 KB of shared memory");

  // Registers per thread after the split (setmaxnreg, with two consumer warpgroups only: with
  // one, the launch cap of 255 already leaves the consumers all they need).
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  // grid.x for the launch (see the header comment).
  __host__ __device__ static constexpr int grid_size(int sm_count) {
    return CLUSTER * (Spec::PERSISTENT ? (kClusterTiles < sm_count / CLUSTER ? kClusterTiles
                                                                             : sm_count / CLUSTER)
                                       : kClusterTiles);
  }

  __device__ static void run(const Params& p, const TmaDescriptor& tx, const TmaDescriptor& tw,
                             const TmaDescriptor* ty) {
    extern __shared__ __align__(1024) unsigned char fj_warpspec_smem[];
    const unsigned raw = shared_addr(fj_warpspec_smem);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* smem = fj_warpspec_smem + (base - raw);
    const unsigned full0 = base + kBarOffset;
    const unsigned empty0 = full0 + 8 * STAGES;
    const unsigned coef_full0 = empty0 + 8 * STAGES;
    const unsigned coef_empty0 = coef_full0 + 16;
    const int warpgroup = threadIdx.x / 128;
    const unsigned rank = CLUSTER > 1 ? cluster_rank() : 0u;

    if (threadIdx.x == 0) {
      tma_prefetch(&tx);
      tma_prefetch(&tw);
      if constexpr (kTmaStore) tma_prefetch(ty);
      for (int s = 0; s < STAGES; ++s) {
        mbar_init(full0 + 8 * s, 1);
        // Every consumer warp of every CTA whose W half lands in this stage releases it.
        mbar_init(empty0 + 8 * s, 4 * kTeam * CLUSTER);
      }
      for (int b = 0; b < 2; ++b) {
        mbar_init(coef_full0 + 8 * b, 32);            // every lane of the coefficient warp
        mbar_init(coef_empty0 + 8 * b, 128 * kTeam);  // every thread of the team that used it
        mbar_init(coef_empty0 + 16 + 8 * b, 4);       // turn[b]: every warp of the other group
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
        produce(tx, tw, base, full0, empty0, rank);
      } else if (kCoefWarp && threadIdx.x / 32 == 1) {
        coefficients(p, reinterpret_cast<float*>(smem + kCoefOffset), coef_full0, coef_empty0, rank,
                     threadIdx.x % 32);
      }
    } else {
      if constexpr (CONSUMERS == 2) regs_acquire<kConsumerRegs>();
      consume(p, smem, base, full0, empty0, coef_full0, coef_empty0, rank, threadIdx.x - 128, ty);
    }
    // No CTA of a cluster may leave while its peer can still arrive on its barriers.
    if constexpr (CLUSTER > 1) cluster_sync();
  }

 private:
  struct TileCoord {
    int row, m0, n0;
  };
  __device__ __forceinline__ static TileCoord coord(int cluster_tile, unsigned rank) {
    const auto t = Raster::tile(cluster_tile);
    const int row = t.row * CLUSTER + static_cast<int>(rank);
    return {row, row * BM, t.col * BN};
  }
  __device__ __forceinline__ static int first_tile() {
    return static_cast<int>(blockIdx.x) / CLUSTER;
  }
  __device__ __forceinline__ static int tile_stride() {
    return Spec::PERSISTENT ? static_cast<int>(gridDim.x) / CLUSTER : kClusterTiles;
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

  __device__ static void produce(const TmaDescriptor& tx, const TmaDescriptor& tw, unsigned base,
                                 unsigned full0, unsigned empty0, unsigned rank) {
    int stage = 0;
    unsigned phase = 0;
    for (int ct = first_tile(); ct < kClusterTiles; ct += tile_stride()) {
      const TileCoord t = coord(ct, rank);
      for (int kt = 0; kt < kKTiles; ++kt) {
        const unsigned full = full0 + 8 * stage, empty = empty0 + 8 * stage;
        mbar_wait(empty, phase ^ 1u);
        // The whole W tile arrives in every CTA of the cluster (half of it from the peer).
        mbar_arrive_expect_tx(full, kStageBytes);
        const unsigned a_dst = base + stage * kStageBytes;
        const unsigned b_dst = a_dst + kAStage;
#pragma unroll
        for (int ka = 0; ka < kKAtoms; ++ka) {
          const int k = kt * BK + ka * kAtomK;
          tma_load_2d(a_dst + ka * kASlab, &tx, full, k, t.m0);
          if constexpr (CLUSTER == 1) {
            tma_load_2d(b_dst + ka * kBSlab, &tw, full, k, t.n0);
          } else {
            tma_load_2d_multicast(b_dst + ka * kBSlab + rank * kWBoxRows * 128, &tw, full, k,
                                  t.n0 + static_cast<int>(rank) * kWBoxRows,
                                  static_cast<unsigned short>((1u << CLUSTER) - 1u));
          }
        }
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1u;
        }
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
  __device__ static void coefficients(const Params& p, float* coef, unsigned coef_full0,
                                      unsigned coef_empty0, unsigned rank, int lane) {
    int runs = 0, runs0 = 0, runs1 = 0;
    int local = 0;
    for (int ct = first_tile(); ct < kClusterTiles; ct += tile_stride(), ++local) {
      const TileCoord t = coord(ct, rank);
      if (CLUSTER > 1 && t.m0 >= Spec::M) continue;
      const CoefSlot slot = coef_slot(local, runs, (local & 1) ? runs1 : runs0);
      mbar_wait(coef_empty0 + 8 * slot.buf, (slot.use & 1) ^ 1u);
      float* a = coef + slot.buf * 2 * BN;
      FragEpi::eval_coefficients(p, t.n0, a, a + BN, lane, 32);
      mbar_arrive(coef_full0 + 8 * slot.buf);  // release: our shared stores before the handoff
      ++runs;
      if (local & 1)
        ++runs1;
      else
        ++runs0;
    }
  }

  using Acc = float[kMAtoms][BN / 2];

  __device__ static void consume(const Params& p, unsigned char* smem, unsigned base,
                                 unsigned full0, unsigned empty0, unsigned coef_full0,
                                 unsigned coef_empty0, unsigned rank, int ctid,
                                 const TmaDescriptor* ty) {
    const int group = ctid / 128;  // consumer warpgroup
    const int lane = ctid % 32;
    // Rows of the stage's x tile this group multiplies, and its rank in its epilogue team.
    const int a_row0 = kPingpong ? 0 : group * kWgM;
    const int etid = kPingpong ? ctid % 128 : ctid;
    unsigned slice = 0;  // k-slices of this CTA's ring so far (all tiles, whoever used them)
    int runs = 0;        // epilogues this group ran
    int local = 0;       // this CTA's tiles so far
    // Pingpong turn-taking. A group may only wait on a stage barrier less than one ring lap
    // ahead of its last completed phase (parity waits cannot tell phase k from k + 2), so a
    // group starts its j-th mainloop only after the other group has issued its own previous
    // one: group 1's j-th follows group 0's j-th, group 0's j-th follows group 1's (j-1)-th.
    // turn[g] completes a phase each time the other group has issued a mainloop.
    const unsigned turn_mine = coef_empty0 + 16 + 8 * group;
    const unsigned turn_other = coef_empty0 + 16 + 8 * (group ^ 1);
    int loops = 0;  // mainloops this group ran
    Acc acc;
    for (int ct = first_tile(); ct < kClusterTiles; ct += tile_stride(), ++local) {
      if (kPingpong && (local & 1) != group) {
        slice += kKTiles;  // the other group's tile
        continue;
      }
      if constexpr (kPingpong) mbar_wait(turn_mine, (loops + group + 1) & 1);
      const TileCoord t = coord(ct, rank);
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) wgmma_fence_operands(acc[ma]);
      for (int kt = 0; kt < kKTiles; ++kt, ++slice) {
        const unsigned stage = slice % STAGES;
        mbar_wait(full0 + 8 * stage, (slice / STAGES) & 1u);
        const unsigned a_base = base + stage * kStageBytes + a_row0 * 128;
        const unsigned long long da = wgmma_desc_sw128(a_base);
        const unsigned long long db = wgmma_desc_sw128(base + stage * kStageBytes + kAStage);
        wgmma_fence();
#pragma unroll
        for (int ka = 0; ka < kKAtoms; ++ka)
#pragma unroll
          for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
            for (int ma = 0; ma < kMAtoms; ++ma) {
              // Descriptor addresses are in 16-byte units.
              const unsigned a_off = (ka * kASlab + ma * 64 * 128 + ks * 32) >> 4;
              const unsigned b_off = (ka * kBSlab + ks * 32) >> 4;
              Wgmma<T, BN>::mma(acc[ma], da + a_off, db + b_off, (kt | ka | ks) != 0 ? 1 : 0);
            }
        wgmma_commit();
        if (kt > 0) {
          // The slice before this one is done: hand its stage back to the producer(s).
          wgmma_wait<1>();
          release(empty0 + 8 * ((slice - 1) % STAGES), lane);
        }
      }
      if constexpr (kPingpong) {
        // Every slice of this tile has landed and its wgmma are issued: the other group may
        // start waiting on the ring now, while ours finish.
        if (lane == 0) mbar_arrive(turn_other);
        ++loops;
      }
      wgmma_wait<0>();
      release(empty0 + 8 * ((slice - 1) % STAGES), lane);
#pragma unroll
      for (int ma = 0; ma < kMAtoms; ++ma) wgmma_fence_operands(acc[ma]);

      // A CTA of the last cluster row may sit past M when row_tiles is odd: it only fed W.
      if (CLUSTER > 1 && t.m0 >= Spec::M) continue;
      if constexpr (kFragment) {
        const CoefSlot slot = coef_slot(local, runs, runs);
        const float* coef = nullptr;
        if constexpr (kCoefWarp) {
          mbar_wait(coef_full0 + 8 * slot.buf, slot.use & 1);
          coef = reinterpret_cast<const float*>(smem + kCoefOffset) + slot.buf * 2 * BN;
        }
        char* scratch = reinterpret_cast<char*>(smem + kEpiOffset);
        if (kPingpong && group == 1) {
          FragEpiOf<kPingpong ? 1 : 0>::run(p, acc, scratch + FragEpi::kScratchBytes, t.m0, t.n0,
                                            t.row, etid, coef);
        } else {
          FragEpi::run(p, acc, scratch, t.m0, t.n0, t.row, etid, coef, ty);
        }
        if constexpr (kCoefWarp) {
          // Every reader arrives itself (rather than one lane per warp after __syncwarp): each
          // thread's own release then orders its reads before the coefficient warp's next
          // writes, which is also what compute-sanitizer's racecheck can follow.
          mbar_arrive(coef_empty0 + 8 * slot.buf);
        }
        ++runs;
      } else {
        tile_epilogue(p, acc, smem, t, ctid);
      }
    }
    if constexpr (kFragment) FragEpi::drain(etid);
    // Single-pass train with a fixed momentum: nobody reads num_batches_tracked, so one thread
    // bumps it here (cumulative mode launches bump_batches after the GEMM instead).
    if constexpr (Spec::TRAIN && Spec::SINGLE_PASS && !Spec::CUMULATIVE) {
      if (blockIdx.x == 0 && ctid == 0 && p.num_batches_tracked) *p.num_batches_tracked += 1;
    }
  }

  // Every warp of this consumer group has finished reading the stage (its wgmma completed).
  __device__ __forceinline__ static void release(unsigned empty, int lane) {
    if (lane == 0) {
      if constexpr (CLUSTER == 1) {
        mbar_arrive(empty);
      } else {
#pragma unroll
        for (unsigned c = 0; c < CLUSTER; ++c) mbar_arrive_cluster(empty, c);
      }
    }
  }

  // Spills the accumulators into an fp32 AccTile and runs the shared BnEpilogue over it.
  __device__ static void tile_epilogue(const Params& p, Acc& acc, unsigned char* smem,
                                       const TileCoord& t, int ctid) {
    using Bar = NamedBarrier<1, NT>;
    const Tile tile{reinterpret_cast<float*>(smem + kEpiOffset)};
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
    TileEpi::run(p, tile, reinterpret_cast<float*>(smem + kEpiOffset + Tile::kBytes), t.m0, t.n0,
                 t.row, ctid, Bar{});
  }
};

}  // namespace fj
