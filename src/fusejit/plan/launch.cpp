#include "fusejit/plan/launch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "common/input_stats.h"
#include "common/limits.h"
#include "common/params.h"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"

namespace fusejit {

namespace {

// fj_apply's grid for a run of `rows` rows: the module's blocks per slab of kApplyBlockRows rows.
unsigned apply_grid(const PlanCore& c, std::int64_t rows) {
  return c.apply_shape.grid_x *
         static_cast<unsigned>((rows + fj::kApplyBlockRows - 1) / fj::kApplyBlockRows);
}

}  // namespace

CUlaunchAttribute programmatic_dependent_attribute() {
  CUlaunchAttribute pdl{};
  pdl.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  pdl.value.programmaticStreamSerializationAllowed = 1;
  return pdl;
}

void launch_dependent(const Device& device, CUfunction f, unsigned grid_x, unsigned grid_y,
                      unsigned threads, unsigned smem, CUstream stream, void** args,
                      const char* what) {
  CUlaunchAttribute pdl = programmatic_dependent_attribute();
  CUlaunchConfig cfg{};
  cfg.gridDimX = grid_x;
  cfg.gridDimY = grid_y;
  cfg.gridDimZ = 1;
  cfg.blockDimX = threads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  cfg.attrs = &pdl;
  cfg.numAttrs = device.cc() >= 90 ? 1 : 0;
  check(driver().cuLaunchKernelEx(&cfg, f, args, nullptr), what);
}

CUlaunchAttribute cooperative_attribute() {
  CUlaunchAttribute a{};
  a.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  a.value.cooperative = 1;
  return a;
}

CUresult launch_cooperative(const CUlaunchConfig& cfg, CUfunction f, void** args) {
  if (fault::fire(Fault::cooperative_too_large)) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  return driver().cuLaunchKernelEx(&cfg, f, args, nullptr);
}

CUresult launch_cooperative_grid(const Device& device, CUfunction f, unsigned grid,
                                 unsigned threads, unsigned smem, CUstream stream, void** args,
                                 bool dependent) {
  CUlaunchAttribute attrs[2] = {cooperative_attribute(), programmatic_dependent_attribute()};
  CUlaunchConfig cfg{};
  cfg.gridDimX = grid;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = threads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = dependent && device.cc() >= 90 ? 2 : 1;
  return launch_cooperative(cfg, f, args);
}

bool launch_input_stats(const PlanCore& c, const RunShape& shape, CUstream stream, void** args) {
  const CUresult r = launch_cooperative_grid(c.device, c.input_stats, shape.input_stats_grid,
                                             fj::kInputStatsThreads, 0, stream, args, false);
  if (r == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) return false;
  check(r, "cuLaunchKernelEx(fj_input_stats, cooperative)");
  return true;
}

RunShape run_shape(const PlanCore& c, std::int64_t rows, const WorkspaceLayout& workspace) {
  RunShape r;
  r.rows = static_cast<int>(rows);
  r.workspace = workspace;
  const KernelConfig& k = c.config;
  const auto row_tiles = static_cast<unsigned>((rows + k.bm - 1) / k.bm);
  const auto col_tiles = static_cast<unsigned>((c.problem.N + k.bn - 1) / k.bn);
  const unsigned tiles = row_tiles * col_tiles;
  if (k.variant == Variant::warpspec) {
    // WarpspecGemm::grid_size: clusters of cluster_m CTAs along M; persistent grids stop at
    // one cluster per cluster_m SMs.
    const auto cl = static_cast<unsigned>(k.cluster_m);
    const unsigned cluster_tiles = (row_tiles + cl - 1) / cl * col_tiles;
    const unsigned sms = static_cast<unsigned>(c.device.sm_count) / cl;
    r.gemm_grid = cl * (k.persistent ? std::min(cluster_tiles, sms) : cluster_tiles);
  } else {
    r.gemm_grid = tiles;
    r.gemm_splits = static_cast<unsigned>(k.split_k);
  }
  if (c.splitk_reduce) r.splitk_grid = c.splitk_reduce_shape.grid_x * tiles;
  // Which kernels go out: codegen's schedule, the one rule for it.
  const KernelSchedule s = schedule_flags(c.problem, c.config, rows, c.resident_tiles);
  r.gemm = s.gemm;
  r.finalize = s.finalize;
  r.exchange = s.exchange;
  r.bump = s.bump;
  r.affine = s.affine;
  r.grid_sync = s.grid_sync;
  if (s.grid_sync) r.resident_grid = resident_grid(c.config, c.problem.N, rows, c.resident_tiles);
  r.overlap = s.overlap;
  // fj_input_stats: a CTA per kInputStatsCtaRows rows, or per kInputStatsWarps columns (phase
  // 3 takes a column a warp) where that is more (4096x4096x64 on 32 CTAs, one per 128 rows,
  // took 128 columns a CTA: 0.058 ms against recompute's 0.032), up to what the device holds.
  if (s.input_stats)
    r.input_stats_grid = static_cast<unsigned>(std::min<std::int64_t>(
        c.input_stats_ctas,
        std::max<std::int64_t>((rows + fj::kInputStatsCtaRows - 1) / fj::kInputStatsCtaRows,
                               (c.problem.N + fj::kInputStatsWarps - 1) / fj::kInputStatsWarps)));
  if (s.pad) {
    // One thread per 16-byte unit of W's and x's padded rows, in at most 8 blocks per SM (the
    // kernel's grid-stride loop takes the rest).
    const std::int64_t units =
        (c.problem.N + rows) * ((c.problem.K * storage_bytes(c.problem.dtype) + 15) / 16);
    const std::int64_t blocks = (units + fj::kPadThreads - 1) / fj::kPadThreads;
    r.pad_grid = static_cast<unsigned>(
        std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, 8 * c.device.sm_count)));
  }
  if (s.apply) {
    r.apply = s.fold_finalize ? c.apply_fold : c.apply;
    r.apply_grid = apply_grid(c, rows);
  }
  return r;
}

void validate_workspace(const void* workspace, std::size_t bytes, std::size_t needed) {
  if (!needed) return;
  if (!workspace)
    throw InvalidArgument("workspace",
                          fmt::format("this plan needs {} bytes of workspace; got null", needed));
  if (bytes < needed)
    throw InvalidArgument(
        "workspace", fmt::format("this plan needs {} bytes of workspace; got {}", needed, bytes));
  if (reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlign)
    throw InvalidArgument("workspace",
                          fmt::format("expected a {}-byte aligned pointer", kWorkspaceAlign));
}

namespace {

// Whether [p, p + bytes) and [q, q + q_bytes) share a byte; null or empty meets nothing.
bool ranges_meet(const void* p, std::size_t bytes, const void* q, std::size_t q_bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  return a && b && bytes && q_bytes && a < b + q_bytes && b < a + bytes;
}

}  // namespace

void require_disjoint(const void* p, std::size_t bytes, const char* arg, const void* other,
                      std::size_t other_bytes, const char* other_arg, const char* why) {
  if (ranges_meet(p, bytes, other, other_bytes))
    throw InvalidArgument(
        arg, fmt::format("overlaps {}: {} bytes from {} and {} bytes from {} ({})", other_arg,
                         bytes, p, other_bytes, other, why));
}

std::size_t tensor_span(std::int64_t rows, std::int64_t ld, std::int64_t cols,
                        std::size_t elem_bytes) {
  return static_cast<std::size_t>((rows - 1) * ld + cols) * elem_bytes;
}

bool StridedBytes::meets(const StridedBytes& o) const {
  if (!ranges_meet(base, span(), o.base, o.span())) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(base),
             b = reinterpret_cast<std::uintptr_t>(o.base);
  // One row stride L, rows no wider than it: every byte of this tensor lies at a + c (mod L),
  // c < its row's bytes, and likewise the other's, so they meet only where those arcs of the
  // circle of length L do.
  const auto bytes = [](std::int64_t n, std::size_t e) {
    return static_cast<std::uintptr_t>(n) * e;
  };
  const std::uintptr_t L = bytes(ld, elem_bytes), wa = bytes(cols, elem_bytes),
                       wb = bytes(o.cols, o.elem_bytes);
  if (L != bytes(o.ld, o.elem_bytes) || wa > L || wb > L) return true;
  const std::uintptr_t ab = b >= a ? (b - a) % L : (L - (a - b) % L) % L;  // (b - a) mod L
  return ab < wa || (L - ab) % L < wb;
}

void require_disjoint(const StridedBytes& t, const char* arg, const StridedBytes& other,
                      const char* other_arg, const char* why) {
  if (t.meets(other))
    throw InvalidArgument(arg, fmt::format("overlaps {}: [{}][{}] elements of {} bytes from {} "
                                           "and [{}][{}] from {} ({})",
                                           other_arg, t.rows, t.ld, t.elem_bytes, t.base,
                                           other.rows, other.ld, other.base, why));
}

void require_param(const Problem& p, const void* ptr, bool present, const char* arg,
                   const char* flag) {
  if (present)
    require_pointer(ptr, arg, storage_bytes(p.param_dtype),
                    [&] { return fmt::format("[{}] {}", p.N, name(p.param_dtype)); });
  else if (ptr)
    forbid(ptr, arg, fmt::format("the problem has {} = false", flag).c_str());
}

void validate_tensors(const Problem& p, const Tensors& t, std::int64_t rows, const void* workspace,
                      std::size_t workspace_bytes) {
  const auto al = static_cast<std::size_t>(p.effective_alignment());
  const std::size_t pe = storage_bytes(p.param_dtype);
  require_pointer(t.x, "x", al,
                  [&] { return fmt::format("x is [{}][{}] {}", p.M, p.lda_x(), name(p.dtype)); });
  require_pointer(t.w, "w", al,
                  [&] { return fmt::format("W is [{}][{}] {}", p.N, p.lda_w(), name(p.dtype)); });
  require_pointer(t.y, "y", al,
                  [&] { return fmt::format("y is [{}][{}] {}", p.M, p.lda_y(), name(p.dtype)); });
  if (t.saved)
    require_pointer(t.saved, "saved", al, [&] {
      return fmt::format("saved is laid out like y: [{}][{}] {}", p.M, p.lda_y(), name(p.dtype));
    });
  // The GEMM's CTAs of one row tile read its rows of x (and all of W) at different times while
  // others already store y: an output over an operand (y = x in place, say) would be read half
  // overwritten. The workspace holds partials, coefficients and split-K sums written during the
  // run.
  // Column slices of one buffer with one row stride ([x | y] rows) share no byte and pass.
  const std::int64_t m = rows > 0 ? rows : p.M;
  const std::size_t es = storage_bytes(p.dtype);
  const StridedBytes x{t.x, m, p.lda_x(), p.K, es}, w{t.w, p.N, p.lda_w(), p.K, es},
      y{t.y, m, p.lda_y(), p.N, es}, saved{t.saved, m, p.lda_y(), p.N, es};
  const char* reads = "the GEMM reads x and W while the run writes y and saved";
  const char* ws = "the run writes its workspace while it reads and writes the tensors";
  for (const auto& [out, arg] : {std::pair{y, "y"}, std::pair{saved, "saved"}}) {
    require_disjoint(out, arg, x, "x", reads);
    require_disjoint(out, arg, w, "w", reads);
    require_disjoint(out.base, out.span(), arg, workspace, workspace_bytes, "workspace", ws);
  }
  require_disjoint(saved, "saved", y, "y", "the two-pass apply reads y back while it writes saved");
  require_disjoint(t.x, x.span(), "x", workspace, workspace_bytes, "workspace", ws);
  require_disjoint(t.w, w.span(), "w", workspace, workspace_bytes, "workspace", ws);
  require_param(p, t.bias, p.has_bias, "bias", "has_bias");
  require_param(p, t.scale, p.has_scale, "scale", "has_scale");
  require_param(p, t.gamma, p.has_affine, "gamma", "has_affine");
  require_param(p, t.beta, p.has_affine, "beta", "has_affine");
  if (p.mode == Mode::eval) {
    require_pointer(t.running_mean, "running_mean", pe, "eval normalizes with the running stats");
    require_pointer(t.running_var, "running_var", pe, "eval normalizes with the running stats");
    forbid(t.save_mean, "save_mean", "eval mode computes no batch statistics");
    forbid(t.save_invstd, "save_invstd", "eval mode computes no batch statistics");
    forbid(t.num_batches_tracked, "num_batches_tracked", "eval mode does not count batches");
  } else {
    if ((t.running_mean == nullptr) != (t.running_var == nullptr))
      throw InvalidArgument(t.running_mean ? "running_var" : "running_mean",
                            "running_mean and running_var go together (both or neither)");
    if (t.running_mean) {
      require_pointer(t.running_mean, "running_mean", pe, "[N] running mean");
      require_pointer(t.running_var, "running_var", pe, "[N] running var");
    }
    if (!p.momentum)
      require_pointer(t.num_batches_tracked, "num_batches_tracked", 8,
                      "momentum=None (cumulative average) reads and bumps it");
    else if (t.num_batches_tracked)
      require_pointer(t.num_batches_tracked, "num_batches_tracked", 8, "int64 counter");
    if (t.save_mean) require_pointer(t.save_mean, "save_mean", 4, "[N] fp32");
    if (t.save_invstd) require_pointer(t.save_invstd, "save_invstd", 4, "[N] fp32");
  }
}

void validate_stream(CUcontext context, CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return;
  CUcontext owner = nullptr;
  if (const CUresult r = driver().cuStreamGetCtx(stream, &owner); r != CUDA_SUCCESS) {
    const char* n = nullptr;
    driver().cuGetErrorName(r, &n);
    throw InvalidArgument(
        "stream", fmt::format("not a usable stream: cuStreamGetCtx failed with {}", n ? n : "?"));
  }
  if (owner != context)
    throw InvalidArgument("stream",
                          "the stream belongs to another CUDA context than the plan's; "
                          "make the stream in the context the plan was made in");
}

void launch(const PlanCore& c, const RunShape& shape, CUstream stream, const Tensors& t,
            void* workspace, RunCache* cache, const StatsExchange* exchange) {
  const Driver& d = driver();
  // The launches go to the plan's context; the caller's current one is back when run returns.
  const ScopedContext in_plan(c.context, ScopedContext::Checked{});
  if (!cache || cache->checked_stream.load(std::memory_order_relaxed) != stream) {
    validate_stream(c.context, stream);
    if (cache) cache->checked_stream.store(stream, std::memory_order_relaxed);
  }
  fj::Params prm{};
  prm.x = t.x;
  prm.w = t.w;
  prm.bias = t.bias;
  set_batchnorm_params(prm, t);
  auto* ws = static_cast<char*>(workspace);
  prm.ws_partials = ws ? reinterpret_cast<float*>(ws + shape.workspace.partials_offset) : nullptr;
  prm.ws_coef = ws ? reinterpret_cast<float*>(ws + shape.workspace.coef_offset) : nullptr;
  prm.ws_splitk = ws ? reinterpret_cast<float*>(ws + shape.workspace.splitk_offset) : nullptr;
  unsigned char* ranks = shape.exchange
                             ? reinterpret_cast<unsigned char*>(ws + shape.workspace.ranks_offset)
                             : nullptr;
  prm.ws_ranks = ranks;
  prm.ws_rank_record =
      ranks ? ranks + static_cast<std::size_t>(exchange->rank()) * shape.workspace.rank_record_bytes
            : nullptr;
  prm.ws_padded = shape.pad_grid ? ws + shape.workspace.padded_offset : nullptr;
  prm.m = shape.rows;
  prm.eps = static_cast<float>(c.problem.eps);
  prm.momentum = static_cast<float>(c.problem.momentum.value_or(0.0));
  prm.grid_sync = shape.grid_sync ? 1 : 0;
  prm.ws_overlap =
      shape.overlap ? reinterpret_cast<unsigned*>(ws + shape.workspace.overlap_offset) : nullptr;
  prm.overlap = shape.overlap ? 1 : 0;
  prm.ws_xstats = shape.input_stats_grid
                      ? reinterpret_cast<float*>(ws + shape.workspace.xstats_offset)
                      : nullptr;
  void* args[] = {&prm};
  const auto threads = static_cast<unsigned>(c.config.threads());
  // Test-only (util/fault.hpp): the first launch failing, so nothing of this run is enqueued.
  if (fault::fire(Fault::kernel_launch))
    check(CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel(fj_gemm) [injected fault kernel_launch]");
  // pad_operands: the GEMM's x and W are the padded copies (W's rows first).
  Tensors gemm_tensors = t;
  if (shape.pad_grid) {
    check(d.cuLaunchKernel(c.pad_operands, shape.pad_grid, 1, 1, fj::kPadThreads, 1, 1, 0, stream,
                           args, nullptr),
          "cuLaunchKernel(fj_pad_operands)");
    gemm_tensors.w = prm.ws_padded;
    gemm_tensors.x = ws + shape.workspace.padded_x_offset;
  }
  // fj_gemm, or recompute's fj_gemm_affine: the same grid, x, W and y (tensor maps included).
  // `dependent_what` (non-null): a programmatic dependent launch (sm_90+), which the kernel
  // waits out itself; the string names the call in an error.
  auto gemm = [&](CUfunction f, int smem_bytes, const char* name,
                  const char* dependent_what = nullptr) {
    if (c.config.variant == Variant::warpspec) {
      launch_warpspec(c, shape, stream, prm, gemm_tensors, cache, f, smem_bytes, name, false,
                      dependent_what != nullptr);
      return;
    }
    if (dependent_what) {
      launch_dependent(c.device, f, shape.gemm_grid, shape.gemm_splits, threads,
                       static_cast<unsigned>(smem_bytes), stream, args, dependent_what);
      return;
    }
    const CUresult r = d.cuLaunchKernel(f, shape.gemm_grid, shape.gemm_splits, 1, threads, 1, 1,
                                        static_cast<unsigned>(smem_bytes), stream, args, nullptr);
    if (r != CUDA_SUCCESS) check(r, fmt::format("cuLaunchKernel({})", name).c_str());
  };
  bool finalize = shape.finalize, affine = shape.affine;
  CUfunction apply = shape.apply;
  unsigned apply_blocks = shape.apply_grid;
  if (shape.overlap) {
    if (!launch_warpspec(c, shape, stream, prm, gemm_tensors, cache, c.gemm, c.smem_bytes,
                         "fj_gemm", true)) {
      // Refused as too large for the device as it is now (a persistent grid of one CTA per SM
      // fits an idle H100): the two-pass schedule's passes, which give the same bits.
      prm.overlap = 0;
      gemm(c.gemm, c.smem_bytes, "fj_gemm");
      finalize = true;
      apply = c.apply;
      apply_blocks = apply_grid(c, shape.rows);
    }
  } else if (shape.grid_sync) {
    RunShape resident = shape;
    resident.gemm_grid = shape.resident_grid;
    if (!launch_warpspec(c, resident, stream, prm, gemm_tensors, cache, c.gemm, c.smem_bytes,
                         "fj_gemm", true)) {
      // The driver says the device cannot hold the grid at once, though the plan's occupancy
      // check said it could (never seen on the H100; a device partitioned or shared in ways
      // the occupancy query does not see could): recompute's schedule, which needs no
      // co-residency, gives the same bits.
      prm.grid_sync = 0;
      gemm(c.gemm, c.smem_bytes, "fj_gemm");
      finalize = affine = true;
    }
  } else if (shape.input_stats_grid) {
    // fj_input_stats records the statistics and the coefficients itself (its fallback for
    // columns it cannot trust included), and the affine GEMM below is its programmatic
    // dependent. A refused cooperative launch (a device shared or partitioned in ways the
    // occupancy query does not see) leaves recompute's run: statistics GEMM, finalize, affine.
    if (launch_input_stats(c, shape, stream, args))
      finalize = false;
    else
      gemm(c.gemm, c.smem_bytes, "fj_gemm");
  } else if (shape.gemm) {
    // A synchronized rank with no rows has nothing to multiply (a grid of 0 blocks would not
    // launch).
    gemm(c.gemm, c.smem_bytes, "fj_gemm");
  }
  // The split-K reduce and the BatchNorm passes go out as programmatic dependent launches on
  // sm_90+ (they wait for the previous kernel inside, see templates/common/grid_dependency.cuh).
  auto dependent = [&](CUfunction f, unsigned grid, unsigned block, const char* what,
                       int smem = 0) {
    launch_dependent(c.device, f, grid, 1, block, static_cast<unsigned>(smem), stream, args, what);
  };
  if (c.splitk_reduce && shape.gemm)
    dependent(c.splitk_reduce, shape.splitk_grid, c.splitk_reduce_shape.threads,
              "cuLaunchKernelEx(fj_splitk_reduce)", c.splitk_reduce_smem_bytes);
  if (shape.exchange) {
    dependent(c.rank_stats, c.finalize_shape.grid_x, c.finalize_shape.threads,
              "cuLaunchKernelEx(fj_rank_stats)");
    exchange->all_gather(ranks, shape.workspace.rank_record_bytes, stream);
    // After NCCL's kernel: an ordinary launch (it starts when the all-gather has finished).
    check(d.cuLaunchKernel(c.rank_finalize, c.rank_finalize_shape.grid_x, 1, 1,
                           c.rank_finalize_shape.threads, 1, 1, 0, stream, args, nullptr),
          "cuLaunchKernel(fj_rank_finalize)");
  }
  if (finalize)
    dependent(c.finalize, c.finalize_shape.grid_x, c.finalize_shape.threads,
              "cuLaunchKernelEx(fj_finalize)");
  // A programmatic dependent launch: fj_finalize lets it start at once, so its CTAs take the SMs
  // the finalize's few blocks leave idle and run their loads and mainloops there; they wait for
  // the finalize before their epilogues read its coefficients, and before one of them bumps the
  // counter, which the finalize reads.
  if (affine)
    gemm(c.gemm_affine, c.gemm_affine_smem_bytes, "fj_gemm_affine",
         "cuLaunchKernelEx(fj_gemm_affine)");
  if (apply) dependent(apply, apply_blocks, c.apply_shape.threads, "cuLaunchKernelEx(fj_apply)");
  if (shape.bump) dependent(c.bump, 1, 1, "cuLaunchKernelEx(fj_bump)");
}

}  // namespace fusejit
