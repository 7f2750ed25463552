// ElementLoader's copies (mainloop/element_passes.h), checked on the host over tf32 tile shapes
// that include every one KernelConfig offers: the passes of all threads copy every element of
// the tile exactly once, each to the byte its stage layout names, and the base-offset path is
// the one tf32's MN-major operands take at the BK every tf32 tile has. No GPU needed.
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

// Checks every pass of every thread of ElementPasses<Dst, BK, TILE, THREADS, 8> (BK k rows of the
// source, TILE output columns: tf32's MN-major operand turned into Dst). Returns failures, one
// line each.
template <class Dst, int BK, int TILE, int THREADS>
std::string check_passes() {
  using P = ElementPasses<Dst, BK, TILE, THREADS, 8>;
  const std::string what = fmt::format("BK {} tile {} threads {}", BK, TILE, THREADS);
  std::string failures;
  std::vector<int> element_seen(BK * TILE, 0);
  std::vector<int> word_seen(Dst::kBytes / 4, 0);
  for (int tid = 0; tid < THREADS; ++tid) {
    const int r = P::first_row(tid), c = P::first_col(tid);
    const auto bases = P::bases(r, c);
    for (int i = 0; i < P::kIters; ++i) {
      if (!P::in_tile(tid / 8, i)) break;
      const int row = r + P::dr(i), col = c + P::dc(i);
      if (row < 0 || row >= BK || col < 0 || col >= TILE) {
        failures += fmt::format("{}: thread {} pass {} copies ({}, {}), outside the tile\n", what,
                                tid, i, row, col);
        continue;
      }
      ++element_seen[row * TILE + col];
      const int off = P::offset(bases, r, c, i), want = Dst::offset(col, row);
      if (off != want)
        failures +=
            fmt::format("{}: thread {} pass {} ({}, {}) lands at byte {}, the layout says {}\n",
                        what, tid, i, row, col, off, want);
      else if (off < 0 || off % 4 != 0 || off >= Dst::kBytes)
        failures += fmt::format("{}: byte {} is not a word of the stage\n", what, off);
      else
        ++word_seen[off / 4];
    }
  }
  for (int e = 0; e < BK * TILE; ++e)
    if (element_seen[e] != 1)
      failures += fmt::format("{}: element ({}, {}) copied {} times\n", what, e / TILE, e % TILE,
                              element_seen[e]);
  for (int w = 0; w < Dst::kBytes / 4; ++w)
    if (word_seen[w] != 1)
      failures += fmt::format("{}: stage word {} written {} times\n", what, w, word_seen[w]);
  return failures;
}

// tf32's MN-major operand (mainloop/tiled_mma.cuh, MmaOperand): a BK x TILE tile of the source
// turned into the K-major SwizzledTile [TILE][BK / 4 chunks].
template <int BK, int TILE, int THREADS>
std::string check_tf32_mn_operand() {
  using Dst = SwizzledWords<SwizzledTile<TILE, BK / 4>>;
  std::string failures = check_passes<Dst, BK, TILE, THREADS>();
  // Every tf32 tile KernelConfig offers has BK = 32: those take the base offsets. (At BK = 16 the
  // swizzle repeats every 16 rows, and where a pass moves 8 the offsets are per pass.)
  if (BK == 32 && !ElementPasses<Dst, BK, TILE, THREADS, 8>::kLinear)
    failures += fmt::format("BK {} tile {} threads {}: the base-offset path is not taken\n", BK,
                            TILE, THREADS);
  return failures;
}

template <int BK, int TILE, int... THREADS>
std::string check_threads() {
  return (check_tf32_mn_operand<BK, TILE, THREADS>() + ...);
}

template <int BK, int... TILES>
std::string check_tiles() {
  return (check_threads<BK, TILES, 32, 64, 128, 256, 512, 1024>() + ...);
}

// A layout whose offsets do not move by a constant with the rows but claims they do.
struct Lying {
  static constexpr int kLinearPeriod = 8, kLinearStride = 128;
  static constexpr int kBytes = 64 * 128;
  static constexpr int offset(int row, int k) { return ((row * row) % 64) * 128 + k * 4; }
};

}  // namespace

TEST_CASE(
    "tf32's MN-major copies: every element once, at the byte its layout names, from base "
    "offsets") {
  // BK of 8-128 tf32 elements (rows of 32-512 bytes); tiles of 8-256 output indices, powers of
  // two and not; 1-32 warps. KernelConfig's tf32 tiles (BK 32; 128 or 256 threads) are among them.
  const std::string failures = check_tiles<8, 8, 16, 48, 64, 96, 128, 192, 256>() +
                               check_tiles<16, 8, 16, 48, 64, 96, 128, 192, 256>() +
                               check_tiles<32, 8, 16, 48, 64, 96, 128, 192, 256>() +
                               check_tiles<64, 8, 16, 48, 64, 96, 128, 192, 256>() +
                               check_tiles<128, 8, 16, 48, 64, 96, 128, 192, 256>();
  CHECK_MESSAGE(failures.empty(), failures.substr(0, 4000));
}

TEST_CASE("the check fails on a layout whose base offsets would land elements elsewhere") {
  static_assert(ElementPasses<Lying, 32, 64, 128, 8>::kLinear);
  CHECK_FALSE(check_passes<Lying, 32, 64, 128>().empty());
}
