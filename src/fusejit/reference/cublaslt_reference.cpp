#include "fusejit/reference/cublaslt_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "fusejit/blas/lt_gemm.hpp"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/runtime/module.hpp"
#include "reference/ref_params.h"

namespace fusejit {

namespace {

// Row-major y[M][ldy] = x[M][ldx] W[N][ldw]^T is, column-major, D (N x M, ld ldy) = W^T (op T
// of the K x N matrix W, ld ldw) * x (K x M, ld ldx): the "TN" layout every cuBLASLt
// tensor-core kernel supports.
LtGemmSpec gemm_spec(const Problem& p) {
  LtGemmSpec s;
  s.m = p.N, s.n = p.M, s.k = p.K;
  s.trans_a = true, s.trans_b = false;
  s.lda = p.lda_w(), s.ldb = p.lda_x(), s.ldd = p.lda_y();
  s.ab_type = s.d_type = lt_type(p.dtype);
  s.compute = lt_compute(p.dtype);
  s.ab_alignment = s.d_alignment = static_cast<unsigned>(p.effective_alignment());
  return s;
}

// fj_ref_stats' chunks of rows for a run of `rows` rows of N columns on `sms` SMs: enough
// blocks for about kRefStatsWaves per SM where the columns' blocks alone are fewer, each chunk at
// least kRefStatsMinChunkRows rows. `max_count` bounds `count` for every rows <= M, for the
// workspace.
struct StatsChunks {
  long long rows = 0;
  int count = 1;
  int max_count = 1;
};
StatsChunks stats_chunks(std::int64_t rows, std::int64_t n, int sms) {
  const std::int64_t col_blocks = (n + fj::kRefStatsCols - 1) / fj::kRefStatsCols;
  const std::int64_t want = std::max<std::int64_t>(
      1, (fj::kRefStatsWaves * std::max(1, sms) + col_blocks - 1) / col_blocks);
  StatsChunks c;
  c.rows = std::max<std::int64_t>(fj::kRefStatsMinChunkRows, (rows + want - 1) / want);
  c.count = static_cast<int>((rows + c.rows - 1) / c.rows);
  c.max_count = static_cast<int>(std::min<std::int64_t>(
      want, (rows + fj::kRefStatsMinChunkRows - 1) / fj::kRefStatsMinChunkRows));
  return c;
}

void require_aligned(const void* ptr, const char* arg, int alignment) {
  if (!ptr) throw InvalidArgument(arg, "expected a device pointer; got null");
  if (reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(alignment))
    throw InvalidArgument(arg, fmt::format("expected a {}-byte aligned pointer (the problem's "
                                           "alignment); got {}",
                                           alignment, ptr));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BareGemm

struct BareGemm::Impl {
  Problem problem;
  CUcontext ctx = nullptr;
  LtHandle handle;
  std::unique_ptr<LtGemm> gemm;
  DeviceBuffer workspace;
};

BareGemm::BareGemm(const Problem& problem, int device) : impl_(std::make_unique<Impl>()) {
  Problem p = problem;
  p.mode = Mode::eval;  // a bare GEMM has no batch statistics: M = 1 is fine
  p.validate();
  impl_->problem = problem;
  impl_->ctx = context_for(device);
  impl_->handle = make_lt_handle();
  impl_->gemm = LtGemm::require(impl_->handle.get(), gemm_spec(p));
  impl_->workspace = DeviceBuffer(impl_->gemm->workspace());
}

BareGemm::~BareGemm() = default;
BareGemm::BareGemm(BareGemm&&) noexcept = default;
BareGemm& BareGemm::operator=(BareGemm&&) noexcept = default;

void BareGemm::run(CUstream stream, const void* x, const void* w, void* y) const {
  const Impl& m = *impl_;
  require_aligned(x, "x", m.problem.effective_alignment());
  require_aligned(w, "w", m.problem.effective_alignment());
  require_aligned(y, "y", m.problem.effective_alignment());
  const ScopedContext in_op(m.ctx, ScopedContext::Checked{});  // the caller's comes back
  m.gemm->run(m.handle.get(), stream, w, x, y, nullptr, m.workspace.get(), m.workspace.size());
}

const Problem& BareGemm::problem() const {
  return impl_->problem;
}
std::size_t BareGemm::workspace_size() const {
  return impl_->workspace.size();
}

std::string BareGemm::description() const {
  const LtGemmSpec& s = impl_->gemm->spec();
  return fmt::format("cuBLASLt {} TN, compute {}, workspace {} B ({})", lt_type_name(s.ab_type),
                     s.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "32F_FAST_TF32" : "32F",
                     impl_->workspace.size(), impl_->gemm->algo_summary());
}

// ---------------------------------------------------------------------------------------------
// ReferenceOp

KernelSource reference_kernel_source(DType dtype, DType param_dtype) {
  KernelSource src;
  src.name = fmt::format("fj.reference.{}.p{}", name(storage_type(dtype)),
                         name(storage_type(param_dtype)));
  std::string& t = src.text;
  t += fmt::format("// fusejit reference kernels: {}\n", src.name);
  t += "#include \"common/types.cuh\"\n";
  t += fmt::format("struct Spec {{\n  using T = {};\n  using P = {};\n}};\n",
                   template_type_name(dtype), template_type_name(param_dtype));
  t += "#include \"reference/plain_bn.cuh\"\n";
  t += "extern \"C\" __global__ void __launch_bounds__(fj::kRefStatsThreads)\n"
       "fj_ref_stats(const fj::RefParams p) { fj::ref_stats<Spec>(p); }\n";
  t += "extern \"C\" __global__ void __launch_bounds__(fj::kRefCoefThreads)\n"
       "fj_ref_stats_merge(const fj::RefParams p) { fj::ref_stats_merge<Spec>(p); }\n";
  t += "extern \"C\" __global__ void __launch_bounds__(fj::kRefCoefThreads)\n"
       "fj_ref_eval_coef(const fj::RefParams p) { fj::ref_eval_coef<Spec>(p); }\n";
  t += "extern \"C\" __global__ void __launch_bounds__(fj::kRefApplyThreads)\n"
       "fj_ref_apply(const fj::RefParams p) { fj::ref_apply<Spec>(p); }\n";
  src.kernels = {"fj_ref_stats", "fj_ref_stats_merge", "fj_ref_eval_coef", "fj_ref_apply"};
  src.options = {"--std=c++17", "-DNDEBUG"};
  // Only the headers these kernels include, so edits to the fused kernels' templates do not
  // change this source's cache key.
  for (const auto& h : template_headers())
    if (h.first == "common/types.cuh" || h.first.starts_with("reference/"))
      src.headers.push_back(h);
  return src;
}

struct ReferenceOp::Impl {
  Problem problem;
  CUcontext ctx = nullptr;
  Device device;
  LtHandle handle;
  std::unique_ptr<LtGemm> gemm_plain;  // bias (if any) added by the plain kernels
  std::unique_ptr<LtGemm> gemm_bias;   // bias epilogue; null when not applicable or unsupported
  // A run's workspace, regions 256-byte aligned: cuBLASLt's at 0; col_mean, col_mul, col_add,
  // col_gmean ([4][N] fp32) at cols_offset; train's chunk statistics ([chunks][3][N] float64,
  // when an M-row run has more than one chunk) at chunks_offset; the fp32 GEMM output ([M][N])
  // at g_offset when y is 16-bit (y itself holds it when y is fp32).
  bool into_y = false;
  bool fewer_rows = false;  // the GEMMs run any row count down to 1 (train: 2)
  std::size_t lt_bytes = 0, cols_offset = 0, chunks_offset = 0, g_offset = 0, total = 0;
  DeviceBuffer own;  // for run() without a caller workspace
  std::shared_ptr<const Module> module;
  CUfunction stats = nullptr, stats_merge = nullptr, eval_coef = nullptr, apply = nullptr;
  unsigned apply_grid = 1;
};

ReferenceOp::ReferenceOp(const Problem& problem, const ReferenceOpOptions& options)
    : impl_(std::make_unique<Impl>()) {
  problem.validate();
  Impl& m = *impl_;
  m.problem = problem;
  m.ctx = context_for(options.device);
  m.device = Device::current();
  m.handle = make_lt_handle();

  // The GEMM writes fp32 so the statistics see the unrounded products (as the fused kernels'
  // epilogues do); for fp32 problems that is y itself.
  const bool into_y = storage_type(problem.dtype) == DType::fp32;
  m.into_y = into_y;
  LtGemmSpec s = gemm_spec(problem);
  s.d_type = CUDA_R_32F;
  if (!into_y) {
    s.ldd = problem.N;
    s.d_alignment = 256;  // our own cuMemAlloc'ed buffer
  }
  // A run may have fewer rows than M (Plan::run's `rows`), down to one (train: two, for a
  // variance): one algorithm for all of them. Where cuBLASLt has none (N = 1 with a padded row
  // stride: no candidate passes its check at fewer rows), M rows only.
  const std::int64_t least = problem.mode == Mode::train ? 2 : 1;
  m.gemm_plain = LtGemm::make_for_rows(m.handle.get(), s, true, least);
  m.fewer_rows = m.gemm_plain != nullptr;
  if (!m.fewer_rows) m.gemm_plain = LtGemm::require(m.handle.get(), s);
  // cuBLASLt's bias is of D's type (fp32), so the epilogue can take it only when the
  // parameters are fp32; 16-bit parameters are added by the plain kernels instead.
  if (problem.has_bias && problem.param_dtype == DType::fp32) {
    LtGemmSpec sb = s;
    sb.bias_epilogue = true;
    m.gemm_bias = m.fewer_rows ? LtGemm::make_for_rows(m.handle.get(), sb, true, least)
                               : LtGemm::make(m.handle.get(), sb);
  }
  m.lt_bytes = std::max(m.gemm_plain->workspace(), m.gemm_bias ? m.gemm_bias->workspace() : 0);
  m.cols_offset = align_workspace(m.lt_bytes);
  m.chunks_offset =
      align_workspace(m.cols_offset + 4 * static_cast<std::size_t>(problem.N) * sizeof(float));
  const StatsChunks chunks = stats_chunks(problem.M, problem.N, m.device.sm_count);
  const std::size_t chunk_bytes = problem.mode == Mode::train && chunks.max_count > 1
                                      ? static_cast<std::size_t>(chunks.max_count) * 3 *
                                            static_cast<std::size_t>(problem.N) * sizeof(double)
                                      : 0;
  m.g_offset = align_workspace(m.chunks_offset + chunk_bytes);
  m.total = into_y ? m.g_offset
                   : align_workspace(m.g_offset + static_cast<std::size_t>(problem.M) *
                                                      static_cast<std::size_t>(problem.N) *
                                                      sizeof(float));
  if (options.own_workspace) m.own = DeviceBuffer(m.total);

  const KernelSource src = reference_kernel_source(problem.dtype, problem.param_dtype);
  const std::string arch = m.device.arch();
  const std::string key = cache_key(src, arch, nvrtc_version());
  m.module = Module::find(key);
  if (!m.module)
    m.module = Module::get(key, compile_cached(src, arch, options.cache_dir), src.kernels);
  m.stats = m.module->function("fj_ref_stats");
  m.stats_merge = m.module->function("fj_ref_stats_merge");
  m.eval_coef = m.module->function("fj_ref_eval_coef");
  m.apply = m.module->function("fj_ref_apply");
  const std::size_t total =
      static_cast<std::size_t>(problem.M) * static_cast<std::size_t>(problem.N);
  const std::size_t blocks = (total + fj::kRefApplyThreads - 1) / fj::kRefApplyThreads;
  m.apply_grid = static_cast<unsigned>(std::clamp<std::size_t>(
      blocks, 1, static_cast<std::size_t>(std::max(1, m.device.sm_count)) * 8));
}

ReferenceOp::~ReferenceOp() = default;
ReferenceOp::ReferenceOp(ReferenceOp&&) noexcept = default;
ReferenceOp& ReferenceOp::operator=(ReferenceOp&&) noexcept = default;

const Problem& ReferenceOp::problem() const {
  return impl_->problem;
}

void ReferenceOp::validate(const Tensors& t) const {
  validate_tensors(impl_->problem, t);
}

bool ReferenceOp::runs_fewer_rows() const {
  return impl_->fewer_rows;
}

std::size_t ReferenceOp::workspace_size() const {
  return impl_->total;
}

void ReferenceOp::run(CUstream stream, const Tensors& t) const {
  run(stream, t, impl_->own.get(), impl_->own.size());
}

void ReferenceOp::run(CUstream stream, const Tensors& t, void* workspace,
                      std::size_t workspace_bytes) const {
  run(stream, t, impl_->problem.M, workspace, workspace_bytes);
}

void ReferenceOp::run(CUstream stream, const Tensors& t, std::int64_t rows, void* workspace,
                      std::size_t workspace_bytes) const {
  const Impl& m = *impl_;
  const Problem& p = m.problem;
  const std::int64_t least = p.mode == Mode::train ? 2 : 1;
  if (rows < least || rows > p.M)
    throw InvalidArgument("rows",
                          fmt::format("expected {} <= rows <= M = {}; got {}", least, p.M, rows));
  if (rows != p.M && !m.fewer_rows)
    throw InvalidArgument("rows", fmt::format("expected rows = M = {}: cuBLASLt has no algorithm "
                                              "for this problem that also runs fewer rows; got {}",
                                              p.M, rows));
  validate_tensors(p, t, rows, workspace, m.total);
  validate_workspace(workspace, workspace_bytes, m.total);
  char* ws = static_cast<char*>(workspace);
  const ScopedContext in_op(m.ctx, ScopedContext::Checked{});  // the caller's comes back
  validate_stream(m.ctx, stream);
  const bool train = p.mode == Mode::train;
  const bool bias_in_gemm =
      m.gemm_bias && reinterpret_cast<std::uintptr_t>(t.bias) % LtGemm::kBiasAlignmentHint == 0;
  const LtGemm& gemm = bias_in_gemm ? *m.gemm_bias : *m.gemm_plain;
  void* g = m.into_y ? t.y : ws + m.g_offset;
  gemm.run(m.handle.get(), stream, t.w, t.x, g, bias_in_gemm ? t.bias : nullptr,
           m.lt_bytes ? ws : nullptr, m.lt_bytes, false, rows);

  fj::RefParams prm{};
  prm.g = static_cast<const float*>(g);
  prm.ldg = m.into_y ? p.lda_y() : p.N;
  set_batchnorm_params(prm, t);
  prm.ldy = p.lda_y();
  prm.bias = bias_in_gemm ? nullptr : t.bias;
  float* cols = reinterpret_cast<float*>(ws + m.cols_offset);
  prm.col_mean = cols;
  prm.col_mul = cols + p.N;
  prm.col_add = cols + 2 * p.N;
  prm.col_gmean = cols + 3 * p.N;
  const StatsChunks chunks = stats_chunks(rows, p.N, m.device.sm_count);
  prm.chunk_stats = reinterpret_cast<double*>(ws + m.chunks_offset);
  prm.chunk_rows = chunks.rows;
  prm.chunks = chunks.count;
  prm.M = rows;
  prm.N = static_cast<int>(p.N);
  prm.train = train ? 1 : 0;
  prm.cumulative = train && !p.momentum ? 1 : 0;
  prm.eps = p.eps;
  prm.momentum = p.momentum.value_or(0.0);
  void* args[] = {&prm};
  const Driver& d = driver();
  const auto col_blocks = [&](int per_block) {
    return static_cast<unsigned>((p.N + per_block - 1) / per_block);
  };
  if (train) {
    check(d.cuLaunchKernel(m.stats, col_blocks(fj::kRefStatsCols),
                           static_cast<unsigned>(chunks.count), 1, fj::kRefStatsThreads, 1, 1, 0,
                           stream, args, nullptr),
          "cuLaunchKernel(fj_ref_stats)");
    if (chunks.count > 1)
      check(d.cuLaunchKernel(m.stats_merge, col_blocks(fj::kRefCoefThreads), 1, 1,
                             fj::kRefCoefThreads, 1, 1, 0, stream, args, nullptr),
            "cuLaunchKernel(fj_ref_stats_merge)");
  } else
    check(d.cuLaunchKernel(m.eval_coef, col_blocks(fj::kRefCoefThreads), 1, 1, fj::kRefCoefThreads,
                           1, 1, 0, stream, args, nullptr),
          "cuLaunchKernel(fj_ref_eval_coef)");
  check(d.cuLaunchKernel(m.apply, m.apply_grid, 1, 1, fj::kRefApplyThreads, 1, 1, 0, stream, args,
                         nullptr),
        "cuLaunchKernel(fj_ref_apply)");
}

std::vector<std::string> ReferenceOp::kernel_names() const {
  const Problem& p = impl_->problem;
  if (p.mode == Mode::train) {
    // An M-row run's kernels (one of fewer rows may have one chunk and no merge).
    if (stats_chunks(p.M, p.N, impl_->device.sm_count).count > 1)
      return {"cublasLtMatmul", "fj_ref_stats", "fj_ref_stats_merge", "fj_ref_apply"};
    return {"cublasLtMatmul", "fj_ref_stats", "fj_ref_apply"};
  }
  return {"cublasLtMatmul", "fj_ref_eval_coef", "fj_ref_apply"};
}

std::string ReferenceOp::description() const {
  const Impl& m = *impl_;
  const char* bias = !m.problem.has_bias ? "no bias"
                     : m.gemm_bias       ? "bias epilogue"
                                         : "bias in plain kernel";
  return fmt::format("cuBLASLt {} TN -> fp32 ({}) + plain {} BatchNorm",
                     lt_type_name(lt_type(m.problem.dtype)), bias, name(m.problem.mode));
}

}  // namespace fusejit
