// Split-K's host-visible contracts: the k-tile partition the GEMM kernel uses (the same function,
// templates/common/split_k.h) and the workspace regions the plan hands the kernels.
#include <doctest/doctest.h>

#include <algorithm>

#include "common/split_k.h"
#include "fusejit/config/candidates.hpp"
#include "fusejit/plan/plan_core.hpp"

using namespace fusejit;

namespace {

Problem problem(Mode m, std::int64_t M, std::int64_t N, std::int64_t K) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = DType::fp32, p.mode = m;
  return p;
}

}  // namespace

TEST_CASE("split-K ranges partition the k tiles into contiguous, balanced, non-empty shares") {
  for (int kt = 1; kt <= 70; ++kt)
    for (int s = 1; s <= std::min(kt, KernelConfig::kMaxSplitK); ++s) {
      CAPTURE(kt);
      CAPTURE(s);
      int next = 0, shortest = kt, longest = 0;
      for (int i = 0; i < s; ++i) {
        const fj::KRange r = fj::split_k_range(kt, s, i);
        CHECK(r.begin == next);
        shortest = std::min(shortest, r.end - r.begin);
        longest = std::max(longest, r.end - r.begin);
        next = r.end;
      }
      CHECK(next == kt);
      CHECK(shortest >= 1);
      CHECK(longest - shortest <= 1);
    }
}

TEST_CASE("the split-K workspace holds S x tiles x BM x BN floats after the train regions") {
  KernelConfig c = KernelConfig::parse("tiled.64x64x16.w2x1.s3.g8");
  for (Mode m : {Mode::train, Mode::eval})
    for (std::int64_t M : {std::int64_t{64}, std::int64_t{100}, std::int64_t{3000}}) {
      CAPTURE(name(m));
      CAPTURE(M);
      const Problem p = problem(m, M, 200, 1000);
      c.split_k = 1;
      const WorkspaceLayout plain = workspace_layout(p, c);
      CHECK(plain.splitk_bytes == 0);
      c.split_k = 5;
      const WorkspaceLayout w = workspace_layout(p, c);
      const std::size_t row_tiles = static_cast<std::size_t>((M + 63) / 64), col_tiles = 4;
      CHECK(w.splitk_bytes == 5 * row_tiles * col_tiles * 64 * 64 * 4);
      // The train regions are where they were without split-K; the slices come after them.
      CHECK(w.partials_offset == plain.partials_offset);
      CHECK(w.partials_bytes == plain.partials_bytes);
      CHECK(w.coef_offset == plain.coef_offset);
      CHECK(w.coef_bytes == plain.coef_bytes);
      CHECK(w.splitk_offset == plain.total);
      CHECK(w.splitk_offset % 256 == 0);
      CHECK(w.total >= w.splitk_offset + w.splitk_bytes);
      CHECK(w.total % 256 == 0);
      CHECK(w.total - (w.splitk_offset + w.splitk_bytes) < 256);
      // Two-pass train needs the partials and coefficients; eval and single-pass train do not.
      CHECK((plain.total > 0) == (m == Mode::train && M > 64));
    }
  // The unsplit two-pass layout: 47 row tiles x 200 columns of float2, then 200 float4
  // coefficients {A, B, mean_a, unused}, each region 256-byte aligned.
  c.split_k = 1;
  const WorkspaceLayout two_pass = workspace_layout(problem(Mode::train, 3000, 200, 1000), c);
  CHECK(two_pass.partials_offset == 0);
  CHECK(two_pass.partials_bytes == 75200);
  CHECK(two_pass.coef_offset == 75264);
  CHECK(two_pass.coef_bytes == 3200);
  CHECK(two_pass.total == 78592);
  // The warpspec variant never splits.
  const Problem p = problem(Mode::eval, 128, 512, 1024);
  CHECK(workspace_layout(p, KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p1")).total == 0);
}
