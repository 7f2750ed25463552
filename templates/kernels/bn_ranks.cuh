// Train mode with synchronized statistics (Problem::stat_ranks = R): the two-pass schedule with
// an exchange in the middle. The GEMM leaves per-row-tile partials as usual; then
//   fj_rank_stats     merges this rank's row tiles into its record (count, [N] x (mean, M2)),
//   ncclAllGather     (the host enqueues it) puts every rank's record beside it, in rank order,
//   fj_rank_finalize  merges the R records in rank order (merge_rank_records) and does what
//                     fj_finalize does with the global statistics: running stats with the
//                     global unbiased variance, saved stats, the (A, B, mean_a) fj_apply uses,
// and fj_apply rewrites this rank's y. Why records of (count, mean, M2) rather than sums of a
// and a^2: the sums cancel for columns whose mean is large against their spread; Chan's merge
// does not, and merging in a fixed order makes every rank's statistics the same bits. The
// single-pass schedule (one row tile normalized in the GEMM's epilogue) cannot exist here:
// nothing of y is final before the exchange, so every synchronized set is two-pass.
#pragma once
#include "common/column_stats.h"
#include "common/grid_dependency.cuh"
#include "common/params.h"
#include "common/rows.cuh"
#include "epilogue/bn_math.cuh"
#include "kernels/bn_finalize.cuh"

namespace fj {

template <class Spec>
struct RankFinalizeShape {
  static constexpr int kThreads = 256;
  static constexpr int kGridX = (Spec::N + kThreads - 1) / kThreads;
};

// Grid and block of fj_finalize (FinalizeShape): this rank's row tiles merged per column, as
// fj_finalize merges them, so one rank reproduces the unsynchronized statistics bit for bit.
template <class Spec>
__device__ void bn_rank_stats(const Params& p) {
  wait_for_prior_grid();
  int n;
  float cnt, mean, m2;
  const bool holder = merge_column_partials<Spec>(p, n, cnt, mean, m2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    RankRecordHeader h;
    h.count = rows_of<Spec>(p);
    h.unused = 0;
    *reinterpret_cast<RankRecordHeader*>(p.ws_rank_record) = h;
  }
  if (!holder) return;
  reinterpret_cast<float2*>(p.ws_rank_record + sizeof(RankRecordHeader))[n] = make_float2(mean, m2);
}

template <class Spec>
__device__ void bn_rank_finalize(const Params& p) {
  static_assert(Spec::RANKS > 0, "synchronized statistics need the rank count");
  wait_for_prior_grid();
  const int n = blockIdx.x * RankFinalizeShape<Spec>::kThreads + threadIdx.x;
  if (n >= Spec::N) return;
  float cnt, mean, m2;
  merge_rank_records(p.ws_ranks, Spec::RANKS, Spec::N, n, cnt, mean, m2);
  // No rank had a row: the batch mean is 0/0 as much as the variance, so both are NaN (the
  // merge's 0 would quietly pull running_mean towards scale * bias); nothing of y exists to be
  // normalized with them. PyTorch raises here; a kernel after the exchange cannot.
  if (cnt == 0.f) mean = __int_as_float(0x7fc00000);
  const Affine f = train_column_of<Spec>(p, n, mean, m2 / cnt, momentum_factor<Spec>(p), true, cnt);
  store_column_coefficients(p, n, f, mean);
}

}  // namespace fj
