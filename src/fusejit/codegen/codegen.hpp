// (Problem, KernelConfig) -> KernelSource: a short generated prelude of constexpr values
// (struct Spec), the template includes and the extern "C" kernels one run launches.
// Deterministic: the same inputs give byte-identical text, which is what keys the caches.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// M is a run-time value: one kernel set serves every M of a layer (N, K, dtypes, mode, flags,
// strides, alignment) and config in one schedule class. Train mode has two classes, because
// the GEMM's epilogue differs: single-pass (M <= BM: one row tile holds whole columns, the
// epilogue normalizes y itself) and two-pass (M > BM: the epilogue leaves per-row-tile
// partials, fj_apply normalizes). A two-pass set holds both apply kernels, folded and not, and
// each run picks one by its row tiles. Synchronized statistics (stat_ranks > 0) are always
// two-pass (nothing of y is final before the ranks exchange). Eval mode has one class. With
// config.exact_m, M is a compile-time constant instead and the set serves that M only.
// (single_pass_class, which tells the train classes apart, is in config/candidates.hpp.)

// Which kernels a run of `rows` rows (1 <= rows <= p.M; rows == p.M for exact_m) launches, in
// order, and their names in the generated source.
struct KernelSchedule {
  bool single_pass = false;    // train: the GEMM's epilogue sees whole columns (one row tile)
  bool fold_finalize = false;  // train, two-pass: fj_apply merges the partials itself
  // Split-K (tiled, split_k > 1): fj_gemm leaves fp32 slices, fj_splitk_reduce adds them and runs
  // the epilogue; the kernels after it are the unsplit schedule's.
  bool split_k = false;
  // What goes out after the GEMM (and the split-K reduce): fj_finalize; fj_apply or, with
  // fold_finalize, fj_apply_fold; fj_bump.
  bool finalize = false, apply = false, bump = false;
  // KernelConfig::recompute: fj_gemm stores no y (statistics only), fj_finalize folds them, and
  // fj_gemm_affine, the GEMM again, stores y = A a + B and bumps num_batches_tracked.
  bool affine = false;
  // KernelConfig::input_stats (with `affine`): fj_input_stats goes out first as a cooperative
  // launch and records the statistics itself, its fallback for flagged columns included; the
  // affine GEMM follows. The statistics GEMM and fj_finalize run (as recompute's) only where
  // the driver refuses the cooperative launch.
  bool input_stats = false;
  // KernelConfig::grid_sync, and the run can be resident (resident_grid, config/candidates.hpp,
  // from the device's `resident_tiles`): fj_gemm goes out alone as a cooperative launch and
  // finishes the run, in one round or several; no fj_finalize, no fj_gemm_affine.
  bool grid_sync = false;
  // KernelConfig::overlap_apply, two-pass class: fj_gemm goes out alone as a cooperative launch,
  // merges and applies each column panel itself and bumps num_batches_tracked; no fj_finalize,
  // fj_apply or fj_bump (the set keeps fj_finalize and fj_apply for a refused launch).
  bool overlap = false;
  // Synchronized statistics (Problem::stat_ranks > 0): fj_rank_stats, the all-gather and
  // fj_rank_finalize stand where fj_finalize stands; a run of no rows (an empty rank) launches
  // no GEMM (`gemm` false) and no apply, only the exchange and fj_bump.
  bool exchange = false, gemm = true;
  // KernelConfig::pad_operands: fj_pad_operands copies x and W into aligned rows before the
  // GEMM (whenever there is a GEMM).
  bool pad = false;
  // e.g. {"fj_gemm", "fj_splitk_reduce", "fj_finalize", ...}; fj_pad_operands comes first.
  std::vector<std::string> kernels;
};
// `resident_tiles`: how many tiles the device holds at once for a grid_sync config (the plan's
// PlanCore::resident_tiles); 0, the default, never runs resident.
KernelSchedule schedule(const Problem&, const KernelConfig&, std::int64_t rows,
                        unsigned resident_tiles = 0);
// The same decisions without the kernel names (allocates nothing): Plan::run(rows) sizes its
// launches with it on every call.
KernelSchedule schedule_flags(const Problem&, const KernelConfig&, std::int64_t rows,
                              unsigned resident_tiles = 0);
inline KernelSchedule schedule(const Problem& p, const KernelConfig& c) {
  return schedule(p, c, p.M);
}
// With few row tiles, each fj_apply block re-merging its columns' partials costs less than a
// separate finalize launch (which runs alone, between the GEMM and the apply pass).
inline constexpr std::int64_t kFoldMaxRowTiles = 8;

// Every kernel the set of (p, c) holds: what any run it serves may launch.
std::vector<std::string> kernel_set(const Problem&, const KernelConfig&);

// The source of that set. It names M only with exact_m: two problems that differ in M alone
// (in one schedule class) give byte-identical text, hence one cache key and one compile.
KernelSource generate(const Problem&, const KernelConfig&);

// The problem's key with M replaced by "M" unless `c.exact_m`: what the kernel set depends on.
std::string kernel_set_problem_key(const Problem&, const KernelConfig&);

// The templates' name of the math a dtype runs with ("fj::kMathBf16", common/math_kind.cuh).
const char* template_math_name(DType);

// The embedded templates as NVRTC headers (include name, contents).
const std::vector<std::pair<std::string, std::string>>& template_headers();

// NVRTC options of every generated kernel set, besides the target (part of the cache key).
std::vector<std::string> kernel_compile_options();

}  // namespace fusejit
