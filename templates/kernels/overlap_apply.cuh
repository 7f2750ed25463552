// Train, two-pass, KernelConfig::overlap_apply (Spec::OVERLAP_APPLY): BatchNorm's second pass
// inside the persistent warpspec GEMM, while later tiles are still in the mainloop.
//
// Why: the two-pass schedule writes y = a - tile_mean and the per-tile partials, then
// fj_finalize merges the partials and fj_apply rewrites all of y after the GEMM has ended: on
// 4096^3 bf16 that is ~18 us of DRAM traffic plus the finalize's ~5 us on top of a ~180 us GEMM
// whose DRAM is mostly idle. Here the tiles are walked column panel by column panel
// (PanelRaster), so panels finish in order, and the producer warpgroup's idle warps 1-3 of every
// CTA merge finished panels' partials (fj_finalize's order: the same statistics bit for bit)
// and rewrite their y (fj_apply's arithmetic: the same y bit for bit) while the consumers
// multiply later panels. The consumers only count their stored tiles in shared memory; when
// they have no tile left they join the queue, which shortens the tail (the last panels finish
// with the last tiles).
//
// Protocol (counters in Params::ws_overlap, OverlapCounters):
//  - the launch is cooperative (every CTA resident): CTA 0's apply leader zeroes the counters,
//    then every CTA's apply leader passes the grid barrier and arrives on its CTA's `ready`
//    mbarrier; nobody touches a counter before. Zeroed in the kernel rather than by a memset
//    per run: callers pass workspaces fresh from their allocators.
//  - a stored tile: each consumer warp arrives on Shared::stored (release, CTA scope; TMA stores
//    written and fenced first, a few k-slices into the next tile's mainloop); the apply leader
//    adds the CTA's stored tiles to their panels' counts (acq_rel, GPU scope), also between
//    its team's bulk fills.
//  - one queue of items in order: per panel, kStrips merge strips of 32 columns (runnable when
//    the panel's count is complete; a team merges the strip's columns and counts the strip) and
//    then one apply unit per row tile (runnable when every strip of the panel is counted). The
//    last strip merged bumps num_batches_tracked (every merge read it before).
//  - the apply leader claims the queue's head only once it is runnable (compare-and-swap), so
//    its team never holds an item that waits; it leaves when its CTA's tiles are all counted,
//    which is when its consumers join. The consumers claim with an atomic add and wait for
//    their item: only tile counts and earlier items, all claimed by teams that run them, can
//    hold it up.
#pragma once
#include "common/column_stats.h"
#include "common/grid_barrier.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/spec_flag.cuh"
#include "common/types.cuh"
#include "epilogue/bn_math.cuh"
#include "epilogue/column_merge.cuh"
#include "epilogue/store.cuh"
#include "kernels/bn_apply.cuh"
#include "mainloop/mbarrier.cuh"
#include "mainloop/tma.cuh"

namespace fj {

FJ_SPEC_FLAG(OverlapApply, OVERLAP_APPLY, false);

__device__ __forceinline__ unsigned atom_add_acq_rel_gpu(unsigned* a, unsigned v) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(a), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* a) {
  unsigned v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}

// The words of Params::ws_overlap (the host sizes the region with the same count, in
// workspace_layout).
template <int COL_TILES>
struct OverlapCounters {
  static constexpr int kWords = 2 * COL_TILES + 2;
  unsigned* base;
  // Row tiles stored and counted, per panel.
  __device__ __forceinline__ unsigned* tiles_done(int panel) const { return base + panel; }
  // Merge strips done, per panel.
  __device__ __forceinline__ unsigned* strips_done(int panel) const {
    return base + COL_TILES + panel;
  }
  __device__ __forceinline__ unsigned* next_item() const { return base + 2 * COL_TILES; }
  __device__ __forceinline__ unsigned* strips_total() const { return base + 2 * COL_TILES + 1; }
};

template <class Spec>
struct OverlapApplyOps {
  using T = typename Spec::T;
  static constexpr int BM = Spec::BM, BN = Spec::BN;
  static constexpr int kColTiles = (Spec::N + BN - 1) / BN;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kRowVecs = BN / kVec;  // 16-byte units of a tile row
  static_assert(Spec::VEC_BYTES == 16, "overlap_apply: y's rows must be 16-byte aligned");
  // A merge strip's columns, and fj_finalize's groups of row tiles (one lane each).
  static constexpr int kStripCols = 32;
  static constexpr int kStrips = BN / kStripCols;
  static_assert(BN % kStripCols == 0, "overlap_apply: whole merge strips per panel");
  static constexpr int kGroups = FinalizeShape<Spec>::kGroups;
  static_assert(32 % kGroups == 0, "overlap_apply: a column's groups share a warp");
  using Counters = OverlapCounters<kColTiles>;

  // The apply warps' rows travel by bulk copies (apply_tile_bulk): per warp kSlotsPerWarp slots
  // of kSlotBytes, a tile row (or several) each. 6 KiB fits in the ~7 KiB that the 128x256
  // tiles' four stages leave of 227 KiB; KernelConfig::why_invalid refuses configs it does not.
  static constexpr int kApplyWarps = 3, kSlotsPerWarp = 2, kSlotBytes = 1024;
  static constexpr int kRowBytes = BN * static_cast<int>(sizeof(T));
  static constexpr bool kBulkRows = kRowBytes <= kSlotBytes && kSlotBytes % kRowBytes == 0;
  static constexpr int kSlotRows = kBulkRows ? kSlotBytes / kRowBytes : 1;

  // What the kernel's SharedStorage holds for this (sizeof: KernelConfig::smem_bytes adds it).
  struct alignas(16) Shared {
    char slot[kApplyWarps][kSlotsPerWarp][kSlotBytes];
    MbarrierSlot slot_full[kApplyWarps][kSlotsPerWarp];  // a slot's rows have landed
    unsigned slot_loads[kApplyWarps];  // fills each warp has issued: its slots' phases
    MbarrierSlot ready;  // the counters are zeroed (one arrival: this CTA's apply leader)
    unsigned stored;     // consumer warps' arrivals, one per warp and stored tile
    int task;            // the apply warps' next item (their leader's pick), -1: done
    int tail_item;       // the item the consumers' tail claimed
    // The apply leader's state, here rather than in registers (the apply warps have 56):
    int counted;  // this CTA's tiles counted so far
  };
  static_assert(sizeof(Shared) == 6240,
                "overlap_apply: KernelConfig::smem_bytes counts 6240 bytes");

  // The kernel's first thread, with the other barriers: the slots' barriers and counts.
  __device__ static void init_slots(Shared& sh) {
    for (int w = 0; w < kApplyWarps; ++w) {
      sh.slot_loads[w] = 0u;
      for (int i = 0; i < kSlotsPerWarp; ++i) mbar_init(shared_addr(&sh.slot_full[w][i]), 1u);
    }
  }

  __device__ __forceinline__ static Counters counters(const Params& p) { return {p.ws_overlap}; }

  // The apply leader of each CTA, first thing: counters zeroed before anyone uses them.
  __device__ static void begin(const Params& p, Mbarrier ready) {
    if (blockIdx.x == 0) {
      for (int i = 0; i < Counters::kWords; ++i) p.ws_overlap[i] = 0u;
    }
    grid_barrier_arrive_and_wait();
    ready.arrive();
  }

  // Every consumer thread, once per tile, after its stores of y and the tile's partials: one
  // arrival per warp on Shared::stored (release, CTA scope), which the apply leader turns into
  // the panel's count. TMA_STORE: the warp's stores of y must have been written, not only read
  // from shared memory, and ordered before the generic-proxy release; the kernel calls this for
  // the previous tile a few k-slices into the next mainloop (WarpspecGemm::kCountAtSlice).
  template <bool TMA_STORE>
  __device__ __forceinline__ static void tile_stored(Shared& sh, int tid) {
    __syncwarp();
    if (tid % 32 == 0) {
      if constexpr (TMA_STORE) {
        bulk_wait<0>();
        fence_async_global();
      }
      asm volatile("red.release.cta.shared::cta.add.u32 [%0], 1;" ::"r"(shared_addr(&sh.stored))
                   : "memory");
    }
  }

  // The producer warpgroup's warps 1-3 (THREADS threads from tid 0, barrier BAR) until every
  // tile of this CTA is counted. The leader counts the CTA's stored tiles (TILE_WARPS arrivals
  // each; `panel_of(k)` is the column tile of its k-th of `own_tiles` tiles), claims the queue's
  // head when it can run and hands it to the team, and otherwise waits a little (see the header).
  template <int THREADS, int BAR, int IN_FLIGHT, int TILE_WARPS, class PanelOf>
  __device__ static void apply_warps(const Params& p, Shared& sh, PanelOf panel_of, int own_tiles,
                                     int tid) {
    const Counters ctr = counters(p);
    const int row_tiles = row_tiles_of<Spec>(p);
    const int items = queue_items(row_tiles);
    if (tid == 0) sh.counted = 0;
    for (;;) {
      sync<BAR, THREADS>();  // the team has read the previous item (and run it)
      if (tid == 0) {
        int task = -1;
        for (;;) {
          count_stored<TILE_WARPS>(sh, ctr, panel_of, own_tiles);
          // Every tile of this CTA counted: its consumers are in the queue, with far more bytes
          // in flight than these warps, so what is left is theirs.
          if (sh.counted == own_tiles) break;
          // The queue's next item, claimed only once it can run: a claim that waited would run
          // late, here, instead of by the consumers that are free by then.
          const int i = static_cast<int>(*reinterpret_cast<volatile unsigned*>(ctr.next_item()));
          if (i < items && runnable(ctr, i, row_tiles)) {
            if (atomicCAS(ctr.next_item(), static_cast<unsigned>(i),
                          static_cast<unsigned>(i + 1)) == static_cast<unsigned>(i)) {
              task = i;
              break;
            }
            continue;
          }
          __nanosleep(128);
        }
        sh.task = task;
      }
      sync<BAR, THREADS>();
      const int task = sh.task;
      if (task < 0) return;
      // The leader keeps counting between a bulk apply's fills (merges and the register path do
      // not poll): a tile left uncounted holds up its panel's merges and applies on every CTA.
      run_item<THREADS, BAR, IN_FLIGHT, true>(p, sh, task, row_tiles, tid, [&] {
        count_stored<TILE_WARPS>(sh, ctr, panel_of, own_tiles);
      });
    }
  }

  // The consumers (THREADS threads from tid 0, barrier BAR), once their tiles are stored: items
  // until the queue is empty, waiting for each to become runnable (the apply warps count the
  // tiles, so waiting here holds nothing up).
  template <int THREADS, int BAR, int IN_FLIGHT>
  __device__ static void apply_tail(const Params& p, Shared& sh, Mbarrier ready, int tid) {
    const Counters ctr = counters(p);
    const int row_tiles = row_tiles_of<Spec>(p);
    const int items = queue_items(row_tiles);
    for (;;) {
      sync<BAR, THREADS>();  // the team has read the previous claim
      if (tid == 0) {
        ready.wait(0);
        const int i = static_cast<int>(atomicAdd(ctr.next_item(), 1u));
        if (i < items) {
          while (!runnable(ctr, i, row_tiles)) __nanosleep(128);
        }
        sh.tail_item = i < items ? i : -1;
      }
      sync<BAR, THREADS>();
      const int i = sh.tail_item;
      if (i < 0) return;
      run_item<THREADS, BAR, IN_FLIGHT, false>(p, sh, i, row_tiles, tid, [] {});
    }
  }

 private:
  // The apply leader: counts every stored tile of its CTA that has arrived (TILE_WARPS arrivals
  // each) into its panel's count; `panel_of(k)` is the column tile of its k-th of `own_tiles`.
  template <int TILE_WARPS, class PanelOf>
  __device__ __forceinline__ static void count_stored(Shared& sh, const Counters& ctr,
                                                      PanelOf panel_of, int own_tiles) {
    for (;;) {
      unsigned arrivals;
      asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];"
                   : "=r"(arrivals)
                   : "r"(shared_addr(&sh.stored))
                   : "memory");
      const int counted = sh.counted;
      if (counted >= own_tiles || arrivals < static_cast<unsigned>((counted + 1) * TILE_WARPS))
        return;
      sh.counted = counted + 1;
      atom_add_acq_rel_gpu(ctr.tiles_done(panel_of(counted)), 1u);
    }
  }

  template <int BAR, int COUNT>
  __device__ __forceinline__ static void sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(COUNT) : "memory");
  }

  // Items per panel: its merge strips, then its row tiles' apply units. (Their total is at most
  // the run's tiles plus kStrips per column tile, well inside int: KernelConfig::why_invalid
  // keeps twice the tiles inside it.)
  __device__ __forceinline__ static int queue_items(int row_tiles) {
    return kColTiles * (kStrips + row_tiles);
  }
  struct Item {
    int panel, index;
    bool merge;  // merge strip `index`, else apply row tile `index`
  };
  __device__ __forceinline__ static Item item(int i, int row_tiles) {
    const int per = kStrips + row_tiles;
    const int j = i % per;
    return {i / per, j < kStrips ? j : j - kStrips, j < kStrips};
  }
  __device__ __forceinline__ static bool runnable(const Counters& ctr, int i, int row_tiles) {
    const Item it = item(i, row_tiles);
    return it.merge ? ld_acquire_gpu(ctr.tiles_done(it.panel)) == static_cast<unsigned>(row_tiles)
                    : ld_acquire_gpu(ctr.strips_done(it.panel)) == static_cast<unsigned>(kStrips);
  }

  // BULK: the apply warps, whose rows go through their slots (apply_tile_bulk) where it can.
  // `poll`: what the team's first thread does between a bulk apply's slot fills.
  template <int THREADS, int BAR, int IN_FLIGHT, bool BULK, class Poll>
  __device__ __forceinline__ static void run_item(const Params& p, Shared& sh, int i, int row_tiles,
                                                  int tid, Poll poll) {
    const Item it = item(i, row_tiles);
    if (it.merge) {
      merge_strip<THREADS, BAR>(p, it.panel, it.index, tid);
    } else if (BULK && bulk_rows(p, it.panel)) {
      static_assert(!BULK || THREADS == 32 * kApplyWarps, "overlap_apply: a slot pair per warp");
      apply_tile_bulk(p, sh, it.panel, it.index, tid, poll);
    } else {
      apply_tile<THREADS, IN_FLIGHT>(p, it.panel, it.index, tid);
    }
  }

  // fj_finalize's work for merge strip `strip` of `panel` (bn_finalize: the same merge order,
  // the same folding, the same record), then the strip counted. A lane per (column, group of
  // row tiles): group g chains row tiles g, g + kGroups, ... as merge_column_in_finalize_order
  // does, then the column's first lane merges the groups in order 0, 1, ... from its
  // neighbours' registers, skipping empty ones: the same operations on the same values.
  template <int THREADS, int BAR>
  __device__ static void merge_strip(const Params& p, int panel, int strip, int tid) {
    constexpr int kColsPerPass = THREADS / kGroups;
    static_assert(THREADS % 32 == 0 && kColsPerPass >= 1, "overlap_apply: whole warps per pass");
    const int m = rows_of<Spec>(p);
    const int row_tiles = row_tiles_of<Spec>(p);
    const float rows = static_cast<float>(m);
    const float factor = momentum_factor<Spec>(p);
    const float2* partials = reinterpret_cast<const float2*>(p.ws_partials);
    const int g = tid % kGroups;
    const int lane = tid % 32;
    for (int c0 = 0; c0 < kStripCols; c0 += kColsPerPass) {
      const int c = c0 + tid / kGroups;
      const int n = panel * BN + strip * kStripCols + c;
      const bool live = c < kStripCols && n < Spec::N;
      float gc = 0.f, gmean = 0.f, gm2 = 0.f;
      if (live) {
        constexpr int kBatch = 4;  // loads in flight before their merges
        for (int t0 = g; t0 < row_tiles; t0 += kBatch * kGroups) {
          float2 pm[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int t = t0 + u * kGroups;
            pm[u] = t < row_tiles ? partials[static_cast<long long>(t) * Spec::N + n] : float2{};
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int t = t0 + u * kGroups;
            if (t < row_tiles)
              chan_merge(gc, gmean, gm2, static_cast<float>(min(BM, m - t * BM)), pm[u].x, pm[u].y);
          }
        }
      }
      float cnt = gc, mean = gmean, m2 = gm2;
#pragma unroll 1
      for (int u = 1; u < kGroups; ++u) {
        const int src = lane - g + u;
        const float oc = __shfl_sync(0xffffffffu, gc, src);
        const float om = __shfl_sync(0xffffffffu, gmean, src);
        const float o2 = __shfl_sync(0xffffffffu, gm2, src);
        if (g == 0 && oc > 0.f) chan_merge(cnt, mean, m2, oc, om, o2);
      }
      if (live && g == 0) {
        const Affine f = train_column<Spec>(p, n, mean, m2 / rows, factor, true);
        store_column_coefficients(p, n, f, mean);
      }
    }
    sync<BAR, THREADS>();  // every column's writes before the count's release
    if (tid == 0) {
      const Counters ctr = counters(p);
      atom_add_acq_rel_gpu(ctr.strips_done(panel), 1u);
      const unsigned total = atom_add_acq_rel_gpu(ctr.strips_total(), 1u) + 1u;
      if (total == static_cast<unsigned>(kColTiles * kStrips) && p.num_batches_tracked)
        *p.num_batches_tracked += 1;
    }
  }

  // y = a d + b of column n in row tile `row`: bn_apply's A and B' = A tile_mean + B, the same
  // expressions (hence bits); 0 past N.
  __device__ __forceinline__ static void unit_affine(const Params& p, int row, int n, int n_here,
                                                     float (&a)[kVec], float (&b)[kVec]) {
    const float4* coef = reinterpret_cast<const float4*>(p.ws_coef);
    const float2* tile_stats =
        reinterpret_cast<const float2*>(p.ws_partials) + static_cast<long long>(row) * Spec::N;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      a[j] = b[j] = 0.f;
      if (j < n_here) {
        const float4 abm = coef[n + j];
        a[j] = abm.x;
        b[j] = abm.x * tile_stats[n + j].x + abm.y;
      }
    }
  }

  // Whether panel's rows can go through the slots: whole 16-byte units (a bulk copy's size
  // granule; y's rows are 16-byte aligned, Spec::VEC_BYTES), and no `saved`, which the register
  // path writes from the same d in a pass of its own.
  __device__ __forceinline__ static bool bulk_rows(const Params& p, int panel) {
    if constexpr (!kBulkRows) {
      return false;
    } else {
      const int cols = min(BN, Spec::N - panel * BN);
      return !p.saved && (cols * static_cast<int>(sizeof(T))) % 16 == 0;
    }
  }

  // apply_tile for the apply warps: rows reach shared memory by bulk copies instead of
  // registers. Why: the apply warps have 56 registers, which left a 16-byte unit of one row in
  // flight per thread, 1-1.5 KiB per SM: far too few bytes for DRAM's latency, so the applies
  // fell behind the panels and ended up in the tail (docs/performance.md, "The apply warps' rows
  // by bulk copies"). A slot in flight costs no registers: each warp's other slot loads while
  // it rewrites the rows of the one that landed, up to 6 KiB per SM. Warp w takes slot fills
  // w, w + 3, ... of the tile (kSlotRows rows each); lane l rewrites the slot's 16-byte units l
  // and l + 32 (kSlotBytes = 64 units) and stores them itself, so a slot is free again once the
  // warp has read it.
  template <class Poll>
  __device__ static void apply_tile_bulk(const Params& p, Shared& sh, int panel, int row, int tid,
                                         Poll poll) {
    constexpr int kUnits = kSlotBytes / 16, kRowUnits = kRowBytes / 16;
    static_assert(kUnits == 64, "overlap_apply: a lane rewrites two units of a slot");
    const int warp = tid / 32, lane = tid % 32;
    const int n0 = panel * BN, m0 = row * BM;
    const int rows = min(BM, rows_of<Spec>(p) - m0);
    const int cols = min(BN, Spec::N - n0);
    const unsigned row_bytes = static_cast<unsigned>(cols) * sizeof(T);
    const int fills = (rows + kSlotRows - 1) / kSlotRows;
    T* y = static_cast<T*>(p.y) + static_cast<long long>(m0) * Spec::LDY + n0;
    // Unit u of a slot is row u / kRowUnits of the fill, columns (u % kRowUnits) kVec + [0, kVec).
    // When a row is at most 32 units, a lane's two units share their columns.
    constexpr bool kSameCols = 32 % kRowUnits == 0;
    const int c0 = (lane % kRowUnits) * kVec, c1 = ((lane + 32) % kRowUnits) * kVec;
    float a0[kVec], b0[kVec];
    unit_affine(p, row, n0 + c0, min(kVec, cols - c0), a0, b0);
    float a1[kSameCols ? 1 : kVec], b1[kSameCols ? 1 : kVec];
    if constexpr (!kSameCols) unit_affine(p, row, n0 + c1, min(kVec, cols - c1), a1, b1);

    const unsigned slots = shared_addr(&sh.slot[warp][0][0]);
    const unsigned bars = shared_addr(&sh.slot_full[warp][0]);
    unsigned done = sh.slot_loads[warp];  // fills this warp has waited for, over all tiles
    unsigned issued = done;
    int next = warp;  // the next fill to issue
    // The panel's stores (other CTAs' TMA stores included) were acquired in the generic proxy.
    if (lane == 0) fence_async_global();
    auto issue = [&]() {
      if (lane == 0) {
        const unsigned slot = issued % kSlotsPerWarp;
        const unsigned bar = bars + slot * static_cast<unsigned>(sizeof(MbarrierSlot));
        const int r0 = next * kSlotRows;
        const int n = min(kSlotRows, rows - r0);
        mbar_arrive_expect_tx(bar, static_cast<unsigned>(n) * row_bytes);
        for (int r = 0; r < n; ++r)
          bulk_load_1d(slots + slot * kSlotBytes + r * kRowBytes,
                       y + static_cast<long long>(r0 + r) * Spec::LDY, row_bytes, bar);
      }
      ++issued;
      next += kApplyWarps;
    };
    for (int i = 0; i < kSlotsPerWarp && next < fills; ++i) issue();
    for (int f = warp; f < fills; f += kApplyWarps, ++done) {
      const unsigned slot = done % kSlotsPerWarp;
      mbar_wait(bars + slot * static_cast<unsigned>(sizeof(MbarrierSlot)),
                (done / kSlotsPerWarp) & 1u);
      const char* src = sh.slot[warp][slot];
      const int r0 = f * kSlotRows;
      // One unit at a time (56 registers); the slot is refilled once both are read.
      const int ra = r0 + lane / kRowUnits;
      if (ra < rows && c0 < cols) {
        Packed<T, kVec> d;
        d.load(reinterpret_cast<const T*>(src + 16 * lane));
        float v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = a0[j] * d.get(j) + b0[j];
        store_vec<T, kVec>(y + static_cast<long long>(ra) * Spec::LDY + c0, v);
      }
      const int rb = r0 + (lane + 32) / kRowUnits;
      if (rb < rows && c1 < cols) {
        Packed<T, kVec> d;
        d.load(reinterpret_cast<const T*>(src + 16 * (lane + 32)));
        float v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          if constexpr (kSameCols)
            v[j] = a0[j] * d.get(j) + b0[j];
          else
            v[j] = a1[j] * d.get(j) + b1[j];
        }
        store_vec<T, kVec>(y + static_cast<long long>(rb) * Spec::LDY + c1, v);
      }
      __syncwarp();  // every lane has read the slot: refill it
      if (next < fills) issue();
      if (tid == 0) poll();
    }
    __syncwarp();
    if (lane == 0) sh.slot_loads[warp] = done;
  }

  // Tile (row tile `row`, column tile `panel`) of y: d -> A d + (A tile_mean + B), and `saved`
  // c = d + (tile_mean - mean_a): bn_apply's expressions, hence its bits. A thread keeps one
  // 16-byte column unit and walks rows; `saved` goes first, in a pass of its own (it needs d,
  // which y's pass overwrites), so that only one pass's coefficients are live at a time: the
  // apply warps have 56 registers.
  template <int THREADS, int IN_FLIGHT>
  __device__ __forceinline__ static void apply_tile(const Params& p, int panel, int row, int tid) {
    constexpr int kRowStep = THREADS / kRowVecs;  // rows the team covers at once
    static_assert(kRowStep >= 1, "overlap_apply: a team must cover a tile row");
    const int r0 = tid / kRowVecs;
    if (r0 >= kRowStep) return;
    const int n = panel * BN + (tid % kRowVecs) * kVec;
    if (n >= Spec::N) return;
    const int m0 = row * BM;
    const int rows = min(BM, rows_of<Spec>(p) - m0);
    const int n_here = min(kVec, Spec::N - n);
    const float4* coef = reinterpret_cast<const float4*>(p.ws_coef);
    const float2* tile_stats =
        reinterpret_cast<const float2*>(p.ws_partials) + static_cast<long long>(row) * Spec::N;
    T* y = static_cast<T*>(p.y) + static_cast<long long>(m0) * Spec::LDY + n;
    if (p.saved) {
      float off[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        off[j] = j < n_here ? tile_stats[n + j].x - coef[n + j].z : 0.f;
      T* saved = static_cast<T*>(p.saved) + static_cast<long long>(m0) * Spec::LDY + n;
      rewrite<IN_FLIGHT, kRowStep>(y, saved, rows, r0, n_here,
                                   [&](int j, float d) { return d + off[j]; });
    }
    float a[kVec], b[kVec];
    unit_affine(p, row, n, n_here, a, b);
    rewrite<IN_FLIGHT, kRowStep>(y, y, rows, r0, n_here,
                                 [&](int j, float d) { return a[j] * d + b[j]; });
  }

  // out[r][j] = f(j, in[r][j]) over rows r0, r0 + STEP, ... < rows of a 16-byte unit (n_here of
  // its kVec elements inside N), IN_FLIGHT rows' loads before their stores.
  template <int IN_FLIGHT, int STEP, class F>
  __device__ __forceinline__ static void rewrite(const T* in, T* out, int rows, int r0, int n_here,
                                                 F f) {
    if (n_here < kVec) {
      for (int r = r0; r < rows; r += STEP)
        for (int j = 0; j < n_here; ++j) {
          const long long off = static_cast<long long>(r) * Spec::LDY + j;
          out[off] = from_float<T>(f(j, to_float(in[off])));
        }
      return;
    }
    for (int r = r0; r < rows; r += STEP * IN_FLIGHT) {
      Packed<T, kVec> raw[IN_FLIGHT];
#pragma unroll
      for (int i = 0; i < IN_FLIGHT; ++i)
        if (r + i * STEP < rows) raw[i].load(in + static_cast<long long>(r + i * STEP) * Spec::LDY);
#pragma unroll
      for (int i = 0; i < IN_FLIGHT; ++i) {
        if (r + i * STEP >= rows) break;
        float v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = f(j, raw[i].get(j));
        store_vec<T, kVec>(out + static_cast<long long>(r + i * STEP) * Spec::LDY, v);
      }
    }
  }
};

}  // namespace fj
