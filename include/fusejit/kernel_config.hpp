// One struct describes a kernel configuration; its key() is the cache and tuning key. Public:
// PlanOptions can force one, and Plan::config() reports the one chosen.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/problem.hpp"

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

enum class Variant { tiled, warpspec };
std::string_view name(Variant);
Variant parse_variant(std::string_view);  // throws InvalidArgument("variant", ...)

struct KernelConfig {
  Variant variant = Variant::tiled;
  // CTA tile.
  int bm = 128, bn = 128, bk = 32;
  // tiled: warps along M and N. warpspec: consumer warpgroups (warps_m) stacked along M.
  int warps_m = 2, warps_n = 4;
  int stages = 3;
  // Tile raster: consecutive CTAs walk `group_m` row tiles before moving to the next column
  // tiles, so W's column tiles stay in L2.
  int group_m = 8;
  // warpspec: thread-block cluster along M (TMA multicast of W tiles); 1 = no cluster.
  int cluster_m = 1;
  // warpspec: persistent CTAs (one per SM, looping over tiles) instead of one CTA per tile.
  bool persistent = false;
  // warpspec, persistent, two consumers: each consumer warpgroup takes whole BM x BN tiles in
  // turn, so one's epilogue overlaps the other's mainloop (key suffix ".pp").
  bool pingpong = false;
  // warpspec, not pingpong, rows of y of whole 16-byte units: each consumer warp rounds its rows
  // of y into two small swizzled shared-memory boxes in turn and TMA stores them, so the copy
  // engine drains y while the warp goes on (key suffix ".ts").
  bool tma_store = false;
  // tiled: split-K. S > 1 CTAs per output tile each multiply a contiguous share of the k tiles
  // into an fp32 workspace slice; a second kernel adds the S slices in a fixed order and runs the
  // epilogue (key suffix ".k<S>"). For grids too small to fill the GPU with a long K. The
  // backward pass's gradient GEMMs split on warpspec too (BackwardConfig).
  int split_k = 1;
  static constexpr int kMaxSplitK = 32;
  // Compile the kernels for the problem's exact M (key suffix ".xm") instead of reading the row
  // count at run time. Without it one compiled kernel set serves every M of a layer (same N, K,
  // dtype, mode, flags, strides) in its schedule class (KernelSchedule); with it M is a
  // compile-time constant, which the tuner may find faster.
  bool exact_m = false;
  // Train with more rows than one tile (the two-pass class): run the GEMM twice instead of
  // storing y and rewriting it. The first pass only reduces the column statistics (no y), the
  // finalize folds them into each column's affine, and the second pass stores y = A a + B from
  // its accumulators (key suffix ".rc"). Costs a second mainloop, saves y's round trip through
  // memory: the cheaper of the two when K is small against y's bytes.
  bool recompute = false;
  // warpspec, for rows TMA cannot load (a row stride or pointer not 16-byte aligned: odd K in
  // 16-bit types, K % 4 != 0 in fp32, odd ldx/ldw/ldy, sliced tensors): a copy kernel first
  // writes x and W into 128-byte aligned rows in the plan's workspace, which the GEMM then
  // loads with TMA; y is stored as aligned as the problem allows (key suffix ".pad").
  bool pad_operands = false;
  // warpspec, with recompute, cluster_m 1, not pingpong: when all of a run's tiles fit on the GPU
  // at once (one CTA per tile, a cooperative launch), the first pass finishes the job itself:
  // every CTA writes its tile's column partials, waits at a grid barrier, merges its columns over
  // all row tiles and stores y = A a + B from the accumulators it still holds. One kernel, no
  // second mainloop; the results are recompute's bit for bit. Runs whose tiles do not fit take
  // recompute's three kernels (key suffix ".gs" after ".rc").
  bool grid_sync = false;
  // warpspec, persistent, train with more rows than one tile (the two-pass class), cluster_m 1,
  // not pingpong, not recompute, not tf32x3, no synchronized statistics, 16-byte aligned rows of
  // y: BatchNorm's second pass inside the GEMM. The tiles are walked column panel by column
  // panel (group_m then counts the column tiles of a group, walked across each row tile in turn),
  // and the producer warpgroup's idle warps merge finished panels' statistics and rewrite their
  // y while later panels are still multiplied (the consumers join after their last tile); a
  // cooperative launch, no fj_finalize or fj_apply unless the driver refuses it (then the
  // two-pass passes run). y, saved and the statistics are the two-pass schedule's bit for bit
  // (key suffix ".oa"). It takes 6 KiB of shared memory beside the stages (with 128x256 tiles,
  // four stages fit only with TMA stores of y). Opt-in: measured slower than two-pass
  // (docs/performance.md).
  bool overlap_apply = false;
  // With recompute, K <= 64: the column statistics come from x before the GEMM, as
  // mean_a = W xbar and var_a[n] = w_n^T S w_n with S x's centred K x K covariance, reduced in
  // one read of x by a cooperative kernel (fj_input_stats), which also records them; then the
  // affine GEMM, the run's only pass over y. Where a column's quadratic form cancels more than
  // its dtype allows (correlated features and a weight row that takes their difference), the
  // same kernel takes that column's statistics from a = x w_n itself, on the device, with no
  // host sync; where the driver refuses the cooperative launch, the run is recompute's (key
  // suffix ".cv" after ".rc"). Tuner candidates (twins of the first three warpspec configs and
  // the first tiled one), never the heuristic's pick: measured 4-17% faster than recompute at
  // 65536x256x64, 16384x1024x64 and 131072x128x32 bf16 but 15-20% slower at 4096x4096x64 and
  // 8192x512x64 (docs/performance.md).
  bool input_stats = false;

  int threads() const;
  // Dynamic shared memory bytes the GEMM kernel needs (stages and the epilogue's tile).
  int smem_bytes(const Problem&) const;
  // Dynamic shared memory bytes of the split-K reduce kernel (its AccTile and the epilogue's
  // scratch for its own thread count); 0 without split-K.
  int splitk_reduce_smem_bytes() const;
  // Empty when the config can run `problem` on `device`, else why not (shared memory, tile
  // shape vs. MMA shape, variant vs. architecture or dtype).
  std::string why_invalid(const Problem& problem, const Device& device) const;
  bool valid_for(const Problem& p, const Device& d) const { return why_invalid(p, d).empty(); }
  // Stable text naming every field, e.g. "tiled.128x128x32.w2x4.s3.g8", with ".k8" appended
  // for split_k = 8 (nothing for 1, so keys from before split-K are unchanged); warpspec keys
  // put ".k8" after ".p<0|1>" and end in ".pp" for pingpong and ".ts" for tma_store; then
  // pad_operands appends ".pad",
  // recompute ".rc", input_stats ".cv", grid_sync ".gs", overlap_apply ".oa", exact_m ".xm".
  std::string key() const;
  // Inverse of key(); throws InvalidArgument("config", ...).
  static KernelConfig parse(std::string_view key);
};

}  // namespace fusejit
#pragma GCC visibility pop
