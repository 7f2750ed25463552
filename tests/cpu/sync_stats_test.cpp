// Synchronized statistics without a GPU: the rank-order merge the kernels run
// (common/column_stats.h) against float64 over the whole batch, for random splits with empty and
// single-row ranks; the schedule and workspace a synchronized problem gets; and the refusals of
// bad combinations, each naming its argument.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/column_stats.h"
#include "fusejit/backward.hpp"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/comm/nccl_exchange.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuning_db.hpp"

using namespace fusejit;

namespace {

// The records R ranks would exchange for one column split at `cuts`: each rank's (mean, M2)
// computed in float64 and rounded to float, as the GPU's per-rank merge delivers them.
std::vector<unsigned char> records_of(const std::vector<double>& column,
                                      const std::vector<std::size_t>& sizes) {
  const long long stride = fj::rank_record_bytes(1);
  std::vector<unsigned char> out(sizes.size() * static_cast<std::size_t>(stride), 0xCD);
  std::size_t row = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    double mean = 0, m2 = 0;
    for (std::size_t i = 0; i < sizes[r]; ++i) mean += column[row + i];
    if (sizes[r]) mean /= static_cast<double>(sizes[r]);
    for (std::size_t i = 0; i < sizes[r]; ++i)
      m2 += (column[row + i] - mean) * (column[row + i] - mean);
    row += sizes[r];
    unsigned char* rec = out.data() + r * static_cast<std::size_t>(stride);
    const fj::RankRecordHeader h{static_cast<long long>(sizes[r]), 0};
    std::memcpy(rec, &h, sizeof h);
    const float stats[2] = {static_cast<float>(mean), static_cast<float>(m2)};
    std::memcpy(rec + sizeof h, stats, sizeof stats);
  }
  return out;
}

}  // namespace

TEST_CASE("the rank-order merge of per-rank statistics equals float64 over the whole batch") {
  std::mt19937_64 rng(20261124);
  int cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int ranks = 1 + static_cast<int>(rng() % 8);
    // Sizes: some ranks empty or a single row (ragged last batches), the rest random.
    std::vector<std::size_t> sizes(static_cast<std::size_t>(ranks));
    for (auto& s : sizes) {
      const auto kind = rng() % 4;
      s = kind == 0 ? 0 : kind == 1 ? 1 : 1 + rng() % 3000;
    }
    std::size_t total = 0;
    for (auto s : sizes) total += s;
    if (total < 2) continue;
    // A column whose mean is large against its spread, as a badly centred feature is: sums of
    // squares would cancel here, Chan's merge must not.
    const double offset = (trial % 3 == 0) ? 1000.0 : (trial % 3 == 1 ? 0.0 : -3.0);
    std::normal_distribution<double> normal(offset, 1.0 + static_cast<double>(trial % 5));
    std::vector<double> column(total);
    for (auto& v : column) v = normal(rng);
    double mean = 0, m2 = 0;
    for (double v : column) mean += v;
    mean /= static_cast<double>(total);
    for (double v : column) m2 += (v - mean) * (v - mean);
    const std::vector<unsigned char> recs = records_of(column, sizes);
    float count = -1, got_mean = -1, got_m2 = -1;
    fj::merge_rank_records(recs.data(), ranks, 1, 0, count, got_mean, got_m2);
    CAPTURE(trial);
    CAPTURE(fmt::format("{}", fmt::join(sizes, ",")));
    CHECK(count == static_cast<float>(total));
    // float32 records and merge: each rank's mean arrives rounded to float (a unit roundoff u
    // of |mean|), which moves the merged variance by about u |mean| spread per record; beyond
    // that, a few u of the variance itself. Sums of squares would miss by u mean^2 instead
    // (1000x more for the offset columns).
    const double u = std::ldexp(1.0, -24);
    const double var = m2 / static_cast<double>(total), spread = std::sqrt(var);
    CHECK(std::abs(got_mean - mean) <= 8 * u * (std::abs(mean) + spread));
    CHECK(std::abs(got_m2 / static_cast<double>(total) - var) <=
          64 * u * var + 8 * u * std::abs(mean) * spread);
    ++cases;
  }
  CHECK(cases > 300);
}

TEST_CASE("one rank's statistics pass through the merge bit for bit; empty ranks change nothing") {
  std::vector<double> column{3.25, -1.5, 7.0, 2.0, 0.125};
  const auto one = records_of(column, {5});
  const auto with_empty = records_of(column, {0, 5, 0});
  float c1, m1, q1, c2, m2, q2;
  fj::merge_rank_records(one.data(), 1, 1, 0, c1, m1, q1);
  fj::merge_rank_records(with_empty.data(), 3, 1, 0, c2, m2, q2);
  float stats[2];
  std::memcpy(stats, one.data() + sizeof(fj::RankRecordHeader), sizeof stats);
  CHECK(c1 == 5.f);
  CHECK(std::memcmp(&m1, &stats[0], 4) == 0);
  CHECK(std::memcmp(&q1, &stats[1], 4) == 0);
  CHECK(std::memcmp(&m1, &m2, 4) == 0);
  CHECK(std::memcmp(&q1, &q2, 4) == 0);
  CHECK(c2 == 5.f);
  float c0, mean0, m20;
  const auto none = records_of(column, {0, 0});
  fj::merge_rank_records(none.data(), 2, 1, 0, c0, mean0, m20);
  CHECK(c0 == 0.f);
}

TEST_CASE("a synchronized problem is always two-pass, exchanges, and sizes its records") {
  const Device dev = Device::for_arch("sm_90a");
  Problem p;
  p.M = 100, p.N = 1000, p.K = 256, p.dtype = DType::bf16, p.stat_ranks = 4;
  const KernelConfig c = default_config(p, dev);
  CHECK(p.M <= c.bm);  // would be single-pass unsynchronized
  CHECK_FALSE(single_pass_class(p, c));
  const KernelSchedule s = schedule(p, c);
  CHECK(s.exchange);
  CHECK(s.apply);
  CHECK_FALSE(s.finalize);
  CHECK_FALSE(s.fold_finalize);
  CHECK(s.kernels ==
        std::vector<std::string>{"fj_gemm", "fj_rank_stats", "fj_rank_finalize", "fj_apply"});
  // An empty rank: no GEMM, no apply; fj_bump counts its batch.
  const KernelSchedule empty = schedule(p, c, 0);
  CHECK(empty.kernels == std::vector<std::string>{"fj_rank_stats", "fj_rank_finalize", "fj_bump"});
  const std::vector<std::string> set = kernel_set(p, c);
  for (const char* k : {"fj_gemm", "fj_rank_stats", "fj_rank_finalize", "fj_apply", "fj_bump"})
    CHECK(std::find(set.begin(), set.end(), k) != set.end());
  const WorkspaceLayout w = workspace_layout(p, c);
  CHECK(w.rank_record_bytes == static_cast<std::size_t>(fj::rank_record_bytes(p.N)));
  CHECK(w.rank_record_bytes >= 16 + 8 * static_cast<std::size_t>(p.N));
  CHECK(w.ranks_bytes == 4 * w.rank_record_bytes);
  CHECK(w.ranks_offset % kWorkspaceAlign == 0);
  CHECK(w.ranks_offset + w.ranks_bytes <= w.total);
  // The rank count is part of what the kernels are: in the key and the source.
  Problem unsynced = p;
  unsynced.stat_ranks = 0;
  CHECK(p.key() != unsynced.key());
  CHECK(p.key().find(":ranks4") != std::string::npos);
  CHECK(unsynced.key().find("ranks") == std::string::npos);
  CHECK(generate(p, c).text.find("RANKS = 4") != std::string::npos);
  CHECK(generate(unsynced, c).text.find("RANKS") == std::string::npos);
}

// A synchronized plan runs the choice made for the problem unsynchronized. That choice may be a
// recompute (grid_sync) config, whose first GEMM stores no y: run as it was, fj_apply normalized
// the output buffer's old contents (NaN in y at 600x200x72 bf16 on one rank, H200). Or an
// exact-M winner, whose kernel set refuses the ragged row counts ranks run. (The heuristic part
// checks the synchronized problem's own ranking; the tuned and reference parts are what failed
// before the dispatch handled stat_ranks.)
TEST_CASE("a synchronized problem's kernel choice is a two-pass config that can run it") {
  const Device dev = Device::for_arch("sm_90a");
  int recompute_choices = 0, overlap_winners = 0;
  for (const DType dtype : {DType::bf16, DType::fp16, DType::tf32, DType::fp32})
    for (const std::int64_t m : {2, 100, 600, 2000, 5000, 70000}) {
      Problem p;
      p.M = m, p.N = 200, p.K = 72, p.dtype = dtype, p.stat_ranks = 2;
      Problem unsynced = p;
      unsynced.stat_ranks = 0;
      CAPTURE(p.key());
      // A tuning table whose entry for the unsynchronized problem names `winner`.
      auto won_by = [&](const std::string& winner) {
        TuningTable t;
        TuningEntry e;
        e.problem = unsynced;
        e.winner = winner;
        t.entries[unsynced.key()] = e;
        return t;
      };
      const KernelChoice plain = choose_from_table(TuningTable{}, unsynced, dev);
      recompute_choices += plain.config.recompute;
      const KernelChoice heuristic = choose_from_table(TuningTable{}, p, dev);
      CAPTURE(heuristic.config.key());
      CHECK(heuristic.config.valid_for(p, dev));
      CHECK_FALSE(heuristic.config.recompute);
      CHECK_FALSE(heuristic.reference);
      // A tuned recompute + grid_sync winner of the unsynchronized problem: its plain twin.
      const std::vector<KernelConfig> candidates = candidate_configs(unsynced, dev);
      for (const KernelConfig& c : candidates) {
        if (!c.recompute) continue;
        const TuningTable t = won_by(c.key());
        const KernelChoice tuned = choose_from_table(t, p, dev);
        CAPTURE(c.key());
        CHECK(tuned.source == KernelChoice::Source::exact);
        KernelConfig twin = c;
        twin.recompute = twin.grid_sync = twin.input_stats = false;
        CHECK(tuned.config.key() == twin.key());
        CHECK(tuned.config.valid_for(p, dev));
        // The unsynchronized plan still gets the recompute config itself.
        CHECK(choose_from_table(t, unsynced, dev).config.key() == c.key());
      }
      // An exact-M winner of this very M: its dynamic twin, so every row count runs.
      {
        KernelConfig xm = candidates.front();
        xm.exact_m = true;
        const TuningTable t = won_by(xm.key());
        CHECK(choose_from_table(t, unsynced, dev).config.exact_m);
        const KernelChoice tuned = choose_from_table(t, p, dev);
        CAPTURE(xm.key());
        CHECK(tuned.source == KernelChoice::Source::exact);
        CHECK_FALSE(tuned.config.exact_m);
        CHECK_FALSE(tuned.config.recompute);
        CHECK(tuned.config.valid_for(p, dev));
      }
      // An overlap_apply winner (the apply inside the GEMM, whose in-kernel merge knows no
      // other rank): its two-pass twin.
      for (const KernelConfig& c : candidates) {
        KernelConfig oa = c;
        oa.overlap_apply = true;
        if (!oa.valid_for(unsynced, dev)) continue;
        const TuningTable t = won_by(oa.key());
        CHECK(choose_from_table(t, unsynced, dev).config.overlap_apply);
        const KernelChoice tuned = choose_from_table(t, p, dev);
        CAPTURE(oa.key());
        CHECK(tuned.source == KernelChoice::Source::exact);
        CHECK(tuned.config.key() == c.key());
        CHECK(tuned.config.valid_for(p, dev));
        ++overlap_winners;
        break;
      }
      // A reference winner: never the reference op, which has no exchange.
      const TuningTable t = won_by(std::string(kReferenceCandidate));
      CHECK(choose_from_table(t, unsynced, dev).reference);
      const KernelChoice ref = choose_from_table(t, p, dev);
      CHECK_FALSE(ref.reference);
      CHECK(ref.config.valid_for(p, dev));
    }
  // The case that failed: the unsynchronized heuristic does pick recompute configs here.
  CHECK(recompute_choices > 0);
  CHECK(overlap_winners > 0);
  // Where the heuristic takes the cuBLASLt reference op unsynchronized, a synchronized plan
  // (which has no exchange there) does not, with or without the tuning database.
  Problem big;
  big.M = 4096, big.N = 4096, big.K = 4096, big.dtype = DType::fp32;
  CHECK(heuristic_prefers_reference(big));
  CHECK(choose_from_table(TuningTable{}, big, dev).reference);
  big.stat_ranks = 2;
  CHECK_FALSE(heuristic_prefers_reference(big));
  CHECK_FALSE(choose_from_table(TuningTable{}, big, dev).reference);
}

TEST_CASE("bad synchronized-statistics combinations are refused, naming the argument") {
  auto argument_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return "(nothing thrown)";
  };
  Problem p;
  p.M = 64, p.N = 128, p.K = 64, p.dtype = DType::bf16;
  {
    Problem q = p;
    q.mode = Mode::eval;
    q.stat_ranks = 2;
    CHECK(argument_of([&] { q.validate(); }) == "stat_ranks");
  }
  {
    Problem q = p;
    q.stat_ranks = -1;
    CHECK(argument_of([&] { q.validate(); }) == "stat_ranks");
    q.stat_ranks = kMaxStatRanks + 1;
    CHECK(argument_of([&] { q.validate(); }) == "stat_ranks");
  }
  {
    // A synchronized rank may hold one row; an unsynchronized train batch may not.
    Problem q = p;
    q.M = 1;
    CHECK(argument_of([&] { q.validate(); }) == "M");
    q.stat_ranks = 2;
    q.validate();
  }
  // Checked before any GPU is touched, so these hold on machines without one.
  {
    Problem q = p;
    q.stat_ranks = 2;
    CHECK(argument_of([&] { Plan plan(q); }) == "stats_comm");
  }
  {
    PlanOptions o;
    o.stats_comm = reinterpret_cast<ncclComm*>(std::uintptr_t{0x1000});  // never dereferenced
    CHECK(argument_of([&] { Plan plan(p, o); }) == "stats_comm");
  }
  {
    Problem q = p;
    q.stat_ranks = 2;
    CHECK(argument_of([&] { BackwardPlan plan(q); }) == "stat_ranks");
  }
  CHECK(argument_of([] { StatsExchange e(nullptr, 2); }) == "stats_comm");
  std::string why;
  const bool have = nccl_available(&why);
  MESSAGE("NCCL here: " << (have ? "loaded" : why));
#if !FUSEJIT_HAVE_NCCL
  // Built without nccl.h: the option is refused with the reason, everything else works.
  CHECK_FALSE(have);
  CHECK(why.find("without NCCL") != std::string::npos);
  try {
    StatsExchange e(reinterpret_cast<ncclComm*>(std::uintptr_t{0x1000}), 2);
    FAIL("expected UnsupportedDevice");
  } catch (const UnsupportedDevice& e) {
    CHECK(std::string(e.what()).find("without NCCL") != std::string::npos);
  }
#endif
}
