#include "fusejit/plan/backward_core.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <set>

#include "common/backward_params.h"
#include "common/backward_shape.h"
#include "common/gemm_params.h"
#include "common/split_k.h"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fusejit {

namespace {

// The heuristic's first candidate the gradient GEMMs can run, warpspec before tiled.
KernelConfig gemm_config(const Problem& p, const Problem& g, bool dw, const Device& d) {
  if (std::vector<KernelConfig> c = grad_gemm_candidates(p, g, dw, d); !c.empty()) return c.front();
  KernelConfig c = default_config(g, d, Variant::tiled);
  c.split_k = 1;
  c.exact_m = false;
  return c;
}

std::shared_ptr<const BackwardCore> build_backward_core(const Problem& problem,
                                                        const BackwardConfig& config,
                                                        CUcontext context,
                                                        const std::string& cache_dir) {
  auto core = std::make_shared<BackwardCore>();
  core->problem = problem;
  core->config = config;
  core->context = context;
  FJ_CU(cuCtxSetCurrent(context));
  core->device = Device::current();
  const KernelSource src = generate_backward(problem, config);
  LoadedKernelSet loaded = load_kernel_set(src, core->device, cache_dir);
  core->module = std::move(loaded.module);
  core->cache_hit = loaded.cache_hit;
  core->compile_seconds = loaded.compile_seconds;
  const Module& m = *core->module;
  auto fn = [&](const char* name) {
    for (const auto& k : src.kernels)
      if (k == name) return m.function(k);
    return CUfunction{nullptr};
  };
  core->reduce = fn("fj_bwd_reduce");
  core->coef = fn("fj_bwd_coef");
  core->da = fn("fj_bwd_da");
  core->params = fn("fj_bwd_params");
  core->resident = fn("fj_bwd_resident");
  core->resident_shared = fn("fj_bwd_resident_shared");
  auto resident_blocks = [&](CUfunction f, int smem) {
    int per_sm = 0;
    if (f)
      FJ_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, fj::kBackwardThreads, smem));
    return per_sm * core->device.sm_count;
  };
  core->resident_blocks = resident_blocks(core->resident, 0);
  core->resident_shared_blocks =
      resident_blocks(core->resident_shared, fj::kBackwardResidentSharedBytes);
  core->dx = fn("fj_bwd_dx");
  core->dw = fn("fj_bwd_dw");
  core->dx_sum = fn("fj_bwd_dx_sum");
  core->dw_sum = fn("fj_bwd_dw_sum");
  core->transpose = fn("fj_bwd_transpose");
  core->strips = m.read_int("fj_bwd_strips");
  // The workspace (backward_workspace) is sized by the host's count of the same strips.
  if (const int host = backward_layer_strips(problem); core->strips != host)
    throw Error(fmt::format("{}: the kernels count {} strips of columns, the host {}", src.name,
                            core->strips, host));
  core->column_blocks = m.read_int("fj_bwd_column_blocks");
  auto dynamic_smem = [&](CUfunction f, const char* kernel, const char* symbol) {
    const int bytes = m.read_int(symbol);
    if (bytes > core->device.smem_per_block_optin)
      throw InvalidArgument(
          "config",
          fmt::format("{} needs {} bytes of shared memory in {}; {} allows {}", config.key(), bytes,
                      kernel, core->device.name, core->device.smem_per_block_optin));
    FJ_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
    return bytes;
  };
  if (core->dx) core->dx_smem_bytes = dynamic_smem(core->dx, "fj_bwd_dx", "fj_bwd_dx_smem_bytes");
  if (core->dw) core->dw_smem_bytes = dynamic_smem(core->dw, "fj_bwd_dw", "fj_bwd_dw_smem_bytes");
  core->kernel_names = src.kernels;
  log()->info("backward plan {} ({}, {:.3f} s compile)", src.name,
              core->cache_hit ? "cached" : "compiled", core->compile_seconds);
  return core;
}

// A warpspec gradient GEMM reads every operand from 16-byte aligned rows: da's padded ones, the
// copies' (grad_gemm_reads_copies) or, where it reads none, the layer's own, which are aligned.
// The layer's alignment bounds only C's stores, which grad_gemm_why_invalid checks. The GEMM as
// the forward's rules (KernelConfig::why_invalid, candidate_configs) should see it: rows padded
// to 16 bytes.
Problem as_wgmma_reads(const Problem& g) {
  Problem q = g;
  q.ldx = grad_row_elements(g.K, g.dtype);
  q.ldw = grad_row_elements(g.K, g.dtype);
  q.ldy = grad_row_elements(g.N, g.dtype);
  q.alignment = 0;
  return q;
}

}  // namespace

// Warpspec before tiled: on Hopper the tiled kernels reach about half of the tensor cores' rate
// (the forward's measurements). The tiled kernel reads tf32's MN-major operands with one 4-byte
// copy per element; while each copy's offset was computed on its own, four-warp tiles spilled
// (ptxas's report), so tf32 takes 256 threads (every warpspec config has them). Since the copies
// share one or two base offsets a thread (mainloop/element_passes.h), 128x128 with four warps
// spills nothing on sm_80-sm_120 but sm_90a (dW 28 bytes there); the rule stays until a GPU
// measures four-warp tiles against eight.
//
// Split-K: each unsplit candidate whose own grid fills at most half the SMs and whose reduction
// is long (at least 64 k tiles) also comes split in the most of 2, 4, ..., 32 that keeps the grid
// within one CTA per SM and at least 8 k tiles per split (a pipeline's fill and drain). Where
// even the smallest tiles fill at most half the SMs (dW of a narrow layer: N x K is a few tiles,
// its reduction the whole batch), the twins are ranked with the rest by the time model's
// one-wave rates and split cost (GemmKind::gradient_one_wave); elsewhere they come after their
// kernel's unsplit tiles, for the tuner. Measured on H200 (bf16 train, backward alone):
// 65536x256x64 0.306 -> 0.170 ms (dW 64x64 in 32 splits); but 1024x256x64 (16 k tiles) 0.0283
// unsplit against 0.0295 in 4 splits.
std::vector<KernelConfig> grad_gemm_candidates(const Problem& p, const Problem& g, bool dw,
                                               const Device& d) {
  // The forward's candidates for the GEMM's shape: a gradient GEMM's shared memory is the
  // forward's ring and TMA-store boxes without its epilogue's scratch, so each fits as it is.
  // Where the warpspec ones would read copies (tf32, or on Hopper 16-bit rows TMA cannot load),
  // they are offered as for the rows they read (as_wgmma_reads), then judged, like every
  // candidate, at the layer's alignment (grad_gemm_why_invalid); elsewhere for the GEMM's own
  // rows, which keeps the tiled candidates of those layers on other GPUs as they were.
  const bool copies =
      grad_gemm_dtype(p.dtype) == DType::tf32 || (d.cc() == 90 && grad_gemm_layer_reads_copies(p));
  std::vector<KernelConfig> candidates = candidate_configs(copies ? as_wgmma_reads(g) : g, d);
  // The forward's own split twins (add_split_k) follow the forward's rules, not these: dropped.
  std::erase_if(candidates, [](const KernelConfig& c) { return c.split_k != 1; });
  const std::int64_t sms = std::max(1, d.sm_count);
  std::int64_t widest = 0;  // the most tiles an unsplit candidate has
  for (const KernelConfig& c : candidates)
    if (grad_gemm_why_invalid(p, c, g, d).empty()) widest = std::max(widest, output_tiles(g, c));
  // One twin per unsplit candidate, its largest split: the tuner compiles and times every set,
  // and every split of every candidate made 80 sets instead of 25 at 65536x256x64.
  const std::size_t unsplit = candidates.size();
  for (std::size_t i = 0; i < unsplit; ++i) {
    const KernelConfig base = candidates[i];
    const std::int64_t tiles = output_tiles(g, base), kt = k_tiles(g, base.bk);
    if (base.tma_store || kt < 64) continue;
    int s = 1;
    while (2 * s <= KernelConfig::kMaxSplitK && tiles * 2 * s <= sms && kt >= 8 * 2 * s) s *= 2;
    if (s == 1) continue;
    KernelConfig c = base;
    c.split_k = s;
    candidates.push_back(c);
  }
  // Where even the widest unsplit grid fills at most half the SMs, every candidate (twins
  // included) is one wave of lone CTAs: ranked by the gradient kernels' measured rates there.
  // Elsewhere the twins (of large tiles whose grids leave most SMs idle) follow every unsplit
  // candidate of their kernel (the list below is warpspec's, then tiled's): the tuner times them,
  // the heuristic does not take them. At 4097x4095x129 bf16
  // train both GEMMs in 128x256 tiles and 4 splits made the backward 22% faster than the
  // heuristic's unsplit pair (14% at 16384 rows; H200), but at 2048x2048x512, where unsplit
  // 64x128 tiles fill the GPU, 128x256 tiles in 4 splits took 0.076 ms against 0.052. (Grids
  // are counted at g's rows, the M class's representative for dX: 4097x4095x129's dX in
  // 128x256 tiles is 128 CTAs there, so only its dW gets twins. `fusejit autotune --backward`
  // there picked dW's 128x256 twin in 4 splits beside dX in 128x64 tiles: 0.1227 ms against the
  // heuristic pair's 0.1504, H200.)
  const bool one_wave = 2 * widest <= sms;
  const GemmKind kind = one_wave ? GemmKind::gradient_one_wave : GemmKind::gradient;
  const auto faster = [&](const KernelConfig& a, const KernelConfig& b) {
    return estimated_us(g, d, a, kind) < estimated_us(g, d, b, kind);
  };
  if (one_wave) {
    std::stable_sort(candidates.begin(), candidates.end(), faster);
  } else {
    const auto twins = candidates.begin() + static_cast<std::ptrdiff_t>(unsplit);
    std::stable_sort(candidates.begin(), twins, faster);
    std::stable_sort(twins, candidates.end(), faster);
  }
  // dX whose W and C are copied 4 bytes at a time (grad_gemm_vec_bytes; da's rows are 16-byte
  // aligned), on the tiled kernel with a 64x64 warp tile: ptxas spills in fj_bwd_dx (sm_90a;
  // `fusejit compile` reports it), and the time model cannot see registers. Backward alone, bf16
  // train, H200, `fusejit bench --backward`, one call: 777x1536x2050 (da copied 16 bytes at a
  // time, W 4): 128x256 (16 B spilled) 0.093 ms, 128x128 (92 B) 0.102, 64x128 0.082, 128x64
  // 0.076; 777x1502x2048 (everything 4 bytes while da was packed: N = 1502): 128x128 (16 B)
  // 0.128, 64x128 0.119, 128x256 (4 B) 0.109. These tiles go last; the tuner still times them.
  // (With 2-byte copies they do not spill; 16-bit dW's do not.) On Hopper such 16-bit layers
  // now run warpspec first (grad_gemm_reads_copies); this order is the tiled fallback's.
  const GradGemmVecBytes vec = grad_gemm_vec_bytes(p);
  if (!dw && vec.layer == 4)
    std::stable_partition(candidates.begin(), candidates.end(), [](const KernelConfig& c) {
      return !(c.variant == Variant::tiled && c.bm / c.warps_m == 64 && c.bn / c.warps_n == 64);
    });
  std::vector<KernelConfig> out;
  std::set<std::string> seen;
  for (const Variant v : {Variant::warpspec, Variant::tiled})
    for (const KernelConfig& c : candidates)
      if (c.variant == v && (g.dtype != DType::tf32 || c.threads() >= 256) &&
          grad_gemm_why_invalid(p, c, g, d).empty() && seen.insert(c.key()).second)
        out.push_back(c);
  return out;
}

void validate_backward_problem(const Problem& problem) {
  problem.validate();
  // The batch-statistic gradients of synchronized ranks (sum dy, sum dy zh) are global sums:
  // without their exchange the gradients would be silently those of this rank's rows.
  if (problem.stat_ranks > 0)
    throw InvalidArgument("stat_ranks",
                          "the backward pass of synchronized statistics is not implemented "
                          "(its column sums would need an all-reduce); expected 0");
  if (problem.mode == Mode::train && problem.M < 2)
    throw InvalidArgument("M", "train mode needs at least two rows for a variance");
}

std::string backward_refusal(const Problem& problem) {
  try {
    validate_backward_problem(problem);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

std::string grad_gemm_why_invalid(const Problem& p, const KernelConfig& c, const Problem& gemm,
                                  const Device& d) {
  if (c.split_k < 1 || c.split_k > KernelConfig::kMaxSplitK)
    return fmt::format("split_k must lie within 1..{}; got {}", KernelConfig::kMaxSplitK,
                       c.split_k);
  if (c.split_k > 1 && c.tma_store)
    return "a split gradient GEMM stores fp32 slices with thread stores: no tma_store";
  if (c.exact_m) return "the gradient GEMMs read M at run time";
  if (c.pad_operands) return "the gradient GEMMs do not pad their operands";
  if (c.variant == Variant::warpspec) {
    if (storage_bytes(p.dtype) != 2 && grad_gemm_dtype(p.dtype) != DType::tf32)
      return "the warpspec gradient GEMMs multiply bf16, fp16 (MN-major operands through "
             "wgmma's transpose) or tf32 (K-major copies); strict fp32 has no wgmma";
    if (c.cluster_m != 1 || c.pingpong)
      return "the warpspec gradient GEMMs have no clusters or pingpong";
    if (c.bm > 256 || c.bn > 256) return "the warpspec gradient GEMMs' TMA boxes have <= 256 rows";
    if (c.tma_store && p.effective_alignment() < 16)
      return "TMA stores need 16-byte aligned rows of dx and dW";
    if (const int bytes = grad_wgmma_smem_bytes(c, grad_gemm_dtype(p.dtype));
        bytes > d.smem_per_block_optin)
      return fmt::format("the warpspec gradient GEMM needs {} bytes of shared memory; {} allows {}",
                         bytes, d.name, d.smem_per_block_optin);
  }
  // The forward's rules for the rest. Its split-K checks do not apply: warpspec splits here,
  // and a run's reduction (dW's batch) may have fewer k tiles than splits (those store zeros).
  KernelConfig unsplit = c;
  unsplit.split_k = 1;
  return unsplit.why_invalid(c.variant == Variant::warpspec ? as_wgmma_reads(gemm) : gemm, d);
}

void require_grad_gemm_config(const Problem& p, const KernelConfig& c, bool dw, const Device& d,
                              const char* arg) {
  const BackwardGemms g = backward_gemms(p);
  if (const std::string why = grad_gemm_why_invalid(p, c, dw ? g.dw : g.dx, d); !why.empty())
    throw InvalidArgument(arg, c.key() + ": " + why);
}

BackwardGemms backward_gemms(const Problem& p) {
  // dx's rows and dW's reduction are M: rank the tiles at the M class's representative, as the
  // forward's dispatch does (config/candidates.hpp), so every M of a class shares the kernel set.
  const std::int64_t m = m_class(p.M).representative();
  BackwardGemms g{dx_gemm_problem(p), dw_gemm_problem(p)};
  g.dx.M = m;
  g.dw.K = m;
  return g;
}

std::string backward_config_why_invalid(const Problem& p, const BackwardConfig& c,
                                        const Device& d) {
  const BackwardGemms g = backward_gemms(p);
  std::string why = c.dx_cublaslt ? "" : grad_gemm_why_invalid(p, c.dx, g.dx, d);
  if (why.empty() && !c.dw_cublaslt) why = grad_gemm_why_invalid(p, c.dw, g.dw, d);
  return why;
}

BackwardConfig default_backward_tiles(const Problem& p, const Device& d) {
  const BackwardGemms g = backward_gemms(p);
  return {gemm_config(p, g.dx, false, d), gemm_config(p, g.dw, true, d)};
}

namespace {

// The reductions from which a 16-bit gradient GEMM that the heuristic runs as one wave of
// single-consumer tiles runs on cuBLASLt instead (lt_beats_tiles).
constexpr std::int64_t kLtOneWaveReduction = 4096;
// Two-consumer grids that use at most this share of their waves' SM slots (tiles <= share x
// waves x SMs), over reductions of at least kLtPartialWaveReduction (lt_beats_tiles).
constexpr std::int64_t kLtPartialWavePercent = 62;
constexpr std::int64_t kLtPartialWaveReduction = 768;
// Split dWs of at least this many output columns (lt_beats_tiles).
constexpr std::int64_t kLtSplitDwColumns = 128;

// Whether gradient GEMM `g` (output g.M x g.N, reduction g.K, at the M class's representative M:
// backward_gemms), which the heuristic would run as warpspec tiles `c`, is better left to
// cuBLASLt. Only 16-bit GEMMs of 16-byte aligned rows, in three cases measured on H200 (`fusejit
// bench --backward`, bf16 train, two interleaved rounds per call, docs/performance.md "Gradient
// GEMMs on cuBLASLt where one wave of single-consumer tiles runs a long reduction" and "Gradient
// GEMMs on cuBLASLt: partial waves and split dWs"):
// - one wave (90-100% of the SMs) of single-consumer tiles (the ranking's 64x128 pick for an
//   output of ~1M elements) over a reduction of at least kLtOneWaveReduction: one consumer
//   warpgroup per SM multiplies at a lower rate than cuBLASLt's kernels; the backward took 3-6%
//   less time at every such layer but one (a tie). Over 2048 or fewer it tied or lost.
// - a split dW (split-K slices and their sum kernel) of at least kLtSplitDwColumns columns:
//   cuBLASLt's took 4.8-10% less at six layers (16384x1024x256, 16384x512x256, 32768x1024x256,
//   8192x1024x256, 16384x768x256, 32768x512x128) and tied at 8192x512x128.
// - two-consumer tiles that use at most kLtPartialWavePercent of their waves' SM slots (tiles /
//   (waves x SMs): idle SMs in a partial wave) over a reduction of at least
//   kLtPartialWaveReduction: 1.4-12.5% less at every such GEMM measured (twelve, at the run's M:
//   the dX of 384x2048x2048, 512x2048x2048, 8192x2048x256, 8192x1024x256 and 2560x2048x2048, the
//   dW of 1024x1536x1536, both of 768x1536x1536, 1280x1536x1536 and 1536^3). Grids using 73%
//   tied (-3% to +1%), 97% lost up to 6.7% (one won 4%), and the half-wave dX of 8192x512x128
//   (a reduction of 512) lost 4%.
// Where both GEMMs qualify, both (4096x4096x256: 2.3% less than the tiles, though dW alone took
// 3.3% less; at 1536^3, where the run's M qualifies both but its class's does not, the pair took
// 14% less and either alone 7%).
bool lt_beats_tiles(const Problem& p, const Problem& g, const KernelConfig& c, bool is_dw,
                    const Device& d) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16) return false;
  if (p.effective_alignment() < 16 || c.variant != Variant::warpspec) return false;
  const std::int64_t tiles = output_tiles(g, c), sms = d.sm_count;
  if (c.split_k > 1) return is_dw && g.N >= kLtSplitDwColumns;
  if (c.warps_m == 1) return g.K >= kLtOneWaveReduction && tiles <= sms && 10 * tiles >= 9 * sms;
  if (c.warps_m != 2) return false;
  const std::int64_t waves = (tiles + sms - 1) / sms;
  return g.K >= kLtPartialWaveReduction && 100 * tiles <= kLtPartialWavePercent * waves * sms;
}

}  // namespace

BackwardConfig plan_backward_config(const Problem& p, const BackwardConfig& c, const Device& d) {
  BackwardConfig out = c;
  if (!c.dx_cublaslt && lt_beats_tiles(p, dx_gemm_problem(p), c.dx, false, d))
    out.dx = {}, out.dx_cublaslt = true;
  return out;
}

std::shared_ptr<const BackwardCore> with_dx_on_cublaslt(const BackwardCore& core,
                                                        const BackwardConfig& moved) {
  auto out = std::make_shared<BackwardCore>(core);
  out->config = moved;
  out->kernel_names = backward_kernel_set(core.problem, moved);
  // The rule moves only unsplit dXs of 16-byte aligned 16-bit rows, which read no copies: the
  // set's transpose kernel, if any, is dW's.
  out->dx = out->dx_sum = nullptr;
  out->dx_smem_bytes = 0;
  return out;
}

BackwardConfig default_backward_config(const Problem& p, const Device& d) {
  // Strict fp32 GEMMs (fp32, and tf32x3's: grad_gemm_dtype) have no tensor cores to fuse into,
  // and the backward on cuBLASLt's SGEMM took 0.28-0.87x its time on the FFMA tiles on every
  // layer measured (H200, `fusejit bench --backward`, docs/performance.md "Strict fp32 gradient
  // GEMMs on cuBLASLt").
  if (grad_gemm_dtype(p.dtype) == DType::fp32) {
    BackwardConfig c;
    c.dx_cublaslt = c.dw_cublaslt = true;
    return c;
  }
  BackwardConfig c = default_backward_tiles(p, d);
  const BackwardGemms g = backward_gemms(p);
  if (lt_beats_tiles(p, g.dx, c.dx, false, d)) c.dx = {}, c.dx_cublaslt = true;
  if (lt_beats_tiles(p, g.dw, c.dw, true, d)) c.dw = {}, c.dw_cublaslt = true;
  return c;
}

std::optional<BackwardConfig> lt_declined_fallback(const BackwardConfig& c,
                                                   const BackwardConfig& tiles, bool forced_dx,
                                                   bool forced_dw) {
  BackwardConfig out = c;
  if (c.dx_cublaslt && !forced_dx) out.dx = tiles.dx, out.dx_cublaslt = false;
  if (c.dw_cublaslt && !forced_dw) out.dw = tiles.dw, out.dw_cublaslt = false;
  if (out.key() == c.key()) return std::nullopt;
  return out;
}

BackwardLt make_backward_lt(const Problem& p, const BackwardConfig& c) {
  BackwardLt lt;
  if (!c.dx_cublaslt && !c.dw_cublaslt) return lt;
  lt.handle = make_lt_handle();
  // Row-major, as the layer's tensors are; cuBLASLt's column-major view of a row-major [r][ld]
  // matrix is its transpose (blas/lt_gemm.hpp). dx [rows][K] = da [rows][N] W [N][K] is, column-
  // major, dx^T (K x rows) = W^T (K x N, ld ldw) da^T (N x rows, ld_da); dW [N][K] = da^T x is
  // dW^T (K x N) = x^T (K x rows, ld ldx) (da^T)^T, da^T stored N x rows.
  LtGemmSpec base;
  base.ab_type = base.d_type = lt_type(p.dtype);
  base.compute = lt_compute(grad_gemm_dtype(p.dtype));
  base.ab_alignment = base.d_alignment = static_cast<unsigned>(p.effective_alignment());
  const std::int64_t ld_da = grad_da_row_elements(p), least = p.mode == Mode::train ? 2 : 1;
  if (c.dx_cublaslt) {
    LtGemmSpec s = base;
    s.m = p.K, s.n = p.M, s.k = p.N;
    s.lda = p.lda_w(), s.ldb = ld_da, s.ldd = p.lda_x();
    lt.dx = LtGemm::require_for_rows(lt.handle.get(), s, true, least);
    lt.workspace = std::max(lt.workspace, lt.dx->workspace());
  }
  if (c.dw_cublaslt) {
    LtGemmSpec s = base;
    s.m = p.K, s.n = p.N, s.k = p.M;
    s.trans_b = true;
    s.lda = p.lda_x(), s.ldb = ld_da, s.ldd = p.lda_w();
    lt.dw = LtGemm::require_for_rows(lt.handle.get(), s, false, least);
    lt.workspace = std::max(lt.workspace, lt.dw->workspace());
  }
  return lt;
}

std::shared_ptr<const BackwardCore> backward_core(const Problem& problem,
                                                  const BackwardConfig& config, CUcontext context,
                                                  const std::string& cache_dir, bool* built) {
  static SingleFlight<std::shared_ptr<const BackwardCore>> cores(
      SingleFlight<std::shared_ptr<const BackwardCore>>::Keep::values);
  static std::atomic<std::size_t> capacity{0};
  if (const std::size_t want = Module::max_loaded(); capacity.exchange(want) != want)
    cores.set_capacity(want);
  Problem keyed = problem;
  keyed.M = 1;  // every M of a layer shares one kernel set
  const std::string key = fmt::format("{}|{}|{}|{}", keyed.key(), config.key(),
                                      static_cast<const void*>(context), cache_dir);
  return cores.get(
      key, [&] { return build_backward_core(problem, config, context, cache_dir); }, built);
}

int backward_layer_strips(const Problem& p) {
  return fj::backward_strips(static_cast<int>(p.N), std::min(p.effective_alignment(), 16),
                             static_cast<int>(storage_bytes(p.dtype)));
}

BackwardWorkspace backward_workspace(const Problem& p, const BackwardConfig& c, std::int64_t rows,
                                     std::size_t lt_bytes) {
  BackwardWorkspace w;
  // Every region starts kWorkspaceAlign-aligned in a kWorkspaceAlign-aligned workspace.
  static_assert(kWorkspaceAlign % 16 == 0,
                "grad_gemm_vec_bytes copies da's rows as wide as N allows, up to 16 bytes");
  auto region = [&w](std::size_t bytes, std::size_t& offset) {
    offset = w.total;
    w.total = align_workspace(w.total + bytes);
  };
  const int strips = backward_layer_strips(p);
  const auto slabs = static_cast<std::size_t>(fj::backward_slab_bound(rows, strips));
  const auto n = static_cast<std::size_t>(p.N);
  // First, so that it lies where it did for the plan's rows whatever a run's rows.
  region(c.dx_cublaslt || c.dw_cublaslt ? lt_bytes : 0, w.lt_offset);
  region(slabs * n * 8, w.dy_partials_offset);
  region(p.mode == Mode::eval ? slabs * n * 8 : 0, w.dz_partials_offset);
  region(p.mode == Mode::train ? n * 16 : 0, w.coef_offset);
  region(p.mode == Mode::train ? static_cast<std::size_t>(strips) * 4 : 0, w.strip_ready_offset);
  region(static_cast<std::size_t>(rows) * static_cast<std::size_t>(grad_da_row_elements(p)) *
             storage_bytes(p.dtype),
         w.da_offset);
  // Split slices: dX's are [S][rows][ld(K)], dW's [S][N][ld(K)], fp32.
  const auto slice_ld = static_cast<std::size_t>(fj::split_slice_ld(static_cast<int>(p.K)));
  auto slices = [&](const KernelConfig& k, std::int64_t out_rows) -> std::size_t {
    return k.split_k > 1 ? static_cast<std::size_t>(k.split_k) *
                               static_cast<std::size_t>(out_rows) * slice_ld * 4
                         : 0;
  };
  region(c.dx_cublaslt ? 0 : slices(c.dx, rows), w.dx_slices_offset);
  region(c.dw_cublaslt ? 0 : slices(c.dw, p.N), w.dw_slices_offset);
  w.copy_ld_n = grad_row_elements(p.N, p.dtype);
  w.copy_ld_rows = grad_row_elements(rows, p.dtype);
  const std::size_t es = storage_bytes(p.dtype);
  auto elements = [](std::int64_t r, std::int64_t ld_elements) {
    return static_cast<std::size_t>(r) * static_cast<std::size_t>(ld_elements);
  };
  if (!c.dx_cublaslt && grad_gemm_reads_copies(p, c.dx))
    region(elements(p.K, w.copy_ld_n) * es, w.w_t_offset);
  if (!c.dw_cublaslt && grad_gemm_reads_da_copy(p, c.dw))
    region(elements(p.N, w.copy_ld_rows) * es, w.da_t_offset);
  if (!c.dw_cublaslt && grad_gemm_reads_copies(p, c.dw))
    region(elements(p.K, w.copy_ld_rows) * es, w.x_t_offset);
  return w;
}

void validate_backward_tensors(const Problem& p, const BackwardTensors& t, std::int64_t rows,
                               const void* workspace, std::size_t workspace_bytes) {
  const auto al = static_cast<std::size_t>(p.effective_alignment());
  const std::size_t pe = storage_bytes(p.param_dtype);
  const char* dt = name(p.dtype).data();
  require_pointer(t.dy, "dy", al, [&] {
    return fmt::format("dy is [{}][{}] {}, laid out like y", p.M, p.lda_y(), dt);
  });
  require_pointer(t.saved, "saved", al, [&] {
    return fmt::format("the forward's `saved` output, [{}][{}] {}", p.M, p.lda_y(), dt);
  });
  if (t.dx) {
    require_pointer(t.dx, "dx", al,
                    [&] { return fmt::format("dx is [{}][{}] {}", p.M, p.lda_x(), dt); });
    require_pointer(t.w, "w", al,
                    [&] { return fmt::format("dx needs W, [{}][{}] {}", p.N, p.lda_w(), dt); });
  }
  if (t.dw) {
    require_pointer(t.dw, "dw", al,
                    [&] { return fmt::format("dw is [{}][{}] {}", p.N, p.lda_w(), dt); });
    require_pointer(t.x, "x", al,
                    [&] { return fmt::format("dw needs x, [{}][{}] {}", p.M, p.lda_x(), dt); });
  }
  require_param(p, t.scale, p.has_scale, "scale", "has_scale");
  require_param(p, t.gamma, p.has_affine, "gamma", "has_affine");
  auto grad = [&](const void* ptr, bool present, const char* arg, const char* flag) {
    if (!ptr) return;
    if (!present) forbid(ptr, arg, fmt::format("the problem has {} = false", flag).c_str());
    require_pointer(ptr, arg, pe, [&] { return fmt::format("[{}] {}", p.N, name(p.param_dtype)); });
  };
  grad(t.dbias, p.has_bias, "dbias", "has_bias");
  grad(t.dscale, p.has_scale, "dscale", "has_scale");
  grad(t.dgamma, p.has_affine, "dgamma", "has_affine");
  grad(t.dbeta, p.has_affine, "dbeta", "has_affine");
  if (p.mode == Mode::eval) {
    require_pointer(t.running_mean, "running_mean", pe, "eval backward reads the running stats");
    require_pointer(t.running_var, "running_var", pe, "eval backward reads the running stats");
    forbid(t.save_mean, "save_mean", "eval mode has no batch statistics");
    forbid(t.save_invstd, "save_invstd", "eval mode has no batch statistics");
  } else {
    require_pointer(t.save_mean, "save_mean", 4,
                    "train backward needs the forward's save_mean, [N] fp32");
    require_pointer(t.save_invstd, "save_invstd", 4,
                    "train backward needs the forward's save_invstd, [N] fp32");
    forbid(t.running_mean, "running_mean", "train backward uses the batch statistics (save_*)");
    forbid(t.running_var, "running_var", "train backward uses the batch statistics (save_*)");
  }
  // dX's GEMM reads W and dW's reads x while either may write its output (dW beside a tiled dX,
  // after a cuBLASLt dX, before a tiled dX when dW is on cuBLASLt; the check ignores the order):
  // an output whose address range meets that of an operand a GEMM of the run reads, or the other
  // output's, would be read or left half written. Ranges, not bytes: interleaved tensors of one
  // ld (column halves of one buffer) are refused too. (dy and saved may be overwritten: only the
  // BatchNorm passes read them, and both GEMMs start after those end.)
  const std::int64_t m = rows > 0 ? rows : p.M;
  const std::size_t es = storage_bytes(p.dtype);
  const std::size_t x_span = tensor_span(m, p.lda_x(), p.K, es),
                    w_span = tensor_span(p.N, p.lda_w(), p.K, es);
  const char* why = "the gradient GEMMs read x (for dw), W (for dx) and da while they write";
  if (t.dx) {
    require_disjoint(t.dx, x_span, "dx", t.w, w_span, "w", why);
    require_disjoint(t.dx, x_span, "dx", workspace, workspace_bytes, "workspace", why);
    if (t.dw) require_disjoint(t.dx, x_span, "dx", t.x, x_span, "x", why);
  }
  if (t.dw) {
    require_disjoint(t.dw, w_span, "dw", t.x, x_span, "x", why);
    require_disjoint(t.dw, w_span, "dw", workspace, workspace_bytes, "workspace", why);
    if (t.dx) {
      require_disjoint(t.dw, w_span, "dw", t.w, w_span, "w", why);
      require_disjoint(t.dw, w_span, "dw", t.dx, x_span, "dx", "both are outputs");
    }
  }
  // The workspace is written during the run (column partials, da, copies of x and W) while the
  // passes read dy and saved and the GEMMs x and W.
  const std::size_t y_span = tensor_span(m, p.lda_y(), p.N, es);
  const char* ws = "the run writes its workspace while it reads dy, saved, x and W";
  require_disjoint(t.dy, y_span, "dy", workspace, workspace_bytes, "workspace", ws);
  require_disjoint(t.saved, y_span, "saved", workspace, workspace_bytes, "workspace", ws);
  if (t.dw) require_disjoint(t.x, x_span, "x", workspace, workspace_bytes, "workspace", ws);
  if (t.dx) require_disjoint(t.w, w_span, "w", workspace, workspace_bytes, "workspace", ws);
}

namespace {

// The warpspec gradient GEMMs' operand maps (kernels/grad_wgmma.cuh): a K-major operand in
// boxes of its tile rows x 128 bytes, an MN-major one in boxes of bk reduction rows x 128 bytes.
// dX = dA W: dA K-major [rows][grad_da_row_elements], W MN-major [N][K]; dW = dA^T x: dA
// MN-major, x MN-major [rows][K]. Where the GEMM reads copies (grad_gemm_reads_copies), W and x
// are K-major copies instead (W^T [K][N], x^T [K][rows] in the workspace), and for tf32 dA too
// (dA^T [N][rows]: grad_gemm_reads_da_copy). With tma_store, C (dX [rows][K], dW [N][K]) in the
// per-warp boxes of the forward's y (encode_tma_store_map). Zeros for a tiled GEMM or one the run
// skips.
struct GradGemmMaps {
  CUtensorMap dx_a{}, dx_b{}, dx_c{}, dw_a{}, dw_b{}, dw_c{};
};

GradGemmMaps encode_grad_gemm_maps(const BackwardCore& c, std::int64_t rows, char* ws,
                                   const BackwardWorkspace& w, const BackwardTensors& t) {
  const Problem& p = c.problem;
  const int atom = static_cast<int>(128 / storage_bytes(p.dtype));
  const void* da = ws + w.da_offset;
  const std::int64_t ld_da = grad_da_row_elements(p);
  GradGemmMaps m;
  if (t.dx && !c.config.dx_cublaslt && c.config.dx.variant == Variant::warpspec) {
    const KernelConfig& k = c.config.dx;
    m.dx_a = encode_tma_tile_map(p.dtype, da, rows, p.N, ld_da, k.bm, atom, "workspace");
    m.dx_b = grad_gemm_reads_copies(p, k)
                 ? encode_tma_tile_map(p.dtype, ws + w.w_t_offset, p.K, p.N, w.copy_ld_n, k.bn,
                                       atom, "workspace")
                 : encode_tma_tile_map(p.dtype, t.w, p.N, p.K, p.lda_w(), k.bk, atom, "w");
    if (k.tma_store) m.dx_c = encode_tma_store_map(p.dtype, t.dx, rows, p.K, p.lda_x(), "dx");
  }
  if (t.dw && !c.config.dw_cublaslt && c.config.dw.variant == Variant::warpspec) {
    const KernelConfig& k = c.config.dw;
    m.dw_a = grad_gemm_reads_da_copy(p, k)
                 ? encode_tma_tile_map(p.dtype, ws + w.da_t_offset, p.N, rows, w.copy_ld_rows, k.bm,
                                       atom, "workspace")
                 : encode_tma_tile_map(p.dtype, da, rows, p.N, ld_da, k.bk, atom, "workspace");
    m.dw_b = grad_gemm_reads_copies(p, k)
                 ? encode_tma_tile_map(p.dtype, ws + w.x_t_offset, p.K, rows, w.copy_ld_rows, k.bn,
                                       atom, "workspace")
                 : encode_tma_tile_map(p.dtype, t.x, rows, p.K, p.lda_x(), k.bk, atom, "x");
    if (k.tma_store) m.dw_c = encode_tma_store_map(p.dtype, t.dw, p.N, p.K, p.lda_w(), "dw");
  }
  return m;
}

GradGemmMaps grad_gemm_maps(const BackwardCore& c, std::int64_t rows, char* ws,
                            const BackwardWorkspace& bw, const BackwardTensors& t,
                            BackwardRunCache* cache) {
  if ((c.config.dx_cublaslt || c.config.dx.variant != Variant::warpspec) &&
      (c.config.dw_cublaslt || c.config.dw.variant != Variant::warpspec))
    return {};
  const void* w = t.dx ? t.w : nullptr;
  const void* x = t.dw ? t.x : nullptr;
  const void* dx = t.dx;
  const void* dw = t.dw;
  const CacheClaim claim(cache ? &cache->busy : nullptr);
  if (!claim) return encode_grad_gemm_maps(c, rows, ws, bw, t);
  if (!cache->valid || cache->workspace != ws || cache->w != w || cache->x != x ||
      cache->dx != dx || cache->dw != dw || cache->rows != rows) {
    cache->valid = false;  // stays so if encoding throws
    const GradGemmMaps fresh = encode_grad_gemm_maps(c, rows, ws, bw, t);
    cache->dx_a = fresh.dx_a, cache->dx_b = fresh.dx_b, cache->dx_c = fresh.dx_c;
    cache->dw_a = fresh.dw_a, cache->dw_b = fresh.dw_b, cache->dw_c = fresh.dw_c;
    cache->workspace = ws, cache->w = w, cache->x = x, cache->dx = dx, cache->dw = dw;
    cache->rows = rows;
    cache->valid = true;
  }
  return {cache->dx_a, cache->dx_b, cache->dx_c, cache->dw_a, cache->dw_b, cache->dw_c};
}

std::atomic<std::uint64_t> resident_launches{0}, resident_refusals{0}, resident_shared_launches{0};

// fj_bwd_resident as a cooperative launch (its grid barriers need every block resident), and on
// sm_90+ also a programmatic dependent one, like the passes it replaces: the kernel joins the
// chain before it touches memory, and its blocks are all resident once the grid before it
// drains, which never waits for them. False where the driver refuses the grid as too large.
bool launch_resident_passes(const BackwardCore& c, int units, int slab_rows, CUstream stream,
                            void** args) {
  // At most the blocks the device holds at once. fj_bwd_resident, unless its blocks would read
  // their units again where fj_bwd_resident_shared's could hold the first of theirs
  // (fj::backward_first_rows_in_shared; the kernels decide by the same rules).
  CUfunction f = c.resident;
  int grid = std::min(units, c.resident_blocks);
  unsigned smem = 0;
  // Only where the device holds as many of its blocks as of fj_bwd_resident's (sm_90: four of
  // either an SM; sm_80 three of it against four, sm_86 and sm_89 two): a smaller grid there is
  // not measured. Then units > shared_grid >= grid: fj_bwd_resident's blocks would not have held
  // their rows in registers.
  const int shared_grid = std::min(units, c.resident_shared_blocks);
  if (c.resident_shared_blocks >= c.resident_blocks &&
      fj::backward_first_rows_in_shared(slab_rows, units, shared_grid))
    f = c.resident_shared, grid = shared_grid, smem = fj::kBackwardResidentSharedBytes;
  const CUresult r = launch_cooperative_grid(c.device, f, static_cast<unsigned>(grid),
                                             fj::kBackwardThreads, smem, stream, args, true);
  if (r == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) {
    resident_refusals.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  check(r, f == c.resident ? "cuLaunchKernelEx(fj_bwd_resident, cooperative)"
                           : "cuLaunchKernelEx(fj_bwd_resident_shared, cooperative)");
  resident_launches.fetch_add(1, std::memory_order_relaxed);
  if (f != c.resident) resident_shared_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

ResidentGridCounts resident_grid_counts() {
  return {resident_launches.load(std::memory_order_relaxed),
          resident_refusals.load(std::memory_order_relaxed),
          resident_shared_launches.load(std::memory_order_relaxed)};
}

void launch_backward(const BackwardCore& c, std::int64_t rows, bool accumulate, CUstream stream,
                     const BackwardTensors& t, void* workspace, BackwardRunCache* cache,
                     const BackwardLt* lt) {
  const bool dx_lt = c.config.dx_cublaslt && t.dx, dw_lt = c.config.dw_cublaslt && t.dw;
  if ((dx_lt && !(lt && lt->dx)) || (dw_lt && !(lt && lt->dw)))
    throw InvalidArgument("config", fmt::format("{} runs a gradient GEMM on cuBLASLt, and the "
                                                "run was given no cuBLASLt GEMMs "
                                                "(make_backward_lt) for it",
                                                c.config.key()));
  // The launches go to the plan's context; the caller's current one is back when run returns.
  const ScopedContext in_plan(c.context, ScopedContext::Checked{});
  if (!cache || cache->checked_stream.load(std::memory_order_relaxed) != stream) {
    validate_stream(c.context, stream);
    if (cache) cache->checked_stream.store(stream, std::memory_order_relaxed);
  }
  const Problem& p = c.problem;
  const fj::BackwardSlabs slabs = fj::backward_slabs(rows, c.strips);
  const BackwardWorkspace w = backward_workspace(p, c.config, rows, lt ? lt->workspace : 0);
  auto* ws = static_cast<char*>(workspace);
  const bool need_da = t.dx || t.dw;
  fj::BackwardParams bp{};
  bp.dy = t.dy;
  bp.saved = t.saved;
  bp.scale = t.scale;
  bp.gamma = t.gamma;
  bp.running_mean = t.running_mean;
  bp.running_var = t.running_var;
  bp.save_mean = t.save_mean;
  bp.save_invstd = t.save_invstd;
  bp.dbias = t.dbias;
  bp.dscale = t.dscale;
  bp.dgamma = t.dgamma;
  bp.dbeta = t.dbeta;
  bp.ws_dy_partials = reinterpret_cast<float*>(ws + w.dy_partials_offset);
  bp.ws_dz_partials =
      p.mode == Mode::eval ? reinterpret_cast<float*>(ws + w.dz_partials_offset) : nullptr;
  bp.ws_coef = p.mode == Mode::train ? reinterpret_cast<float*>(ws + w.coef_offset) : nullptr;
  bp.ws_strip_ready =
      p.mode == Mode::train ? reinterpret_cast<unsigned*>(ws + w.strip_ready_offset) : nullptr;
  bp.ws_da = need_da ? ws + w.da_offset : nullptr;
  bp.m = static_cast<int>(rows);
  bp.slabs = slabs.count;
  bp.slab_rows = slabs.rows;
  bp.eps = static_cast<float>(p.eps);
  bp.accumulate = accumulate ? 1 : 0;
  void* bargs[] = {&bp};
  const auto elementwise_grid =
      static_cast<unsigned>(c.strips) * static_cast<unsigned>(slabs.count);
  const auto columns_grid = static_cast<unsigned>(c.column_blocks);
  // Every kernel goes out as a programmatic dependent launch on sm_90+ and joins the chain in the
  // kernel before it reads or writes anything (templates/common/grid_dependency.cuh): a launch
  // and the first wave of each pass then overlap the end of the one before. The first kernel
  // too: whatever the stream ran last (which may have written dy) has completed and its writes
  // are visible when its wait returns, as after an ordinary launch.
  auto go = [&](CUfunction f, unsigned grid, unsigned threads, unsigned smem, void** args,
                const char* what, unsigned grid_y = 1) {
    launch_dependent(c.device, f, grid, grid_y, threads, smem, stream, args, what);
  };
  // The GEMMs' tensor maps before any launch: a map the driver refuses throws with nothing
  // enqueued (not after the passes have added to accumulated parameter gradients).
  const GradGemmMaps maps = grad_gemm_maps(c, rows, ws, w, t, cache);
  // cuBLASLt's algorithms were checked at a few row counts when the plan was made
  // (make_backward_lt); any other count is checked here, once per count, also before anything is
  // enqueued: a count cuBLASLt refuses throws with the gradients untouched (accumulated ones
  // included), not after the passes.
  // plan_m: the GEMM's own (the plan's M; the core's problem is the first plan's of its set).
  auto require_rows = [&](const LtGemm& g, std::int64_t plan_m, const char* gemm,
                          const char* tiles) {
    if (!g.runs_rows(lt->handle.get(), rows, lt->workspace))
      throw CudaError(fmt::format("cuBLASLt's algorithm for this plan's {} GEMM does not run {} "
                                  "rows (a run of fewer rows than the plan's M = {}); nothing "
                                  "was enqueued. A BackwardPlan made for M = {}, or {} on tiles, "
                                  "runs it",
                                  gemm, rows, plan_m, rows, tiles),
                      CUBLAS_STATUS_NOT_SUPPORTED);
  };
  // make_backward_lt: dX's rows are its n, dW's its reduction k.
  if (dx_lt) require_rows(*lt->dx, lt->dx->spec().n, "dX", "dx_config");
  if (dw_lt) require_rows(*lt->dw, lt->dw->spec().k, "dW", "dw_config");
  // Train's three passes as one cooperative grid of at most what the device holds at once
  // (kernels/bn_backward.cuh, bn_backward_resident): one launch, and where every slab of a strip
  // has a block and its rows fit in registers, dy and saved read once. Bit for bit the
  // three passes' results, which a refused launch (a device shared or partitioned in ways the
  // occupancy query does not see) falls back to. Without da to form, the reduce and coefficients
  // passes alone read dy and saved once already.
  const bool resident =
      p.mode == Mode::train && need_da && c.resident_blocks > 0 &&
      launch_resident_passes(c, static_cast<int>(elementwise_grid), slabs.rows, stream, bargs);
  if (!resident) {
    go(c.reduce, elementwise_grid, fj::kBackwardThreads, 0, bargs,
       "cuLaunchKernelEx(fj_bwd_reduce)");
    if (p.mode == Mode::train) {
      go(c.coef, columns_grid, fj::kBackwardColumnThreads, 0, bargs,
         "cuLaunchKernelEx(fj_bwd_coef)");
      if (need_da)
        go(c.da, elementwise_grid, fj::kBackwardThreads, 0, bargs, "cuLaunchKernelEx(fj_bwd_da)");
    } else {
      go(c.params, columns_grid, fj::kBackwardColumnThreads, 0, bargs,
         "cuLaunchKernelEx(fj_bwd_params)");
    }
  }
  // The K-major copies (grad_gemm_reads_copies), each right before the GEMM that reads it.
  auto transpose = [&](const void* src, std::int64_t ld_src, std::int64_t src_rows,
                       std::int64_t src_cols, std::size_t dst_offset, std::int64_t ld_dst,
                       const char* what) {
    fj::TransposeParams tp{src,
                           ws + dst_offset,
                           ld_src,
                           ld_dst,
                           static_cast<int>(src_rows),
                           static_cast<int>(src_cols)};
    void* targs[] = {&tp};
    auto tiles = [](std::int64_t n) { return (n + fj::kTransposeTile - 1) / fj::kTransposeTile; };
    go(c.transpose, static_cast<unsigned>(tiles(src_rows) * tiles(src_cols)), fj::kTransposeThreads,
       0, targs, what);
  };
  // A split GEMM writes fp32 slices and its sum kernel adds them into C (or to C's contents when
  // accumulating): kernels/grad_split_sum.cuh.
  auto gemm = [&](CUfunction f, CUfunction sum, const KernelConfig& k, std::int64_t out_rows,
                  unsigned smem, const void* b, void* out, bool acc, float* slices,
                  const CUtensorMap& ta, const CUtensorMap& tb, const CUtensorMap& tc,
                  const char* what, const char* sum_what, bool beside_prior) {
    fj::GemmParams g{};
    g.beside_prior = beside_prior ? 1 : 0;
    g.a = bp.ws_da;
    g.b = b;
    g.c = out;
    g.m = bp.m;
    g.accumulate = acc ? 1 : 0;
    g.partials = slices;
    const auto splits = static_cast<unsigned>(k.split_k);
    auto tiles = static_cast<unsigned>(((out_rows + k.bm - 1) / k.bm) * ((p.K + k.bn - 1) / k.bn));
    if (k.variant == Variant::warpspec && k.persistent)
      tiles = std::min(tiles, std::max(1u, static_cast<unsigned>(c.device.sm_count) / splits));
    void* plain[] = {&g};
    void* with_maps[] = {&g, const_cast<CUtensorMap*>(&ta), const_cast<CUtensorMap*>(&tb),
                         const_cast<CUtensorMap*>(&tc)};
    go(f, tiles, static_cast<unsigned>(k.threads()), smem,
       k.variant == Variant::warpspec ? with_maps : plain, what, splits);
    if (splits > 1) {
      // A thread per element of C, at most enough blocks to fill the GPU (grid-stride beyond).
      const auto elements = static_cast<std::uint64_t>(out_rows) * static_cast<std::uint64_t>(p.K);
      const std::uint64_t blocks = std::min<std::uint64_t>(
          (elements + fj::kGradSplitSumThreads - 1) / fj::kGradSplitSumThreads,
          8ull * static_cast<std::uint64_t>(c.device.sm_count));
      go(sum, static_cast<unsigned>(std::max<std::uint64_t>(1, blocks)), fj::kGradSplitSumThreads,
         0, plain, sum_what);
    }
  };
  // cuBLASLt's GEMMs read da as fj_bwd_da or fj_bwd_resident wrote it, and the layer's W and x in
  // place; as ordinary launches they start once the pass before has finished.
  auto run_lt = [&](const LtGemm& g, const void* a, void* out, bool acc) {
    g.run(lt->handle.get(), stream, a, bp.ws_da, out, nullptr, ws + w.lt_offset, lt->workspace, acc,
          rows);
  };
  if (dx_lt) run_lt(*lt->dx, t.w, t.dx, false);
  if (dw_lt) run_lt(*lt->dw, t.x, t.dw, accumulate);
  if (t.dx && !dx_lt && grad_gemm_reads_copies(p, c.config.dx))
    transpose(t.w, p.lda_w(), p.N, p.K, w.w_t_offset, w.copy_ld_n,
              "cuLaunchKernelEx(fj_bwd_transpose, W)");
  if (t.dx && !dx_lt)
    gemm(c.dx, c.dx_sum, c.config.dx, rows, static_cast<unsigned>(c.dx_smem_bytes), t.w, t.dx,
         false, reinterpret_cast<float*>(ws + w.dx_slices_offset), maps.dx_a, maps.dx_b, maps.dx_c,
         "cuLaunchKernelEx(fj_bwd_dx)", "cuLaunchKernelEx(fj_bwd_dx_sum)", false);
  // dW runs beside dX where the grid before it is dX's (or dX's split sum): the two read only
  // what the passes before them finished (da, x, W) and write different outputs, so dW's CTAs
  // may start on the SMs that dX's grid leaves idle, and in its last wave's tail, instead of after
  // it (GemmParams::beside_prior). Not after its own copies, which it reads. H200, bf16 train,
  // backward alone: 2048x2048x512 0.0391 -> 0.0379 ms, 8192x512x128 0.0341 -> 0.0322,
  // 4096x1024x1024 0.0495 -> 0.0487, 4096^3 unchanged (docs/performance.md).
  const bool dw_beside_dx = t.dx && !dx_lt && !grad_gemm_reads_copies(p, c.config.dw);
  if (t.dw && !dw_lt && grad_gemm_reads_da_copy(p, c.config.dw))
    transpose(bp.ws_da, grad_da_row_elements(p), rows, p.N, w.da_t_offset, w.copy_ld_rows,
              "cuLaunchKernelEx(fj_bwd_transpose, dA)");
  if (t.dw && !dw_lt && grad_gemm_reads_copies(p, c.config.dw))
    transpose(t.x, p.lda_x(), rows, p.K, w.x_t_offset, w.copy_ld_rows,
              "cuLaunchKernelEx(fj_bwd_transpose, x)");
  if (t.dw && !dw_lt)
    gemm(c.dw, c.dw_sum, c.config.dw, p.N, static_cast<unsigned>(c.dw_smem_bytes), t.x, t.dw,
         accumulate, reinterpret_cast<float*>(ws + w.dw_slices_offset), maps.dw_a, maps.dw_b,
         maps.dw_c, "cuLaunchKernelEx(fj_bwd_dw)", "cuLaunchKernelEx(fj_bwd_dw_sum)", dw_beside_dx);
}

}  // namespace fusejit
