// Per-column batch statistics as (count, mean, M2) and how they merge: shared verbatim by the
// kernels (bn_finalize, bn_ranks), the host's workspace layout and the CPU tests, so the merge
// the tests check is the one the GPU runs. Plain C++: no CUDA headers.
#pragma once
#include "common/host_device.h"

namespace fj {

// Chan et al.'s pairwise update: merges (nb, mean_b, m2_b) into (na, mean_a, m2_a). Stable
// where E[x^2] - E[x]^2 would cancel (columns whose mean is large against their spread).
// nb > 0, or na > 0 (0/0 otherwise).
FJ_HOST_DEVICE inline void chan_merge(float& na, float& mean_a, float& m2_a, float nb, float mean_b,
                                      float m2_b) {
  const float n = na + nb;
  const float delta = mean_b - mean_a;
  const float wb = nb / n;
  mean_a += delta * wb;
  m2_a += m2_b + delta * delta * na * wb;
  na = n;
}

// Synchronized statistics (Problem::stat_ranks): what one rank contributes to the exchange, its
// rows' per-column (mean, M2) and their count, all ranks' records gathered side by side in
// rank order. A record is a 16-byte header (the count as an exact integer: a float count would
// round past 2^24 rows) followed by [N] (mean, M2) float pairs, padded to 16 bytes.
struct RankRecordHeader {
  long long count;
  long long unused;
};
FJ_HOST_DEVICE constexpr long long rank_record_bytes(long long n) {
  return (static_cast<long long>(sizeof(RankRecordHeader)) + 8 * n + 15) / 16 * 16;
}

// Column n's global (count, mean, M2) from the gathered records, merged in rank order 0..R-1
// so that every rank, reading the same bytes, computes the same bits whatever order the
// messages arrived in. Empty ranks are skipped (they carry no mean); with no rows at all the
// result is (0, 0, 0).
FJ_HOST_DEVICE inline void merge_rank_records(const unsigned char* records, int ranks,
                                              long long n_cols, long long n, float& count,
                                              float& mean, float& m2) {
  count = 0.f;
  mean = 0.f;
  m2 = 0.f;
  const long long stride = rank_record_bytes(n_cols);
  for (int r = 0; r < ranks; ++r) {
    const unsigned char* rec = records + r * stride;
    const long long rows = reinterpret_cast<const RankRecordHeader*>(rec)->count;
    if (rows <= 0) continue;
    const float* stats = reinterpret_cast<const float*>(rec + sizeof(RankRecordHeader)) + 2 * n;
    if (count == 0.f) {
      // The first non-empty rank is taken as it is: one rank's statistics pass through bit for
      // bit, so a communicator of one rank gives the unsynchronized result.
      count = static_cast<float>(rows);
      mean = stats[0];
      m2 = stats[1];
    } else {
      chan_merge(count, mean, m2, static_cast<float>(rows), stats[0], stats[1]);
    }
  }
}

}  // namespace fj
