// How a Plan picks its kernels when the caller forces neither a config nor a variant:
//   1. the tuning database's exact entry for the problem (TuningDb, Problem::key());
//   2. an entry of the same layer (everything but M equal) whose M lies in the same M class
//      (config/candidates.hpp), the nearest M first: the class shares its choice, and with it
//      a kernel set (an exact-M winner is taken as its dynamic twin);
//   3. with autotuning on (PlanOptions::autotune, FUSEJIT_AUTOTUNE=1) and neither: tune now,
//      record, use the winner;
//   4. the nearest tuned problem in the same bucket (tuning_db.hpp), if its winner is
//      valid_for this problem on this device;
//   5. the built-in heuristic: default_config, or the cuBLASLt reference op where
//      heuristic_prefers_reference says it is faster.
// A winner that cannot run the problem (KernelConfig::why_invalid) is skipped, never used.
// Synchronized statistics (Problem::stat_ranks > 0) use the entries of the same problem
// unsynchronized (and tune that one), run the entry's config in the two-pass schedule
// (synchronized_stats_config), never the reference op, and fall back to the heuristic's ranking
// of the two-pass configs of the synchronized problem.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tune/tuning_db.hpp"

namespace fusejit {

struct KernelChoice {
  enum class Source { exact, m_class, bucket, autotuned, heuristic };
  Source source = Source::heuristic;
  // The cuBLASLt reference op won the tuning: run it. `config` is then the fastest fused
  // config that passed verification (or the heuristic's), which the Plan still reports.
  bool reference = false;
  KernelConfig config;
  std::string detail;  // for the log: which entry was used, why another was not
};
// "tuned", "m-class", "bucket", "autotuned", "heuristic"
std::string_view name(KernelChoice::Source);

// Step 5's choice between the fused kernels and the reference op (ReferenceOp): the reference
// for strict fp32 problems with K >= 1536, or K >= 1024 and M * N >= 2^22, where cuBLAS's SGEMM
// plus plain BatchNorm passes beat the fused SIMT kernel (measured on H100 and H200); never with
// synchronized statistics.
bool heuristic_prefers_reference(const Problem& p);

// Steps 1, 2, 4 and 5 on a table already loaded (no GPU, no tuning).
KernelChoice choose_from_table(const TuningTable& table, const Problem& p, const Device& d);

// All four steps on the database of `d` under `cache_dir`. Tuning runs on `d` (its ordinal's
// primary context; the caller's current context is restored afterwards); concurrent callers
// for the same problem wait for one tuning. A tuning that fails is logged (warning) and the
// choice falls back to steps 3 and 4.
KernelChoice choose_kernel(const Problem& p, const Device& d, const std::string& cache_dir,
                           bool autotune);

// The kernel sources a Plan that made `choice` for `p` loads: its fused core's (the Plan builds
// it even when it runs the reference op) and, when choice.reference, the reference op's plain
// kernels. `fusejit compile` warms exactly these, so a warmed cache serves the Plan whole.
std::vector<KernelSource> plan_sources(const Problem& p, const KernelChoice& choice);

// How a BackwardPlan picks its gradient GEMMs' tiles when the caller forces neither: the
// database's backward entry for the problem (`fusejit autotune --backward`), else one of the same
// layer and M class (the nearest M first: the class shares a kernel set), else the heuristic
// (default_backward_config). A winner the problem cannot run (grad_gemm_why_invalid) is skipped
// with the reason in `detail`. No nearest-bucket step: a backward entry names two GEMMs whose
// best tiles move with all three sizes.
struct BackwardChoice {
  KernelChoice::Source source = KernelChoice::Source::heuristic;  // exact, m_class, heuristic
  BackwardConfig config;
  std::string detail;
};
BackwardChoice choose_backward_from_table(const TuningTable& table, const Problem& p,
                                          const Device& d);
// The same on the database of `d` under `cache_dir`, logged.
BackwardChoice choose_backward(const Problem& p, const Device& d, const std::string& cache_dir);

}  // namespace fusejit
