// ElementLoader's copies (mainloop/element_passes.h), checked on the host for every tile shape
// the tiled tf32 mainloop can instantiate: the passes of all threads copy every element of the
// tile exactly once, each to the byte its stage layout names (the same bytes whether a pass's
// offset is computed per pass or from the thread's few base offsets), and the base-offset path
// is the one tf32's MN-major operands take at the BK every tf32 tile has. No GPU needed.
//
// Why: the base offsets replaced a per-pass computation that ptxas held in registers across the
// k loop (12-128 bytes of spills in the tf32 gradient GEMMs on every architecture but sm_90a,
// 44-80 there). A wrong base would put an element in another element's place: every result
// wrong, and only a GPU would show it. Here the host proves the layout before any GPU runs it.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "common/smem_layout.cuh"
#include "mainloop/element_passes.h"

using namespace fj;

namespace {

// What a pass computes per element without the shortcut: the layout's own offset.
template <class Inner>
struct PerPass {
  static constexpr int kLinearPeriod = 0, kLinearStride = 0;
  static constexpr int offset(int row, int k) { return Inner::offset(row, k); }
};

// tf32's MN-major operand (mainloop/tiled_mma.cuh, MmaOperand): a BK x TILE tile of the
// source (k rows, output columns) turned into the K-major SwizzledTile [TILE][BK / 4 chunks],
// W = 8 threads a row segment. Returns failures, one line each.
template <int BK, int TILE, int THREADS>
std::string check_tf32_mn_operand() {
  using Dst = SwizzledWords<SwizzledTile<TILE, BK / 4>>;
  using P = ElementPasses<Dst, BK, TILE, THREADS, 8>;
  using Q = ElementPasses<PerPass<Dst>, BK, TILE, THREADS, 8>;
  const std::string what = fmt::format("BK {} tile {} threads {}", BK, TILE, THREADS);
  std::string failures;
  // Rows of 32 or more tf32 elements (every tile KernelConfig offers: BK = 32) take the base
  // offsets. At BK = 16 the swizzle repeats every 16 rows, and where a pass moves 8 the offsets
  // are computed per pass (correct either way: checked below).
  if (BK >= 32 && !P::kLinear) failures += what + ": the base-offset path is not taken\n";
  std::vector<int> element_seen(BK * TILE, 0);
  std::vector<int> byte_seen(Dst::kBytes / 4, 0);
  for (int tid = 0; tid < THREADS; ++tid) {
    const int r = P::first_row(tid), c = P::first_col(tid);
    const auto bases = P::bases(r, c);
    const auto none = Q::bases(r, c);
    for (int i = 0; i < P::kIters; ++i) {
      if (!P::in_tile(tid / 8, i)) break;
      const int row = r + P::dr(i), col = c + P::dc(i);
      const int off = P::offset(bases, r, c, i);
      const int want = Dst::offset(col, row);
      if (row < 0 || row >= BK || col < 0 || col >= TILE) {
        failures += fmt::format("{}: thread {} pass {} copies ({}, {}), outside the tile\n", what,
                                tid, i, row, col);
        continue;
      }
      ++element_seen[row * TILE + col];
      if (off != want || Q::offset(none, r, c, i) != want)
        failures += fmt::format(
            "{}: thread {} pass {} ({}, {}) lands at byte {} (per pass: {}), the layout says {}\n",
            what, tid, i, row, col, off, Q::offset(none, r, c, i), want);
      else if (off < 0 || off % 4 != 0 || off >= Dst::kBytes)
        failures += fmt::format("{}: byte {} is not a word of the stage\n", what, off);
      else
        ++byte_seen[off / 4];
    }
  }
  for (int e = 0; e < BK * TILE; ++e)
    if (element_seen[e] != 1)
      failures += fmt::format("{}: element ({}, {}) copied {} times\n", what, e / TILE, e % TILE,
                              element_seen[e]);
  for (int w = 0; w < Dst::kBytes / 4; ++w)
    if (byte_seen[w] != 1)
      failures += fmt::format("{}: stage word {} written {} times\n", what, w, byte_seen[w]);
  return failures;
}

// A layout whose offsets do not move by a constant with the rows but claims they do: the
// shortcut then lands elements elsewhere.
struct Lying {
  static constexpr int kLinearPeriod = 8, kLinearStride = 128;
  static constexpr int kBytes = 64 * 128;
  static constexpr int offset(int row, int k) { return ((row * row) % 64) * 128 + k * 4; }
};

template <int BK, int TILE, int... THREADS>
std::string check_threads() {
  return (check_tf32_mn_operand<BK, TILE, THREADS>() + ...);
}

template <int BK, int... TILES>
std::string check_tiles() {
  return (check_threads<BK, TILES, 64, 128, 256, 512>() + ...);
}

}  // namespace

TEST_CASE(
    "tf32's MN-major copies: every element once, at the byte its layout names, from base "
    "offsets") {
  // BK of 16, 32 and 64 tf32 elements (rows of 64-256 bytes); tiles of 16-256 output indices;
  // 2-16 warps (KernelConfig's tf32 tiles are among these).
  const std::string failures = check_tiles<16, 16, 32, 64, 128, 256>() +
                               check_tiles<32, 16, 32, 64, 128, 256>() +
                               check_tiles<64, 16, 32, 64, 128, 256>();
  CHECK_MESSAGE(failures.empty(), failures.substr(0, 4000));
}

TEST_CASE("a wrong base offset is caught: the check compares with the layout, element by element") {
  using P = ElementPasses<Lying, 32, 64, 128, 8>;
  static_assert(P::kLinear);
  int wrong = 0;
  for (int tid = 0; tid < 128; ++tid) {
    const int r = P::first_row(tid), c = P::first_col(tid);
    const auto bases = P::bases(r, c);
    for (int i = 0; i < P::kIters; ++i)
      if (P::offset(bases, r, c, i) != Lying::offset(c + P::dc(i), r + P::dr(i))) ++wrong;
  }
  CHECK(wrong > 0);
}
