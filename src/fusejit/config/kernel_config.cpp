#include "fusejit/config/candidates.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "common/input_stats.h"
#include "common/limits.h"
#include "common/tma_store_box.h"
#include "fusejit/error.hpp"

namespace fusejit {

std::string_view name(Variant v) {
  return v == Variant::tiled ? "tiled" : "warpspec";
}

Variant parse_variant(std::string_view s) {
  if (s == "tiled") return Variant::tiled;
  if (s == "warpspec") return Variant::warpspec;
  throw InvalidArgument("variant", "expected tiled or warpspec; got '" + printable(s) + "'");
}

std::int64_t k_tiles(const Problem& p, int bk) {
  return (p.K + bk - 1) / bk;
}

std::int64_t output_tiles(const Problem& p, const KernelConfig& c) {
  return ((p.M + c.bm - 1) / c.bm) * ((p.N + c.bn - 1) / c.bn);
}

namespace {

// The tiled epilogue's shared memory with `threads` threads: the fp32 AccTile (rows padded by 8
// floats) and BnEpilogue's scratch (A, B and one column partial per thread sharing a column).
int tiled_epilogue_bytes(int bm, int bn, int threads) {
  const int tpc = threads >= bn ? threads / bn : 1;
  return bm * (bn + 8) * 4 + (2 * bn + tpc * bn) * 4;
}

// The tiled mainloops' cp.async ring (TiledMmaMainloop / SimtFp32Mainloop::kSmemBytes; the
// SIMT one stages rows padded by 4 floats per operand).
int tiled_ring_bytes(const Problem& p, const KernelConfig& c) {
  return p.dtype == DType::fp32
             ? c.stages * c.bk * (c.bm + c.bn + 8) * 4
             : c.stages * (c.bm + c.bn) * c.bk * static_cast<int>(storage_bytes(p.dtype));
}

// The 32-bit counts the kernels derive from the problem and the tile, computed exactly here:
// empty when each fits, else which one does not. Each rule names what it mirrors.
std::string int32_counts_why_invalid(const Problem& p, const KernelConfig& c, const Device& d) {
  const std::int64_t row_tiles = (p.M + c.bm - 1) / c.bm, col_tiles = (p.N + c.bn - 1) / c.bn;
  auto too_many = [&](const char* what, std::int64_t v) {
    return fmt::format(
        "{} = {} does not fit the kernels' 32-bit int for {}x{}x{} (fewer rows or columns, or "
        "larger tiles)",
        what, v, p.M, p.N, p.K);
  };
  if (p.mode == Mode::train && p.M > c.bm) {
    // Two-pass train runs bn_apply: ApplyShape::kBlocks (kernels/bn_apply.cuh) on grid.x, one
    // block per kApplyBlockRows rows x kApplyColThreads x VEC columns (VEC as codegen derives
    // it from the alignment).
    const int vec = std::max(
        1, std::min(p.effective_alignment(), 16) / static_cast<int>(storage_bytes(p.dtype)));
    const std::int64_t cols = std::int64_t{fj::kApplyColThreads} * vec;
    const std::int64_t blocks =
        (p.N + cols - 1) / cols * ((p.M + fj::kApplyBlockRows - 1) / fj::kApplyBlockRows);
    if (!fj::fits_int(blocks)) return too_many("BatchNorm apply blocks", blocks);
  }
  if (c.variant == Variant::tiled) {
    // GroupedRaster::kTiles (kernels/tile_scheduler.cuh): one CTA per tile on grid.x.
    if (!fj::fits_int(row_tiles * col_tiles))
      return too_many("row tiles x column tiles", row_tiles * col_tiles);
    // GroupedRaster's kPerGroup.
    if (!fj::fits_int(std::int64_t{c.group_m} * col_tiles))
      return too_many("group_m x column tiles", std::int64_t{c.group_m} * col_tiles);
    return {};
  }
  // WarpspecGemm (kernels/warpspec_gemm.cuh): its static_assert on twice kClusterTiles (the
  // grid and the tile loops' last step) and its raster's kPerGroup over kGroupM.
  const std::int64_t cluster_tiles = (row_tiles + c.cluster_m - 1) / c.cluster_m * col_tiles;
  if (!fj::fits_int(2 * cluster_tiles)) return too_many("2 x cluster tiles", 2 * cluster_tiles);
  const std::int64_t group = std::max(1, c.group_m / c.cluster_m);
  if (!fj::fits_int(group * col_tiles))
    return too_many("group_m x column tiles", group * col_tiles);
  if (c.persistent) {
    // consume()'s `unsigned slice` counts the k slices of every tile a persistent CTA walks:
    // ceil(cluster tiles / CTAs) x k tiles must not wrap (the stage parity would break).
    const std::int64_t ctas = std::max(1, std::max(1, d.sm_count) / c.cluster_m);
    const std::int64_t slices = (cluster_tiles + ctas - 1) / ctas * ((p.K + c.bk - 1) / c.bk);
    if (slices > std::numeric_limits<std::uint32_t>::max())
      return too_many("k slices per persistent CTA", slices);
  }
  return {};
}

}  // namespace

bool y_rows_take_tma_stores(const Problem& p) {
  // TMA stores whole 16-byte units: a row end inside one would write into y's padding.
  return p.N * static_cast<std::int64_t>(storage_bytes(p.dtype)) % 16 == 0 &&
         p.effective_alignment() >= 16;
}

bool single_pass_class(const Problem& p, const KernelConfig& c) {
  return p.mode == Mode::train && p.M <= c.bm && p.stat_ranks == 0;
}

Problem recompute_affine_problem(Problem p) {
  p.mode = Mode::eval;
  return p;
}

std::int64_t padded_row_elements(const Problem& p) {
  const auto eb = static_cast<std::int64_t>(storage_bytes(p.dtype));
  return (p.K * eb + kPaddedRowAlign - 1) / kPaddedRowAlign * kPaddedRowAlign / eb;
}

Problem padded_operands_problem(Problem p) {
  p.ldx = p.ldw = padded_row_elements(p);
  return p;
}

int KernelConfig::threads() const {
  return variant == Variant::tiled ? warps_m * warps_n * 32 : 128 * (warps_m + 1);
}

int KernelConfig::smem_bytes(const Problem& p) const {
  const int eb = static_cast<int>(storage_bytes(p.dtype));
  auto up16 = [](int v) { return (v + 15) / 16 * 16; };
  if (variant == Variant::warpspec) {
    // Mirrors WarpspecGemm::SharedStorage (fragment epilogue), member by member: the stage
    // ring, 2 mbarriers per stage + 6, the epilogue's store staging (128-byte rows padded by 8
    // elements; tma_store: two 1 KiB boxes per consumer warp, 1 KiB aligned) and per-warp column
    // partials, eval's double-buffered coefficients; its sizeof rounds that up to its 1 KiB
    // alignment (the ring's, for the 128-byte swizzle), and kSmemBytes adds 1 KiB more to align
    // the dynamic shared memory base. The kernel static_asserts the match where the Spec
    // carries this count (SMEM_BYTES; tests/cpu/smem_formula_test.cpp).
    // tf32x3: each stage also holds W's small parts (SplitStage; x is split in registers).
    const int ring = stages * (bm + bn + (p.dtype == DType::tf32x3 ? bn : 0)) * bk * eb;
    // tf32x3: a third mbarrier per stage (W's split written: SplitBarriers).
    const int bars = (2 * stages + 6 + (p.dtype == DType::tf32x3 ? stages : 0)) * 8;
    const int staging = tma_store ? 4 * warps_m * fj::kTmaStoreWarpBytes : bm * (128 + 8 * eb);
    // Pingpong: one such epilogue per consumer warpgroup, each for a whole BM-row tile.
    const int epilogue = pingpong ? 2 * ((4 * bn + 2 * bn) * 4 + staging)
                                  : (4 * warps_m * bn + 2 * bn) * 4 + staging;
    const int coef = p.mode == Mode::eval ? 16 * bn : 0;
    // overlap_apply: OverlapApplyOps::Shared (the apply warps' six 1 KiB row slots and their
    // barriers, its barrier and claims) after the epilogue's.
    const int overlap = overlap_apply ? 6240 : 0;
    const int align = tma_store ? 1024 : 16;
    const int epi_offset = (ring + bars + align - 1) / align * align;
    const int storage = epi_offset + up16(epilogue) + coef + overlap;
    return (storage + 1023) / 1024 * 1024 + 1024;
  }
  // Tiled: the larger of the cp.async ring and the epilogue's fp32 tile + scratch (they alias).
  // Split-K keeps the same size: the slice store reads the same tile.
  return std::max(tiled_ring_bytes(p, *this), tiled_epilogue_bytes(bm, bn, threads()));
}

int KernelConfig::splitk_reduce_smem_bytes() const {
  if (variant != Variant::tiled || split_k <= 1 || bn <= 0) return 0;
  // Mirrors SplitKReduce::kThreads (kernels/splitk_reduce.cuh).
  const int reduce_threads = 256 % bn == 0 || bn % 256 == 0 ? 256 : threads();
  return tiled_epilogue_bytes(bm, bn, reduce_threads);
}

std::string KernelConfig::why_invalid(const Problem& p, const Device& d) const {
  // Before any arithmetic on the fields: configs also come from callers (PlanOptions::config,
  // parse() of a key), and fields near INT_MAX overflowed the int products below (found by
  // tests/fuzz/kernel_config_fuzz.cpp). Within +-512 every product stays far inside int.
  for (const int v : {bm, bn, bk, warps_m, warps_n, stages, split_k})
    if (v < -512 || v > 512) return "tile, warp, stage and split fields must lie within -512..512";
  const bool strict_fp32 = p.dtype == DType::fp32;
  if (variant == Variant::warpspec) {
    if (split_k != 1) return "split_k: only the tiled variant splits K";
    if (d.cc() != 90)
      return "warpspec needs sm_90a (Hopper); this device is sm_" + std::to_string(d.cc());
    if (strict_fp32) return "warpspec has no strict-fp32 path (wgmma multiplies fp32 as tf32)";
    if (p.effective_alignment() < 16 && !pad_operands)
      return "warpspec loads with TMA, which needs 16-byte aligned rows (pad_operands copies "
             "x and W into aligned rows first)";
    if (pad_operands && p.effective_alignment() >= 16)
      return "pad_operands: x and W rows are 16-byte aligned already (TMA loads them as they are)";
    if (warps_m < 1 || warps_m > 2) return "warpspec: 1 or 2 consumer warpgroups";
    if (pingpong) {
      if (warps_m != 2 || !persistent)
        return "warpspec: pingpong needs two consumer warpgroups and persistent CTAs";
      if (bm != 64 && bm != 128)
        return "warpspec: pingpong tiles have 64 or 128 rows (one consumer warpgroup's)";
    } else if (bm != 64 * warps_m && bm != 128 * warps_m) {
      return "warpspec: bm must be 64 or 128 rows per consumer warpgroup";
    }
    if (bn != 64 && bn != 128 && bn != 192 && bn != 256)
      return "warpspec: bn must be 64, 128, 192 or 256";
    // The shared-memory epilogue (BnEpilogue<Spec, 128 x consumers>) needs its threads to nest
    // with bn. WarpspecGemm no longer instantiates it beside the fragment epilogue that codegen
    // picks, but the rule holds for every warpspec config (so no bn = 192), keeping the valid
    // set as it was measured.
    if (!fj::epilogue_threads_nest(threads() - 128, bn))
      return fmt::format(
          "warpspec: the tile epilogue's {} threads and bn = {} must nest (one divides the other)",
          threads() - 128, bn);
    if (bk * static_cast<int>(storage_bytes(p.dtype)) % 128 != 0)
      return "warpspec: bk must span whole 128-byte swizzle rows";
    if (cluster_m != 1 && cluster_m != 2) return "warpspec: cluster_m must be 1 or 2";
    // A consumer holds the tile's sums, a slice's partial sum and two slices' x fragments:
    // more rows, columns or depth than this spill (WarpspecGemm's static_assert).
    if (p.dtype == DType::tf32x3 && (bn > 128 || bk != 32 || (pingpong ? bm : bm / warps_m) != 64))
      return "warpspec tf32x3: each consumer warpgroup must own 64 rows (bm = 64 per consumer; "
             "pingpong: bm = 64), with bn <= 128 and bk = 32 (its sums, a slice's partial sum "
             "and two slices' split x fragments fill its registers)";
    if (tma_store) {
      if (pingpong) return "warpspec: tma_store and pingpong do not combine";
      if (!y_rows_take_tma_stores(p))
        return p.N * static_cast<std::int64_t>(storage_bytes(p.dtype)) % 16 != 0
                   ? fmt::format("warpspec: tma_store needs N to be a multiple of {}",
                                 16 / storage_bytes(p.dtype))
                   : "warpspec: tma_store needs 16-byte aligned rows of y";
    }
  } else {
    if (cluster_m != 1 || persistent || pingpong || tma_store)
      return "tiled has no clusters, persistent scheduling, pingpong or TMA stores";
    if (pad_operands) return "pad_operands: tiled loads rows of any alignment itself";
    if (warps_m < 1 || warps_n < 1 || threads() > 1024) return "tiled: bad warp layout";
    const int wtm = bm / warps_m, wtn = bn / warps_n;  // warp tile
    if (bm % warps_m != 0 || bn % warps_n != 0) return "tiled: warps must divide the tile";
    // BnEpilogue<Spec, THREADS> (epilogue/bn_epilogue.cuh), the GEMM's epilogue; the split-K
    // reduce kernel's thread count nests with bn by construction (SplitKReduce::kThreads).
    if (bn > 0 && !fj::epilogue_threads_nest(threads(), bn))
      return fmt::format(
          "tiled: the epilogue's {} threads and bn = {} must nest (one divides the other)",
          threads(), bn);
    if (strict_fp32) {
      // SIMT: each lane owns an 8x8 block, so a warp tile is exactly 32 such blocks.
      if (wtm % 8 != 0 || wtn % 8 != 0 || wtm * wtn != 32 * 64)
        return "tiled fp32: the warp tile must be 2048 elements in 8x8 lane blocks";
      if (bk > 32 || (bk & (bk - 1)) != 0) return "tiled fp32: bk must be a power of two <= 32";
    } else {
      const int kbytes = bk * static_cast<int>(storage_bytes(p.dtype));
      if (wtm % 16 != 0 || wtn % 8 != 0)
        return "tiled: the warp tile must be a multiple of the 16x8 mma shape";
      if ((wtm / 16) * (wtn / 8) * 4 > 128)
        return "tiled: more than 128 accumulators per thread (warp tile above 64x64)";
      if (kbytes < 32 || kbytes > 512 || (kbytes & (kbytes - 1)) != 0)
        return "tiled: bk * element size must be a power of two from 32 to 512 bytes";
    }
  }
  if (bm <= 0 || bn <= 0 || bk <= 0 || stages < 2 || group_m < 1) return "non-positive tile field";
  // TiledGemm's and WarpspecGemm's static_asserts: with M, N, K <= kMaxDim (Problem::validate),
  // (D + T - 1) / T then fits int.
  if (bm > fj::kMaxTileExtent || bn > fj::kMaxTileExtent || bk > fj::kMaxTileExtent)
    return fmt::format("bm, bn and bk must be at most {}", fj::kMaxTileExtent);
  if (const std::string why = int32_counts_why_invalid(p, *this, d); !why.empty()) return why;
  if (split_k < 1 || split_k > kMaxSplitK)
    return fmt::format("split_k must lie within 1..{}; got {}", kMaxSplitK, split_k);
  if (recompute) {
    if (p.mode != Mode::train) return "recompute: train mode only (eval runs one pass already)";
    if (p.stat_ranks > 0) return "recompute: not with synchronized statistics (stat_ranks)";
    if (split_k != 1) return "recompute: not with split-K";
    if (single_pass_class(p, *this))
      return fmt::format("recompute: M = {} rows fit one tile (bm = {}), which runs in one pass",
                         p.M, bm);
  }
  if (grid_sync) {
    if (!recompute) return "grid_sync: only with recompute (its kernels run when tiles do not fit)";
    if (variant != Variant::warpspec) return "grid_sync: warpspec only";
    if (cluster_m != 1) return "grid_sync: not with clusters (cluster_m must be 1)";
    if (pingpong) return "grid_sync: not with pingpong (one tile per CTA)";
  }
  if (input_stats) {
    if (!recompute)
      return "input_stats: only with recompute (its kernels run where the driver refuses "
             "fj_input_stats' cooperative launch)";
    if (grid_sync) return "input_stats: not with grid_sync";
    if (p.K > fj::kInputStatsMaxK)
      return fmt::format("input_stats: K = {} above {} (x's K x K covariance)", p.K,
                         fj::kInputStatsMaxK);
  }
  if (overlap_apply) {
    if (variant != Variant::warpspec || !persistent)
      return "overlap_apply: warpspec with persistent CTAs only";
    if (p.mode != Mode::train || single_pass_class(p, *this) || p.stat_ranks > 0)
      return fmt::format(
          "overlap_apply: train mode with more rows than one tile (M = {}, bm = {}) and no "
          "synchronized statistics: it runs the two-pass schedule's second pass in the GEMM",
          p.M, bm);
    if (recompute || grid_sync) return "overlap_apply: not with recompute or grid_sync";
    if (cluster_m != 1) return "overlap_apply: not with clusters (cluster_m must be 1)";
    if (pingpong) return "overlap_apply: not with pingpong";
    if (p.dtype == DType::tf32x3)
      return "overlap_apply: not with tf32x3 (its W splitters are the warps that apply)";
    if (p.effective_alignment() < 16)
      return "overlap_apply: y's rows must be 16-byte aligned (the apply moves 16-byte units)";
  }
  if (const std::int64_t kt = k_tiles(p, bk); split_k > kt)
    return fmt::format(
        "split_k {} exceeds the {} k tiles of K = {} (BK = {}): a split would be empty", split_k,
        kt, p.K, bk);
  // The mainloops' static_asserts, whatever the device allows: the tiled cp.async ring
  // within 227 KiB, WarpspecGemm::kSmemBytes within 232448 bytes (227 KiB).
  if (variant == Variant::tiled && tiled_ring_bytes(p, *this) > 227 * 1024)
    return fmt::format("the cp.async ring needs {} bytes of shared memory, above 227 KiB",
                       tiled_ring_bytes(p, *this));
  // recompute: the affine pass is the GEMM of eval mode (its coefficient buffers too).
  const int gemm_smem =
      std::max(smem_bytes(p), recompute ? smem_bytes(recompute_affine_problem(p)) : 0);
  if (variant == Variant::warpspec && gemm_smem > 232448)
    return fmt::format("needs {} bytes of shared memory, above 227 KiB", gemm_smem);
  const int smem = std::max(gemm_smem, splitk_reduce_smem_bytes());
  if (d.smem_per_block_optin > 0 && smem > d.smem_per_block_optin)
    return fmt::format("needs {} bytes of shared memory, the device allows {}", smem,
                       d.smem_per_block_optin);
  return {};
}

std::string KernelConfig::key() const {
  const std::string tail = fmt::format(
      "{}{}{}{}{}{}", pad_operands ? ".pad" : "", recompute ? ".rc" : "", input_stats ? ".cv" : "",
      grid_sync ? ".gs" : "", overlap_apply ? ".oa" : "", exact_m ? ".xm" : "");
  if (variant == Variant::tiled)
    return fmt::format("tiled.{}x{}x{}.w{}x{}.s{}.g{}{}{}", bm, bn, bk, warps_m, warps_n, stages,
                       group_m, split_k != 1 ? fmt::format(".k{}", split_k) : "", tail);
  // Split-K on warpspec: the gradient GEMMs' only (plan/backward_core.cpp).
  return fmt::format("warpspec.{}x{}x{}.c{}.s{}.g{}.cl{}.p{}{}{}{}{}", bm, bn, bk, warps_m, stages,
                     group_m, cluster_m, int(persistent),
                     split_k != 1 ? fmt::format(".k{}", split_k) : "", pingpong ? ".pp" : "",
                     tma_store ? ".ts" : "", tail);
}

namespace {

// `text` against `pattern`, where each '#' stands for a decimal integer (digits only: no sign,
// no spaces, and it must fit an int, so no overflow as with sscanf's %d): the integers in
// order, or nothing when the text does not match the whole pattern.
std::optional<std::vector<int>> match_key(std::string_view text, std::string_view pattern) {
  std::vector<int> out;
  const char* t = text.data();
  const char* const end = text.data() + text.size();
  for (const char pc : pattern) {
    if (pc != '#') {
      if (t == end || *t != pc) return std::nullopt;
      ++t;
      continue;
    }
    if (t == end || *t < '0' || *t > '9') return std::nullopt;
    int v = 0;
    const auto [next, ec] = std::from_chars(t, end, v);
    if (ec != std::errc{}) return std::nullopt;
    t = next;
    out.push_back(v);
  }
  if (t != end) return std::nullopt;
  return out;
}

}  // namespace

KernelConfig KernelConfig::parse(std::string_view whole) {
  KernelConfig c;
  std::string_view key = whole;
  c.exact_m = key.ends_with(".xm");
  if (c.exact_m) key.remove_suffix(3);
  c.overlap_apply = key.ends_with(".oa");
  if (c.overlap_apply) key.remove_suffix(3);
  c.grid_sync = key.ends_with(".gs");
  if (c.grid_sync) key.remove_suffix(3);
  c.input_stats = key.ends_with(".cv");
  if (c.input_stats) key.remove_suffix(3);
  c.recompute = key.ends_with(".rc");
  if (c.recompute) key.remove_suffix(3);
  c.pad_operands = key.ends_with(".pad");
  if (c.pad_operands) key.remove_suffix(4);
  if (auto v = match_key(key, "tiled.#x#x#.w#x#.s#.g#.k#");
      v || (v = match_key(key, "tiled.#x#x#.w#x#.s#.g#"))) {
    c.variant = Variant::tiled;
    c.bm = (*v)[0], c.bn = (*v)[1], c.bk = (*v)[2];
    c.warps_m = (*v)[3], c.warps_n = (*v)[4], c.stages = (*v)[5], c.group_m = (*v)[6];
    c.split_k = v->size() == 8 ? (*v)[7] : 1;
    return c;
  }
  std::string_view rest = key;
  const bool tma_store = rest.ends_with(".ts");
  if (tma_store) rest.remove_suffix(3);
  const bool pingpong = rest.ends_with(".pp");
  if (pingpong) rest.remove_suffix(3);
  if (auto v = match_key(rest, "warpspec.#x#x#.c#.s#.g#.cl#.p#.k#");
      v || (v = match_key(rest, "warpspec.#x#x#.c#.s#.g#.cl#.p#"))) {
    c.variant = Variant::warpspec;
    c.bm = (*v)[0], c.bn = (*v)[1], c.bk = (*v)[2];
    c.warps_m = (*v)[3], c.warps_n = 1, c.stages = (*v)[4], c.group_m = (*v)[5];
    c.cluster_m = (*v)[6], c.persistent = (*v)[7] != 0, c.pingpong = pingpong;
    c.split_k = v->size() == 9 ? (*v)[8] : 1;
    c.tma_store = tma_store;
    return c;
  }
  throw InvalidArgument("config",
                        "expected a key like tiled.128x128x32.w2x4.s4.g8[.k4][.rc][.xm] or "
                        "warpspec.128x256x64.c2.s4.g8.cl1.p1[.k4][.pp|.ts][.pad][.rc][.xm]; got '" +
                            printable(whole) + "'");
}

namespace {

KernelConfig tiled(int bm, int bn, int bk, int wm, int wn, int stages) {
  KernelConfig c;
  c.variant = Variant::tiled;
  c.bm = bm, c.bn = bn, c.bk = bk, c.warps_m = wm, c.warps_n = wn, c.stages = stages;
  return c;
}

KernelConfig warpspec(int bm, int bn, int bk, int consumers, int stages, bool persistent,
                      bool pingpong = false) {
  KernelConfig c;
  c.variant = Variant::warpspec;
  c.bm = bm, c.bn = bn, c.bk = bk, c.warps_m = consumers, c.warps_n = 1, c.stages = stages;
  c.persistent = persistent;
  c.pingpong = pingpong;
  return c;
}

KernelConfig with_tma_store(KernelConfig c) {
  c.tma_store = true;
  return c;
}

// Split-K variants of the list's first 128x128 and first 64x64 configs when their tile grid
// fills at most half the SMs. Each split keeps at least 4 k tiles (below that the 3-stage
// cp.async ring never reaches its steady state) and the grid stays within two CTAs per SM for
// the SIMT path, one for the tensor-core path: there a second split CTA on an SM measured slower
// than fewer splits (H100, 1024^3 bf16 128x128: .k2 18.7 us, .k4 29 us, unsplit 22 us), while
// 64-thread SIMT CTAs gain from sharing (128x512x1024 fp32 64x64: .k16 16.2 us, .k8 17.1 us).
void add_split_k(std::vector<KernelConfig>& out, const Problem& p, const Device& d) {
  const std::int64_t sms = std::max(1, d.sm_count);
  const std::int64_t max_ctas = (p.dtype == DType::fp32 ? 2 : 1) * sms;
  std::vector<KernelConfig> split;
  for (const int edge : {128, 64}) {
    const auto base = std::find_if(out.begin(), out.end(), [&](const KernelConfig& c) {
      return c.bm == edge && c.bn == edge && c.split_k == 1;
    });
    if (base == out.end()) continue;
    const std::int64_t tiles = output_tiles(p, *base), kt = k_tiles(p, base->bk);
    if (2 * tiles > sms) continue;
    for (const int s : {2, 4, 8, 16}) {
      if (kt < 4 * s || tiles * s > max_ctas) break;
      KernelConfig c = *base;
      c.split_k = s;
      split.push_back(c);
    }
  }
  out.insert(out.end(), split.begin(), split.end());
}

// Tiled configs per math kind, heuristic's favourite first (measured on H100, see
// docs/performance.md: BK=64 and 64x64 warp tiles pay for bf16/fp16; 4 stages never helped).
// Small-M problems get a short tile so train mode finishes in one kernel (M <= BM) without
// wasting most of the tile. Devices with ~100 KiB of shared memory fall through to the
// smaller tiles by pruning.
std::vector<KernelConfig> tiled_candidates(const Problem& p, const Device& d) {
  std::vector<KernelConfig> out;
  switch (p.dtype) {
    case DType::fp32: {
      // BK=32 halves the barriers per FFMA: 1.187x vs 1.242x cuBLAS SGEMM at 1024x8192x8192 on
      // H100, where two such CTAs (101 KiB each) still share an SM. Where they cannot, BK=16
      // keeps two CTAs per SM and comes first.
      const KernelConfig k32 = tiled(128, 128, 32, 4, 2, 3), k16 = tiled(128, 128, 16, 4, 2, 3);
      const bool two_fit = d.smem_per_sm >= 2 * (k32.smem_bytes(p) + 1024);
      out = {two_fit ? k32 : k16,         two_fit ? k16 : k32,        tiled(64, 128, 16, 2, 2, 3),
             tiled(128, 64, 16, 2, 2, 3), tiled(64, 64, 16, 2, 1, 3), tiled(128, 32, 16, 2, 1, 3)};
      break;
    }
    case DType::tf32:
    case DType::tf32x3:
      out = {tiled(128, 128, 32, 2, 2, 3), tiled(64, 128, 32, 2, 2, 3),
             tiled(128, 256, 32, 2, 4, 3), tiled(128, 64, 32, 4, 1, 3),
             tiled(64, 64, 32, 2, 2, 3),   tiled(128, 32, 32, 4, 1, 3)};
      break;
    case DType::fp16:
    case DType::bf16:
      out = {tiled(128, 256, 64, 2, 4, 3), tiled(64, 128, 64, 2, 2, 3),
             tiled(128, 128, 64, 2, 2, 3), tiled(128, 64, 64, 4, 1, 3),
             tiled(64, 64, 64, 2, 2, 3),   tiled(128, 32, 64, 4, 1, 3)};
      break;
  }
  add_split_k(out, p, d);
  return out;
}

std::vector<KernelConfig> warpspec_tiles(const Problem& p) {
  // Persistent cooperative kernels (two consumer warpgroups on one 128-row tile) measured best
  // on H100; 64-row tiles with one consumer for small M.
  const int bk = storage_bytes(p.dtype) == 4 ? 32 : 64;
  if (p.dtype == DType::tf32x3) {
    // 3xTF32: every stage also holds W's small parts, so fewer stages fit; three wgmma per
    // k-step keep each stage busy three times as long. 128x128 with 4 stages measured the same
    // as with 3 (H100, 1024x8192x8192 and 4096^3, both modes, within the spread between rounds,
    // up to 8%).
    return {warpspec(128, 128, bk, 2, 3, true), warpspec(64, 128, bk, 1, 4, true),
            warpspec(128, 64, bk, 2, 4, true)};
  }
  if (p.dtype == DType::tf32) {
    // tf32 on H100, each config forced (docs/performance.md, "tf32 tiles"): 6 stages beat 5 on
    // 128x128 tiles everywhere measured.
    //
    // 128x256 tiles with TMA stores (per-warp boxes instead of the 20 KiB staging buffer) fit
    // 4 stages in both modes (with thread stores eval's coefficient buffers leave room for 3),
    // and those come first in train, and in eval where K and M are long. H200, two rounds in
    // one call, fused op / cuBLASLt TF32 GEMM (docs/performance.md, "TMA stores of fp32 y"):
    // eval 0.99-1.00 at 1024x8192x8192, 4096^3 and 16384x4096x4096 (128x128 s6 in clusters of
    // two, the choice before: 1.08-1.13); train 1.04 / 1.11 / 1.06-1.14 (128x256 s3: 1.09 /
    // 1.16 / 1.10-1.15). Eval elsewhere is not offered 128x256 tiles, since the time model, which
    // ranks the list, would put them first: with short K they took +20% at 2048x2048x512 and
    // +63% at 65536x256x64 (thread stores, H100), and on a grid of under two waves of them
    // +70% (512x4096x4096, ranked as M = 1024: 128 tiles; H200).
    //
    // Where TMA stores cannot run (N % 4 != 0, unaligned y) train takes the list as it was
    // before them, 128x256 s3 first (s4 fits but was not timed with thread stores), so that
    // the first three, which get recompute twins (recompute_twins), are the tiles whose twins
    // were measured; with them, 128x256 s3 comes last (no twin) for the same reason. Eval falls
    // to 128x128 in clusters of two along M (TMA multicasts each W tile to both CTAs) where K is
    // long. H200, eval, two rounds in one call, ms: 1024x8192x8192 0.371 -> 0.360, 4096^3
    // 0.381 -> 0.374, 16384x4096x4096 1.80 -> 1.70-1.73; but 2048x2048x512 0.0217 -> 0.0221
    // and 65536x256x64 0.0319 -> 0.0331 (K between 512 and 4096 not measured).
    std::vector<KernelConfig> out;
    KernelConfig wide_ts = with_tma_store(warpspec(128, 256, bk, 2, 4, true));
    wide_ts.group_m = 16;
    KernelConfig wide = warpspec(128, 256, bk, 2, 3, true);
    wide.group_m = 16;
    KernelConfig pair = warpspec(128, 128, bk, 2, 6, true);
    pair.cluster_m = 2;
    const bool eval = p.mode == Mode::eval;
    // Either first only where measured: M >= 1024 (for the pair: a cluster of a lone row tile
    // leaves half its CTAs idle) and rows TMA loads directly (not behind pad_operands' copy).
    const bool long_eval = eval && p.K >= 2048 && p.M >= 1024 && p.effective_alignment() >= 16;
    // 256 tiles: the smallest grid measured faster (1024x8192x8192). The class's low end (e.g.
    // 257x8192x8192: 96 tiles, one wave, against two waves of half-size 128x128 tiles) is not
    // measured.
    const bool wide_eval = long_eval && output_tiles(p, wide_ts) >= 256;
    const bool ts = y_rows_take_tma_stores(p);
    if (!eval) out = ts ? std::vector<KernelConfig>{wide_ts} : std::vector<KernelConfig>{wide};
    if (long_eval)
      out = wide_eval ? std::vector<KernelConfig>{wide_ts, pair} : std::vector<KernelConfig>{pair};
    for (const auto& c : {warpspec(128, 128, bk, 2, 6, true), warpspec(64, 128, bk, 1, 6, true),
                          warpspec(128, 64, bk, 2, 6, true)})
      out.push_back(c);
    if (!eval && ts) out.push_back(wide);
    if (eval && !long_eval) out.push_back(pair);
    return out;
  }
  // Pingpong (whole 128x128 or 64x256 tiles per warpgroup) for the tuner to weigh: it hides
  // the epilogue, which matters most for train's column statistics.
  // The two cooperative favourites come first with TMA stores (N % 8 == 0 only; elsewhere
  // they are pruned and the thread-store twins follow): same time in eval, 0.6-1.8%
  // less in train on H100 (docs/performance.md, sixth session). 128x256 tiles raster in groups
  // of 16 row tiles: a wave of 132 tiles then spans ~16 x 8 tiles, 16 MiB of x panels and
  // 16 MiB of W panels at 4096^3 bf16, rather than 8 MiB + 33 MiB with 8 (0.3-0.6% faster at
  // 4096^3, the same elsewhere).
  KernelConfig wide = warpspec(128, 256, bk, 2, 4, true);
  wide.group_m = 16;
  return {with_tma_store(wide),
          wide,
          with_tma_store(warpspec(128, 128, bk, 2, 6, true)),
          warpspec(128, 128, bk, 2, 6, true),
          warpspec(64, 128, bk, 1, 6, true),
          warpspec(128, 64, bk, 2, 6, true),
          warpspec(64, 64, bk, 1, 8, true),
          warpspec(128, 128, bk, 2, 5, true, true),
          warpspec(64, 256, bk, 2, 4, true, true)};
}

// warpspec_tiles, and for rows TMA cannot load the same configs behind the padding copy
// (KernelConfig::pad_operands; TMA stores need aligned y rows, so those drop out): what the
// heuristic, the tuner and default_config's refusal all list.
std::vector<KernelConfig> warpspec_candidates(const Problem& p) {
  std::vector<KernelConfig> ws = warpspec_tiles(p);
  if (p.effective_alignment() < 16) {
    std::erase_if(ws, [](const KernelConfig& c) { return c.tma_store; });
    for (auto& c : ws) c.pad_operands = true;
  }
  return ws;
}

}  // namespace

unsigned resident_tiles(const KernelConfig& c, int ctas_per_sm, int sm_count) {
  if (!c.grid_sync || ctas_per_sm < 1 || sm_count < 1) return 0;
  const auto sms = static_cast<unsigned>(sm_count);
  return c.persistent ? sms : static_cast<unsigned>(ctas_per_sm) * sms;
}

unsigned resident_grid(const KernelConfig& c, std::int64_t n, std::int64_t rows,
                       unsigned resident_tiles) {
  if (!c.grid_sync || rows < 1 || n < 1) return 0;
  const std::int64_t row_tiles = (rows + c.bm - 1) / c.bm;
  const std::int64_t col_tiles = (n + c.bn - 1) / c.bn;
  const auto fit = static_cast<std::int64_t>(resident_tiles);
  if (row_tiles * col_tiles <= fit) return static_cast<unsigned>(row_tiles * col_tiles);
  if (!c.persistent || row_tiles > fit) return 0;
  return static_cast<unsigned>(row_tiles * std::min(fit / row_tiles, col_tiles));
}

namespace {

// The gradient GEMMs' tiles alone on an SM (GemmKind::gradient_one_wave): the FLOP/s each tile
// sustains there, fitted on H100 to `fusejit autotune --backward`'s whole-backward times of every
// dW candidate (bf16 train, 16384x512x128, 16384x256x256, 16384x1024x256 and 4096x512x512, with
// the split's cost below; docs/performance.md). A warpspec tile's rate follows its warpgroups'
// wgmma width and its number of consumers, not its area: the forward's sqrt(area) x thread fill
// rates 64x128 (one consumer, 128 wide) and 128x64 (two, 64 wide) alike at half of 128x256, where
// they measured 0.77 and 0.67 of it. These are absolute rates, above the forward's per_sm: a list
// is ranked either wholly by them or not at all (GemmKind), so only their ratios matter.
std::optional<double> lone_cta_flops_per_sm(const KernelConfig& c) {
  struct Rate {
    Variant variant;
    int bm, bn;
    double flops;
  };
  static constexpr Rate kRates[] = {
      {Variant::warpspec, 128, 256, 7.3e12}, {Variant::warpspec, 128, 128, 7.0e12},
      {Variant::warpspec, 64, 128, 5.6e12},  {Variant::warpspec, 128, 64, 4.9e12},
      {Variant::warpspec, 64, 64, 3.7e12},   {Variant::tiled, 128, 256, 4.1e12},
      {Variant::tiled, 128, 128, 3.6e12},    {Variant::tiled, 64, 128, 2.8e12},
      {Variant::tiled, 128, 64, 2.8e12},     {Variant::tiled, 64, 64, 1.6e12},
      {Variant::tiled, 128, 32, 1.5e12},
  };
  for (const Rate& r : kRates)
    if (r.variant == c.variant && r.bm == c.bm && r.bn == c.bn) return r.flops;
  return std::nullopt;
}

}  // namespace

double estimated_us(const Problem& p, const Device& d, const KernelConfig& c, GemmKind kind) {
  // FLOP/s one SM sustains per math path (H100 measurements, docs/performance.md); only the
  // ratios matter for choosing.
  const bool ws = c.variant == Variant::warpspec;
  double per_sm = 0;
  switch (p.dtype) {
    case DType::fp32:
      per_sm = 0.35e12;
      break;
    case DType::tf32:
      per_sm = ws ? 2.9e12 : 1.6e12;
      break;
    // Three tf32 products per step. Measured on H100 it is slower than that: 1.22-1.35 ms
    // (warpspec) and 3.07 ms (tiled, H200) at 1024x8192x8192 eval, 3.4-3.7x and 8.5x tf32's
    // warpspec 0.36 ms. Only the variants' order matters here, and it holds
    // (docs/performance.md, "3xTF32").
    case DType::tf32x3:
      per_sm = (ws ? 2.9e12 : 1.6e12) / 3.0;
      break;
    default:
      per_sm = ws ? 5.9e12 : 3.7e12;
      break;
  }
  // Small tiles re-read more operand bytes per FLOP and keep fewer MMAs in flight; few threads
  // on an SM leave issue slots empty.
  double eff = std::sqrt(std::min(1.0, double(c.bm) * c.bn / (128.0 * 256.0)));
  const int sms = std::max(1, d.sm_count);
  const int smem = std::max(1, c.smem_bytes(p));
  const int per_sm_ctas = std::max(1, std::min(std::max(d.smem_per_sm, smem) / smem,
                                               std::max(1, d.max_threads_per_sm) / c.threads()));
  const double tiles = static_cast<double>(output_tiles(p, c));
  // Split-K: S CTAs per tile, each over K / S.
  const int splits = std::max(1, c.split_k);
  const double ctas = tiles * splits;
  // CTAs that actually share an SM: a grid smaller than the GPU spreads one per SM.
  const double sharing = std::min<double>(per_sm_ctas, std::ceil(ctas / sms));
  // The SIMT FFMA loop hides its latencies with warps rather than asynchronous MMAs: it wants
  // 16 warps on an SM (two 256-thread CTAs), the tensor-core paths 8.
  const double full_threads = p.dtype == DType::fp32 ? 512.0 : 256.0;
  double fill = std::sqrt(std::min(1.0, sharing * c.threads() / full_threads));
  // The measured one-wave rates and split cost: fitted on H100 with 16-bit operands only.
  const bool lone_fit =
      kind == GemmKind::gradient_one_wave && d.cc() == 90 && storage_bytes(p.dtype) == 2;
  if (lone_fit) {
    if (const std::optional<double> lone = lone_cta_flops_per_sm(c))
      per_sm = *lone, eff = 1.0, fill = 1.0;
  }
  const double waves = std::ceil(ctas / (sms * sharing));
  const double wave_us =
      sharing * 2.0 * c.bm * c.bn * double(p.K) / splits / (per_sm * eff * fill) * 1e6;
  double us = waves * wave_us + 3.0;
  if (splits > 1) {
    const double slice = 4.0 * c.bm * c.bn;
    constexpr double kSmL2BytesPerUs = 1.0e5;
    if (lone_fit) {
      // fj_bwd_*_sum's launch, and the S slices written and read back across the whole GPU:
      // the same fit as lone_cta_flops_per_sm's, 4.9 us and 0.26 us per MB of slices written
      // plus read (3.8 TB/s, much of it L2).
      us += 4.9 + 2.0 * tiles * splits * slice / 3.8e12 * 1e6;
    } else {
      // A second launch; every GEMM CTA stores its fp32 slice, and the sum reads S of them per
      // tile, both at about one SM's share of L2 bandwidth (~100 GB/s). The forward's reduce
      // has one CTA per tile, so that term is what keeps S and the tile small there (128x128
      // tiles read 64 KiB per split); the gradient GEMMs' elementwise sum spreads the reads over
      // every SM.
      const double reads = kind == GemmKind::forward ? std::ceil(tiles / sms) * splits * slice
                                                     : tiles * splits * slice / sms;
      us += 2.5 + waves * slice / kSmL2BytesPerUs + reads / kSmL2BytesPerUs;
    }
  }
  if (c.pad_operands) {
    // The copy's launch, and x and W read and written once at about the rate an
    // element-aligned copy reaches (~2.5 TB/s on H100).
    us += 3.0 + 2.0 * double(p.M + p.N) * double(p.K) * storage_bytes(p.dtype) / 2.5e12 * 1e6;
  }
  if (p.mode == Mode::train && p.M > c.bm) {
    // grid_sync resident: one kernel, whose grid barrier and per-column merge cost a few
    // microseconds (3 us: the H100 fit that places the one-round runs); in rounds of whole
    // column panels, each further round adds its barrier, merge and idle epilogue: measured ~6
    // us over eval a round on H200, charged 10.5 here because the two-pass term below (H100's
    // rate) overstates the H200's y round trip by about as much, and the choice must fall where
    // the H200 measured it: two rounds resident (2048x4096x4096, 1024x8192x8192: 2-5% faster),
    // four rounds two-pass in bf16 (4096^3: 1-2% faster) and resident in tf32 (3% faster). Each
    // further round also reads all of x again: where x is larger than ~2/3 of the L2 those
    // reads come from DRAM beside the mainloop's (~x / 12 TB/s a round, fitted on
    // 16384x4096x4096 and 8192x12288x3072, where two-pass stays). And a resident grid smaller
    // than the SMs (a panel's row tiles, times the panels that fit) takes more mainloop waves
    // than the tiles need. Otherwise recompute: the finalize's launch and the GEMM again, whose
    // statistics epilogue costs about what storing a tile does (~2 us per tile and CTA on
    // H100, docs/performance.md)
    const unsigned resident = resident_grid(c, p.N, p.M, resident_tiles(c, per_sm_ctas, sms));
    const double x_bytes = double(p.M) * double(p.K) * storage_bytes(p.dtype);
    const double l2_bytes = d.l2_bytes > 0 ? double(d.l2_bytes) : 50e6;  // H100's, if unknown
    if (resident > 0) {
      const double rounds = std::ceil(tiles / resident);
      us += 3.0 + (rounds - 1.0) *
                      (10.5 + (x_bytes > l2_bytes * 2.0 / 3.0 ? x_bytes / 12e12 * 1e6 : 0.0));
      us += std::max(0.0, rounds - waves) * wave_us;
    } else if (c.recompute && c.input_stats) {
      // fj_input_stats instead of the statistics GEMM and fj_finalize (this orders the tuner's
      // candidates only: default_config skips these): ~10 us of grid barriers, sums and
      // columns beside reading x (22.3 and 18.7 us under ncu's clocks at 65536x256x64 and
      // 16384x1024x64 bf16, H200: docs/performance.md). Phase 3 takes a CTA's columns
      // kInputStatsWarps at a time (a warp each); each further round, ~1 us, is an estimate: no
      // layer with more than one such round per CTA has been measured.
      const double column_rounds = std::ceil(double(p.N) / (double(sms) * fj::kInputStatsWarps));
      us += 10.0 + x_bytes / 2.5e12 * 1e6 + (column_rounds - 1.0) * 1.0;
    } else if (c.recompute) {
      us += 3.0 + waves * (wave_us + 2.0 * sharing) + 3.0;
    } else {  // two more launches and one read + write of y (fj_apply)
      us += 6.0 + 2.0 * double(p.M) * p.N * storage_bytes(p.dtype) / 2.5e12 * 1e6;
    }
  }
  return us;
}

namespace {

// Train's two-pass class: recompute twins (KernelConfig::recompute) of the first `count`
// configs of `list`, for the time model and the tuner to weigh against storing y twice. Those
// that can (warpspec, no cluster, no pingpong) come grid_sync first: such a set runs one
// kernel when a run's tiles fit at once, or in rounds when a column panel's row tiles do, and
// recompute's kernels otherwise; then the plain twin, for the layers where recompute beats
// those rounds (many row tiles and a short K, e.g. 16384x1024x256: four rounds of one panel).
// The grid_sync twin comes first, so a tie (no resident run possible) keeps it.
std::vector<KernelConfig> recompute_twins(const std::vector<KernelConfig>& list,
                                          std::size_t count) {
  std::vector<KernelConfig> out;
  for (std::size_t i = 0; i < std::min(count, list.size()); ++i) {
    KernelConfig c = list[i];
    c.recompute = true;
    c.grid_sync = c.variant == Variant::warpspec && c.cluster_m == 1 && !c.pingpong;
    out.push_back(c);
    if (c.grid_sync) {
      c.grid_sync = false;
      out.push_back(c);
    }
  }
  return out;
}

// Train with K <= 64 (kInputStatsMaxK): the statistics-from-x twins (KernelConfig::input_stats)
// of the first `count` configs of `list`, as recompute_twins takes them: the statistics pass
// does not depend on the tile, but the affine GEMM after it does (131072x128x32 bf16 with the
// 128x256 tile's twin: 0.0447 ms against recompute's 128x128, 0.0437; H200).
// Not for strict fp32 or 3xTF32: each warp chains all of its slabs' products in the tensor
// cores' accumulators, whose rounding at millions of rows is not shown to stay within their 2e-5
// (the tests stop at 40000), and the tuner checks a candidate at one M only.
std::vector<KernelConfig> input_stats_twins(const Problem& p, const std::vector<KernelConfig>& list,
                                            std::size_t count) {
  if (p.K > fj::kInputStatsMaxK || p.dtype == DType::fp32 || p.dtype == DType::tf32x3) return {};
  std::vector<KernelConfig> out;
  for (std::size_t i = 0; i < std::min(count, list.size()); ++i) {
    KernelConfig c = list[i];
    c.recompute = c.input_stats = true;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::vector<KernelConfig> candidate_configs(const Problem& p, const Device& d) {
  std::vector<KernelConfig> out;
  auto keep = [&](const std::vector<KernelConfig>& cs) {
    for (const auto& c : cs)
      if (c.valid_for(p, d)) out.push_back(c);
  };
  // Hopper: wgmma is the fast path; the tiled variant stays as a fallback and contender.
  const bool train = p.mode == Mode::train && p.stat_ranks == 0;  // valid_for drops one-pass
  if (d.cc() == 90) {
    const std::vector<KernelConfig> ws = warpspec_candidates(p);
    keep(ws);
    if (train) keep(recompute_twins(ws, 3));
    if (train) keep(input_stats_twins(p, ws, 3));
  }
  const std::vector<KernelConfig> tiled = tiled_candidates(p, d);
  keep(tiled);
  if (train) keep(recompute_twins(tiled, 1));
  if (train) keep(input_stats_twins(p, tiled, 1));
  // Cheapest estimate first; the stable sort keeps the lists' preference among equals.
  std::stable_sort(out.begin(), out.end(), [&](const KernelConfig& a, const KernelConfig& b) {
    return estimated_us(p, d, a) < estimated_us(p, d, b);
  });
  return out;
}

KernelConfig synchronized_stats_config(KernelConfig c) {
  c.recompute = false;
  c.input_stats = false;
  c.grid_sync = false;
  c.overlap_apply = false;
  c.exact_m = false;
  return c;
}

MClass m_class(std::int64_t M) {
  // 2048: where many layers' grids stop fitting the GPU at once (N = 2048 in 128x256 tiles on
  // 132 SMs), which decides whether KernelConfig::grid_sync runs as one kernel; a class that
  // straddled it would get one config for both sides.
  constexpr std::int64_t kBounds[] = {64, 128, 256, 1024, 2048, 4096, 16384};
  std::int64_t lo = 1;
  for (const std::int64_t hi : kBounds) {
    if (M <= hi) return {lo, hi};
    lo = hi + 1;
  }
  return {lo, kMaxDim};
}

std::int64_t MClass::representative() const {
  return hi == kMaxDim ? 65536 : hi;
}

KernelConfig default_config(const Problem& p, const Device& d, std::optional<Variant> variant) {
  // Ranked at the class's M, so every M of the class gets the same config (and kernel set)
  // unless a config cannot run this M itself (32-bit counts at the largest M).
  Problem ranked = p;
  ranked.M = m_class(p.M).representative();
  // Statistics from x (KernelConfig::input_stats) only through the tuner: its fixed chain of
  // grid barriers and latencies beats recompute by 4-5% at 65536x256x64 and 16384x1024x64 bf16
  // but loses 20% at 8192x512x64, which shares the latter's M class (H200, docs/performance.md).
  const auto heuristic = [&](const KernelConfig& c) {
    return (!variant || c.variant == *variant) && !c.input_stats;
  };
  for (const auto& c : candidate_configs(ranked, d))
    if (heuristic(c) && c.valid_for(p, d)) return c;
  for (const auto& c : candidate_configs(p, d))
    if (heuristic(c)) return c;
  std::string reasons;
  const auto all = variant == Variant::warpspec ? warpspec_candidates(p) : tiled_candidates(p, d);
  for (const auto& c : all) reasons += "\n  " + c.key() + ": " + c.why_invalid(p, d);
  throw InvalidArgument(
      "variant", fmt::format("no {} config can run {} on {}{}", variant ? name(*variant) : "",
                             p.key(), d.name, reasons));
}

}  // namespace fusejit
