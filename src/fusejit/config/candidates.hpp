// The library's side of kernel configs: the candidates it considers, the heuristic's pick, the
// time model that orders them, and the layout constants host code shares with the templates.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/kernel_config.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// Whether y's rows can take TMA stores (KernelConfig::tma_store): whole 16-byte units per row
// (N % 8 == 0 in 16-bit types, N % 4 == 0 in fp32) and 16-byte aligned rows.
bool y_rows_take_tma_stores(const Problem&);

// Train mode's schedule class (codegen.hpp): single-pass when one row tile holds the plan's M
// rows and no ranks synchronize; two-pass otherwise.
bool single_pass_class(const Problem&, const KernelConfig&);
// KernelConfig::recompute's second GEMM pass computes y as eval mode does, from coefficients the
// finalize wrote: its kernel is specialized (and its shared memory sized) as eval mode's.
Problem recompute_affine_problem(Problem p);
// KernelConfig::pad_operands: x and W are copied into rows of padded_row_elements() elements
// (K rounded up to kPaddedRowAlign bytes: every TMA box row then starts on a 128-byte line),
// W's N rows first, then x's. The GEMM's tensor maps are those of padded_operands_problem(p),
// p with those row strides.
inline constexpr std::int64_t kPaddedRowAlign = 128;
std::int64_t padded_row_elements(const Problem&);
Problem padded_operands_problem(Problem p);

// M classes: the ranges of M for which the dispatch makes one choice of config, so that the
// batch sizes of one layer share a few kernel sets (M is a run-time value in them, codegen.hpp)
// instead of compiling one each. Bounds (inclusive upper): 64 and 128, the two tile heights,
// below which train mode runs in one pass; 256; 1024; 2048 (where grid_sync stops fitting a
// 2048-wide layer on an H100 in one round); 4096; 16384; then everything larger. Each class spans
// at most a factor 4 of M, inside which the heuristic's time model (waves of tiles) ranks the
// configs alike, and each lies inside one schedule class (BM and 8 BM are class bounds), so a class
// needs at most one kernel set and M = 1..8192 at most seven.
struct MClass {
  std::int64_t lo = 1, hi = 1;  // inclusive
  // The M the heuristic ranks configs at: the class's largest (the top class: 65536).
  std::int64_t representative() const;
};
MClass m_class(std::int64_t M);
inline constexpr int kMaxMClassesUpTo8192 = 7;

// KernelConfig::grid_sync: the most CTAs of fj_gemm that are resident at once, each holding one
// tile: `ctas_per_sm` x `sm_count`, and for a persistent grid (at most one CTA per SM)
// `sm_count`. 0 for other configs. The plan passes the module's occupancy
// (PlanCore::resident_tiles), the time model its estimate of it.
unsigned resident_tiles(const KernelConfig&, int ctas_per_sm, int sm_count);

// The grid of a resident (grid_sync) run of `rows` rows of an N-column layer, 0 when it cannot
// run resident. Every tile fits at once: one CTA per tile, one round. Otherwise a persistent
// config takes the tiles in rounds of whole column panels, R column tiles x every row tile, R as
// many as fit `resident_tiles` (the last round holds what is left, and the CTAs past it arrive
// at its barrier without a tile). 0 when one column panel's row tiles do not fit.
unsigned resident_grid(const KernelConfig&, std::int64_t n, std::int64_t rows,
                       unsigned resident_tiles);

// BK-deep slices of p.K a mainloop walks (the last may be partial): what split-K divides.
std::int64_t k_tiles(const Problem& p, int bk);
// The BM x BN output tiles of p.M x p.N.
std::int64_t output_tiles(const Problem& p, const KernelConfig& c);

// Whose kernels a config is ranked for, and how. forward (fj_gemm): its split-K reduce runs one CTA
// per output tile (kernels/splitk_reduce.cuh, which also runs the BatchNorm epilogue). gradient
// (fj_bwd_dx, fj_bwd_dw): the split sum is elementwise over every SM (kernels/grad_split_sum.cuh);
// otherwise the forward's rules. gradient_one_wave: a gradient GEMM whose candidates all run in
// one wave, each CTA alone on its SM (grad_gemm_candidates decides); for 16-bit types on sm_90
// the tiles' rates and the split's cost there are the ones measured for the gradient kernels
// (lone_cta_flops_per_sm in kernel_config.cpp), elsewhere as `gradient`.
enum class GemmKind { forward, gradient, gradient_one_wave };

// A rough time model (waves x tile time + extra passes) that orders candidates until the
// autotuner measures them.
double estimated_us(const Problem&, const Device&, const KernelConfig&,
                    GemmKind kind = GemmKind::forward);

// The configs fusejit considers for a problem on a device (both variants where they apply),
// each valid_for it. The first is the built-in heuristic's choice.
std::vector<KernelConfig> candidate_configs(const Problem&, const Device&);
// The heuristic's choice, optionally restricted to one variant: the first of the candidates
// ranked at the M class's representative M that can run `p` itself. Throws InvalidArgument
// ("variant", ...) when that variant cannot run the problem on the device.
KernelConfig default_config(const Problem&, const Device&, std::optional<Variant> variant = {});

// Synchronized statistics (Problem::stat_ranks > 0) run a config chosen, or tuned, for the same
// problem unsynchronized (tune/dispatch.hpp) in the two-pass schedule around the exchange. A
// KernelConfig::recompute (and grid_sync) choice becomes the plain config it twins: those
// schedules finish the statistics inside one rank's kernels, and recompute's first GEMM stores
// no y for fj_apply to normalize. An exact_m choice becomes its dynamic twin: ranks run their
// own row counts (Plan::run's rows), which an exact-M kernel set refuses.
KernelConfig synchronized_stats_config(KernelConfig unsynchronized_choice);

}  // namespace fusejit
