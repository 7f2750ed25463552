// The backward pass's loaded kernel set (codegen/backward_codegen.hpp), its workspace and its
// launches: the backward counterpart of plan_core.hpp and launch.hpp.
#pragma once
#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/backward.hpp"
#include "fusejit/blas/lt_gemm.hpp"
#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/device.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/plan/tma_descriptor.hpp"
#include "fusejit/runtime/module.hpp"

namespace fusejit {

struct BackwardCore {
  Problem problem;  // the first one built for; everything but M holds for all it serves
  BackwardConfig config;
  Device device;
  CUcontext context = nullptr;
  std::shared_ptr<const Module> module;
  CUfunction reduce = nullptr, coef = nullptr, da = nullptr, params = nullptr, dx = nullptr,
             dw = nullptr;
  CUfunction dx_sum = nullptr, dw_sum = nullptr;  // split-K configs only
  CUfunction transpose = nullptr;                 // grad_gemm_reads_copies configs only
  int strips = 0, column_blocks = 0;              // from the module (kernels/bn_backward.cuh)
  // Train: fj_bwd_resident, and the most blocks of it the device holds at once (its occupancy
  // times the SMs): launch_backward's grid is at most this, and its blocks walk the units beyond;
  // the same for fj_bwd_resident_shared with fj::kBackwardResidentSharedBytes of dynamic shared
  // memory a block (fj::backward_first_rows_in_shared).
  CUfunction resident = nullptr, resident_shared = nullptr;
  int resident_blocks = 0, resident_shared_blocks = 0;
  int dx_smem_bytes = 0, dw_smem_bytes = 0;
  std::vector<std::string> kernel_names;
  bool cache_hit = false;
  double compile_seconds = 0;
};

// What a backward pass can be built for: a valid problem, no synchronized statistics, train
// with M >= 2. Throws InvalidArgument naming the argument.
void validate_backward_problem(const Problem&);
// validate_backward_problem's refusal as text ("" when the backward pass takes the problem), for
// callers that skip a problem instead of failing (compile --backward, the tuning database).
std::string backward_refusal(const Problem&);

// Why `config` cannot run the gradient GEMM `gemm` (dx_gemm_problem or dw_gemm_problem of the
// layer `p`) on `device`; empty when it can. Beyond KernelConfig::why_invalid: no exact M;
// split-K on either variant (up to kMaxSplitK, not with TMA stores); warpspec only for 16-bit
// types (MN-major operands through wgmma's transpose bits) and tf32 (K-major copies), without
// clusters or pingpong, TMA stores only onto 16-byte aligned rows of dx and dW, and within the
// device's shared memory (grad_wgmma_smem_bytes). A warpspec GEMM loads only 16-byte aligned
// rows whatever the layer's (da's padded rows; copies where x's and W's are not:
// grad_gemm_reads_copies) and stores C one element at a time where its rows need it.
std::string grad_gemm_why_invalid(const Problem& p, const KernelConfig& config, const Problem& gemm,
                                  const Device& device);

// A caller's config for the dx GEMM (`dw` false) or the dW GEMM of `p`, judged as the dispatch
// judges its own: grad_gemm_why_invalid at the M class's representative M (backward_gemms).
// Throws InvalidArgument(arg, "<key>: <why>") when it cannot run. BackwardPlan's forced tiles and
// `fusejit compile --backward-config` both check through it.
void require_grad_gemm_config(const Problem& p, const KernelConfig& c, bool dw, const Device& d,
                              const char* arg);

// Why `c` cannot run p's gradient GEMMs on `d` ("" when it can): grad_gemm_why_invalid of each
// GEMM it runs on fusejit's tiles, at the M class's representative M (backward_gemms); a GEMM
// on cuBLASLt runs any layout.
std::string backward_config_why_invalid(const Problem& p, const BackwardConfig& c, const Device& d);

// `c` as forced GEMMs of a BackwardPlan (BackwardOptions, or options with the same fields): each
// GEMM's tiles, or cuBLASLt.
template <class Options>
void force_backward_config(Options& o, const BackwardConfig& c) {
  o.dx_cublaslt = c.dx_cublaslt;
  o.dw_cublaslt = c.dw_cublaslt;
  o.dx_config = c.dx_cublaslt ? std::nullopt : std::optional<KernelConfig>(c.dx);
  o.dw_config = c.dw_cublaslt ? std::nullopt : std::optional<KernelConfig>(c.dw);
}

// The configs the gradient GEMM `g` (dx_gemm_problem, `dw` false, or dw_gemm_problem of `p`) can
// run on `d`, in the heuristic's order (warpspec before tiled, each by the time model:
// GemmKind::gradient, or gradient_one_wave where even the widest unsplit grid fills at most half
// the GPU; split-K twins of tiles whose own grid fills at most half the GPU, ranked with the rest
// there and after each kernel's unsplit tiles elsewhere; tiles known to spill last): what
// default_backward_config takes the first of and `fusejit autotune --backward` times.
std::vector<KernelConfig> grad_gemm_candidates(const Problem& p, const Problem& g, bool dw,
                                               const Device& d);

// The two GEMMs as their configs are chosen: dx_gemm_problem and dw_gemm_problem with M (dx's
// rows, dW's reduction) at the M class's representative, so every M of a class chooses alike.
struct BackwardGemms {
  Problem dx, dw;
};
BackwardGemms backward_gemms(const Problem&);

// The config the backward plan runs without a tuning entry: for strict fp32 and tf32x3 both GEMMs
// on cuBLASLt; otherwise, for each GEMM's shape (dx_gemm_problem, dw_gemm_problem; dx's rows and
// dW's reduction taken at the M class's representative M) the heuristic's first candidate that
// grad_gemm_why_invalid accepts, warpspec before tiled where it can run, except that a 16-bit
// GEMM of aligned rows whose pick is one wave of single-consumer warpspec tiles over a reduction
// of 4096 or more, a split dW of 128 columns or more, or two-consumer tiles that use at most 62%
// of their waves' SM slots over a reduction of 768 or more (all counted at that M) runs on
// cuBLASLt (measured faster there). The same for every M of an M class.
BackwardConfig default_backward_config(const Problem&, const Device&);
// The config a plan of `p` runs from `c`, its M class's choice (default_backward_config, or a
// tuning entry for another M of the class): `c`, with dX on cuBLASLt where lt_beats_tiles' rule
// holds for dX's grid at p's own M. The survey behind the rule timed grids at the run's M; the
// tiles a class's representative M fills 73-97% of a wave with can use 61% or less of their
// waves' SM slots at a smaller M of the class (512x2048x2048: 64 tiles of 128x128 at 512 rows,
// 128 at the class's 1024), where the backward with cuBLASLt's dX took 2.5-19.6% less at 13
// layers (H200; docs/performance.md, "dX on cuBLASLt decided at the plan's own M"). Only dX, and
// only towards cuBLASLt: the plan keeps the class's kernel set (with_dx_on_cublaslt), so every M of
// the class still shares one compiled set. dW's grid (its N x K output) is the same at every M, and
// its rule at a smaller M (a shorter reduction) was not measured.
BackwardConfig plan_backward_config(const Problem& p, const BackwardConfig& c, const Device& d);
// The heuristic's tiles for both GEMMs (never cuBLASLt): what default_backward_config replaces
// with cuBLASLt, and what a GEMM runs when cuBLASLt declines it (lt_declined_fallback).
BackwardConfig default_backward_tiles(const Problem&, const Device&);
// The config a plan runs when cuBLASLt declined `c` (no algorithm for the layer's strides): each
// GEMM `c` put on cuBLASLt that the caller did not force (forced_dx, forced_dw) takes `tiles`'
// tiles instead. Nullopt where only forced GEMMs are on cuBLASLt: the plan then fails as asked.
std::optional<BackwardConfig> lt_declined_fallback(const BackwardConfig& c,
                                                   const BackwardConfig& tiles, bool forced_dx,
                                                   bool forced_dw);

// Built once per (kernel set, context, cache dir) and shared, like plan_core(); `built` (when
// given) says whether this call built the core (false: it was in the process).
std::shared_ptr<const BackwardCore> backward_core(const Problem&, const BackwardConfig&,
                                                  CUcontext context, const std::string& cache_dir,
                                                  bool* built = nullptr);

// `core` (a kernel set built with dX on tiles) running `moved` (its config with dX on cuBLASLt:
// plan_backward_config): the same loaded module, its dX kernel unused, the config and kernel
// names those of `moved`. A plan's own copy; the module stays shared.
std::shared_ptr<const BackwardCore> with_dx_on_cublaslt(const BackwardCore& core,
                                                        const BackwardConfig& moved);

// The strips of columns the BatchNorm kernels split N into, as they count them (codegen's
// Spec: VEC_BYTES = the rows' alignment, at most 16): what sizes the workspace's partials and
// strip counters.
int backward_layer_strips(const Problem& p);

// Where each region of a backward run's workspace lies, for runs of up to `rows` rows with
// `config`'s gradient GEMMs (a split one's fp32 slices: common/split_k.h).
// da is [rows][grad_da_row_elements]. The K-major copies (grad_gemm_reads_copies) come last:
// W^T [K][copy_ld_n] for dX, dA^T [N][copy_ld_rows] (tf32 only: grad_gemm_reads_da_copy) and x^T
// [K][copy_ld_rows] for dW, N and the rows rounded up to 16 bytes (TMA's row strides); their
// offsets are 0 where the GEMM reads none.
struct BackwardWorkspace {
  std::size_t lt_offset = 0;  // cuBLASLt's workspace (BackwardLt::workspace bytes), first
  std::size_t dy_partials_offset = 0, dz_partials_offset = 0, coef_offset = 0, da_offset = 0;
  std::size_t strip_ready_offset = 0;  // train: [strips] u32 (BackwardParams::ws_strip_ready)
  std::size_t dx_slices_offset = 0, dw_slices_offset = 0;
  std::size_t w_t_offset = 0, da_t_offset = 0, x_t_offset = 0;
  std::int64_t copy_ld_n = 0, copy_ld_rows = 0;  // the copies' row strides, in elements
  std::size_t total = 0;
};
// `lt_bytes`: BackwardLt::workspace for a config with a GEMM on cuBLASLt (else ignored).
BackwardWorkspace backward_workspace(const Problem&, const BackwardConfig&, std::int64_t rows,
                                     std::size_t lt_bytes);

// The gradient GEMMs a config runs on cuBLASLt (BackwardConfig::dx_cublaslt, dw_cublaslt), set up
// for runs of 1 (eval) or 2 (train) up to p.M rows: dx = da W and dW (+)= da^T x from da in the
// workspace, in the layer's storage type (strict fp32 for tf32x3, as grad_gemm_dtype). Null
// GEMMs for a config with none. Built per plan (the algorithm depends on M), used by one run at
// a time per stream like the plan's workspace.
struct BackwardLt {
  LtHandle handle;
  std::unique_ptr<LtGemm> dx, dw;
  std::size_t workspace = 0;  // bytes of cuBLASLt workspace both need, at most
};
BackwardLt make_backward_lt(const Problem& p, const BackwardConfig& c);

// Throws InvalidArgument naming the first tensor that is missing, misaligned or not wanted, or
// an output (dx, dw) whose address range over `rows` rows (0: the problem's M) meets that of an
// operand a GEMM of the run reads (x, W, the `workspace_bytes` of `workspace` that hold da) or
// of the other output, or an input (dy, saved, and x or W where a GEMM reads them) whose range
// meets the workspace's. Formats nothing unless it throws.
void validate_backward_tensors(const Problem&, const BackwardTensors&, std::int64_t rows = 0,
                               const void* workspace = nullptr, std::size_t workspace_bytes = 0);

// What a backward plan's runs remember between calls (RunCache's counterpart, plan/launch.hpp):
// the stream last found to belong to the core's context, and the warpspec gradient GEMMs'
// tensor maps for the last (workspace, W, x, dX, dW, rows), re-encoded only when those change
// (the workspace base and the rows fix where dA and the copies lie). One run at a time uses
// the maps (`busy`); a concurrent run encodes its own.
struct BackwardRunCache {
  std::atomic<CUstream> checked_stream{nullptr};
  std::atomic_flag busy;
  bool valid = false;
  const void* workspace = nullptr;
  const void* w = nullptr;
  const void* x = nullptr;
  const void* dx = nullptr;
  const void* dw = nullptr;
  std::int64_t rows = 0;
  CUtensorMap dx_a{}, dx_b{}, dx_c{}, dw_a{}, dw_b{}, dw_c{};
};

// Enqueues the backward of `rows` rows. Tensors and workspace were checked by the caller.
// `cache`: the plan's, or null. `lt`: make_backward_lt(p, config) where the config runs a GEMM
// on cuBLASLt (InvalidArgument "config" when it is missing), else ignored.
void launch_backward(const BackwardCore&, std::int64_t rows, bool accumulate, CUstream stream,
                     const BackwardTensors&, void* workspace, BackwardRunCache* cache = nullptr,
                     const BackwardLt* lt = nullptr);

// The train runs of this process whose BatchNorm passes launch_backward launched as
// fj_bwd_resident or fj_bwd_resident_shared (`shared` of them the second), and those whose
// cooperative launch was refused (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, or
// Fault::cooperative_too_large) and ran the three passes instead: what tells a test or a
// benchmark which of them ran.
struct ResidentGridCounts {
  std::uint64_t launched = 0, refused = 0, shared = 0;
};
ResidentGridCounts resident_grid_counts();

}  // namespace fusejit
