#include "fusejit/tune/dispatch.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <future>
#include <map>
#include <mutex>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/tune/tuner.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fusejit {

namespace {

// The entry's choice for `p` on `d`, or nullopt (with *why) when its winner cannot run `p`.
std::optional<KernelChoice> usable(const TuningEntry& e, const Problem& p, const Device& d,
                                   std::string* why) {
  KernelChoice c;
  if (e.winner == kReferenceCandidate) {
    c.reference = true;
    // The fused config the Plan reports: the entry's best fused one where it can run p.
    std::optional<KernelConfig> fused;
    if (!e.best_fused.empty()) {
      const KernelConfig k = KernelConfig::parse(e.best_fused);
      if (k.valid_for(p, d)) fused = k;
    }
    c.config = fused ? *fused : default_config(p, d);
    return c;
  }
  KernelConfig k = KernelConfig::parse(e.winner);
  // An exact-M winner serves its own M; for another M its dynamic twin shares a kernel set.
  if (e.problem.M != p.M) k.exact_m = false;
  if (const std::string w = k.why_invalid(p, d); !w.empty()) {
    *why = fmt::format("{} cannot run it ({})", e.winner, w);
    return std::nullopt;
  }
  c.config = k;
  return c;
}

std::string describe(const TuningEntry& e) {
  return fmt::format(
      "{} {:.4f} ms{}", e.winner, e.winner_ms,
      e.reference_ms ? fmt::format(", cuBLASLt {:.4f} ms", *e.reference_ms) : std::string());
}

// One tuning per (database, problem) at a time in this process; later callers share it.
TuningEntry tune_once(const TuningDb& db, const Problem& p, const Device& d,
                      const std::string& cache_dir) {
  static SingleFlight<TuningEntry> flights(SingleFlight<TuningEntry>::Keep::nothing);
  // Recorded (or failed) when done: later plans read the database.
  return flights.get(db.path().string() + "|" + p.key(), [&] {
    ScopedContext keep;  // tuning works in the primary context
    TunerOptions o;
    o.device = d.ordinal;
    o.cache_dir = cache_dir;
    return tune(p, o).entry;
  });
}

// Synchronized statistics (Problem::stat_ranks > 0) change the BatchNorm passes, not the GEMM:
// tuning entries are those of the same problem unsynchronized (a tuning cannot run an
// exchange). Its choice is turned into one the synchronized schedule can run: never the
// cuBLASLt reference op, which has no exchange, never a recompute (grid_sync) config, whose
// statistics end inside one rank's kernels, and never an exact-M set, since ranks run ragged
// row counts (synchronized_stats_config); the heuristic ranks the two-pass configs of `p`
// itself.
Problem unsynchronized(Problem p) {
  p.stat_ranks = 0;
  return p;
}

KernelChoice synchronized_choice(KernelChoice c, const Problem& p, const Device& d) {
  const std::string ranks = fmt::format(
      "statistics synchronized over {} ranks (two-pass configs, no cuBLASLt path)", p.stat_ranks);
  c.reference = false;
  if (c.source != KernelChoice::Source::heuristic) {
    const KernelConfig k = synchronized_stats_config(c.config);
    const std::string why = k.why_invalid(p, d);
    if (why.empty()) {
      c.config = k;
      c.detail += fmt::format("; {}: {}", ranks, k.key());
      return c;
    }
    c.detail += fmt::format("; {} cannot run synchronized ({})", k.key(), why);
  }
  c.source = KernelChoice::Source::heuristic;
  c.config = default_config(p, d);
  c.detail += fmt::format("; {}: heuristic {}", ranks, c.config.key());
  return c;
}

}  // namespace

std::string_view name(KernelChoice::Source s) {
  switch (s) {
    case KernelChoice::Source::exact:
      return "tuned";
    case KernelChoice::Source::m_class:
      return "m-class";
    case KernelChoice::Source::bucket:
      return "bucket";
    case KernelChoice::Source::autotuned:
      return "autotuned";
    case KernelChoice::Source::heuristic:
      return "heuristic";
  }
  return "?";
}

KernelChoice choose_from_table(const TuningTable& table, const Problem& p, const Device& d) {
  if (p.stat_ranks > 0)
    return synchronized_choice(choose_from_table(table, unsynchronized(p), d), p, d);
  std::string skipped;
  if (auto it = table.entries.find(p.key()); it != table.entries.end()) {
    std::string why;
    if (auto c = usable(it->second, p, d, &why)) {
      c->source = KernelChoice::Source::exact;
      c->detail = "tuned: " + describe(it->second);
      return *c;
    }
    skipped = "tuned entry skipped: " + why + "; ";
  }
  if (const TuningEntry* e = same_m_class(table, p)) {
    std::string why;
    if (auto c = usable(*e, p, d, &why)) {
      c->source = KernelChoice::Source::m_class;
      c->detail = fmt::format("{}tuned M = {} of the same layer and M class: {}", skipped,
                              e->problem.M, describe(*e));
      return *c;
    }
    skipped += fmt::format("tuned M = {} of the same class skipped: {}; ", e->problem.M, why);
  }
  if (auto m = nearest_bucket(table, p)) {
    std::string why;
    if (auto c = usable(*m.value().entry, p, d, &why)) {
      c->source = KernelChoice::Source::bucket;
      c->detail =
          fmt::format("{}nearest tuned {} (log2 distance {:.2f}): {}", skipped,
                      format_shape(m->entry->problem.shape()), m->distance, describe(*m->entry));
      return *c;
    }
    skipped +=
        fmt::format("nearest tuned {} skipped: {}; ", format_shape(m->entry->problem.shape()), why);
  }
  KernelChoice c;
  c.source = KernelChoice::Source::heuristic;
  c.config = default_config(p, d);
  c.reference = heuristic_prefers_reference(p);
  c.detail = skipped + "no usable tuning entry";
  if (c.reference) c.detail += "; strict fp32 with a long K: cuBLAS SGEMM + BatchNorm passes";
  return c;
}

bool heuristic_prefers_reference(const Problem& p) {
  // Strict fp32 has no tensor cores to fuse into: the fused SIMT kernel runs at 1.16-1.30x
  // cuBLAS's SGEMM time, while SGEMM followed by the reference op's BatchNorm passes (which
  // cost two or three trips over y) stays at 1.01-1.07x once the GEMM dominates those trips
  // (H100: 2048^3 up to 16384x4096x4096). docs/performance.md, fifth session.
  // At K >= 1536 the reference op wins at every output size measured (H200, train and eval:
  // 64x256x8192 0.029 vs 0.052 ms, 128x512x4096 0.036 vs 0.059, 384x3072x1536 0.114 vs 0.197,
  // 1536^3 0.201 vs 0.317), since cuBLASLt splits K where our SIMT split-K tiles lag it. Shorter
  // K keeps the fused kernels, which win or tie there (1000x1001x1003, 1024^3, 128x512x1024,
  // 4096x4096x256), except on large outputs (1024x4096x1024 and up: a tie or the reference).
  // docs/performance.md, "The reference op writes saved".
  // Narrow train layers too, since fj_ref_stats splits the rows into chunks: 16384x512x2048
  // 0.748 vs 0.842 ms, 65536x256x1024 0.830 vs 0.880; 8192x768x2048 the one loss, 0.669 vs 0.655.
  constexpr std::int64_t kLongK = 1536, kMinK = 1024, kMinOutputs = std::int64_t{1} << 22;
  // Synchronized statistics: the reference op has no exchange.
  if (p.stat_ranks != 0 || p.dtype != DType::fp32) return false;
  return p.K >= kLongK || (p.K >= kMinK && p.M * p.N >= kMinOutputs);
}

KernelChoice choose_kernel(const Problem& p, const Device& d, const std::string& cache_dir,
                           bool autotune) {
  if (p.stat_ranks > 0) {
    const KernelChoice c =
        synchronized_choice(choose_kernel(unsynchronized(p), d, cache_dir, autotune), p, d);
    log()->info("plan {}: {} {} ({})", p.key(), name(c.source), c.config.key(), c.detail);
    return c;
  }
  const TuningDb db = TuningDb::for_device(d, cache_dir);
  const auto table = db.table();
  KernelChoice c = choose_from_table(*table, p, d);
  // Tuned once per M class of a layer: a loop over batch sizes measures nothing new.
  if (autotune && c.source != KernelChoice::Source::exact &&
      c.source != KernelChoice::Source::m_class) {
    try {
      const TuningEntry e = tune_once(db, p, d, cache_dir);
      std::string why;
      if (auto tuned = usable(e, p, d, &why)) {
        c = *tuned;
        c.source = KernelChoice::Source::autotuned;
        c.detail = "autotuned: " + describe(e);
      }
    } catch (const std::exception& e) {
      log()->warn("autotune {} failed ({}); using the {} choice", p.key(), e.what(),
                  name(c.source));
    }
  }
  log()->info("plan {}: {} {} ({})", p.key(), name(c.source),
              c.reference ? std::string("reference (cuBLASLt)") : c.config.key(), c.detail);
  return c;
}

BackwardChoice choose_backward_from_table(const TuningTable& table, const Problem& p,
                                          const Device& d) {
  std::string skipped;
  // The entry's config where both of its GEMMs can run p here.
  // Judged at the M class's representative (backward_config_why_invalid), as
  // default_backward_config chooses: the kernel set reads M at run time and serves the class.
  auto usable_backward = [&](const TuningEntry& e) -> std::optional<BackwardConfig> {
    const BackwardConfig c = BackwardConfig::parse(e.winner);
    const std::string why = backward_config_why_invalid(p, c, d);
    if (why.empty()) return c;
    skipped +=
        fmt::format("tuned M = {} skipped: {} cannot run it ({}); ", e.problem.M, e.winner, why);
    return std::nullopt;
  };
  BackwardChoice out;
  const auto& entries = table.of(TunedPass::backward);
  const Problem filed = backward_entry_problem(p);  // the momentum does not matter backward
  if (auto it = entries.find(filed.key()); it != entries.end())
    if (auto c = usable_backward(it->second)) {
      out.source = KernelChoice::Source::exact;
      out.config = *c;
      out.detail = fmt::format("tuned: {} {:.4f} ms", it->second.winner, it->second.winner_ms);
      return out;
    }
  if (const TuningEntry* e = same_m_class(table, filed, TunedPass::backward))
    if (auto c = usable_backward(*e)) {
      out.source = KernelChoice::Source::m_class;
      out.config = *c;
      out.detail = fmt::format("{}tuned M = {} of the same layer and M class: {} {:.4f} ms",
                               skipped, e->problem.M, e->winner, e->winner_ms);
      return out;
    }
  out.config = default_backward_config(p, d);
  out.detail = skipped + "no usable backward tuning entry";
  return out;
}

BackwardChoice choose_backward(const Problem& p, const Device& d, const std::string& cache_dir) {
  const BackwardChoice c =
      choose_backward_from_table(*TuningDb::for_device(d, cache_dir).table(), p, d);
  log()->info("backward plan {}: {} {} ({})", p.key(), name(c.source), c.config.key(), c.detail);
  return c;
}

std::vector<KernelSource> plan_sources(const Problem& p, const KernelChoice& choice) {
  std::vector<KernelSource> out{generate(p, choice.config)};
  if (choice.reference) out.push_back(reference_kernel_source(p.dtype, p.param_dtype));
  return out;
}

}  // namespace fusejit
