#include "fusejit/plan/backward_core.hpp"

#include <fmt/format.h>

#include <atomic>

#include "common/backward_params.h"
#include "common/backward_shape.h"
#include "common/gemm_params.h"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fusejit {

namespace {

// The heuristic's first tiled config without split-K (the gradient GEMMs have none). tf32 reads
// its MN-major operands with one 4-byte copy per element, which needs the registers of eight
// warps: four-warp tiles spill (measured on the compiled kernels), so tf32 takes 256 threads.
KernelConfig gemm_config(const Problem& g, const Device& d) {
  for (const KernelConfig& c : candidate_configs(g, d))
    if (c.variant == Variant::tiled && c.split_k == 1 && !c.exact_m &&
        (g.dtype != DType::tf32 || c.threads() >= 256))
      return c;
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
  core->dx = fn("fj_bwd_dx");
  core->dw = fn("fj_bwd_dw");
  core->strips = m.read_int("fj_bwd_strips");
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
  core->dx_smem_bytes = dynamic_smem(core->dx, "fj_bwd_dx", "fj_bwd_dx_smem_bytes");
  core->dw_smem_bytes = dynamic_smem(core->dw, "fj_bwd_dw", "fj_bwd_dw_smem_bytes");
  core->kernel_names = src.kernels;
  log()->info("backward plan {} ({}, {:.3f} s compile)", src.name,
              core->cache_hit ? "cached" : "compiled", core->compile_seconds);
  return core;
}

}  // namespace

BackwardConfig default_backward_config(const Problem& p, const Device& d) {
  // dx's rows and dW's reduction are M: rank the tiles at the M class's representative, as the
  // forward's dispatch does (config/candidates.hpp), so every M of a class shares the kernel set.
  const std::int64_t m = m_class(p.M).representative();
  Problem dx = dx_gemm_problem(p), dw = dw_gemm_problem(p);
  dx.M = m;
  dw.K = m;
  return {gemm_config(dx, d), gemm_config(dw, d)};
}

std::shared_ptr<const BackwardCore> backward_core(const Problem& problem,
                                                  const BackwardConfig& config, CUcontext context,
                                                  const std::string& cache_dir) {
  static SingleFlight<std::shared_ptr<const BackwardCore>> cores(
      SingleFlight<std::shared_ptr<const BackwardCore>>::Keep::values);
  static std::atomic<std::size_t> capacity{0};
  if (const std::size_t want = Module::max_loaded(); capacity.exchange(want) != want)
    cores.set_capacity(want);
  Problem keyed = problem;
  keyed.M = 1;  // every M of a layer shares one kernel set
  const std::string key = fmt::format("{}|{}|{}|{}", keyed.key(), config.key(),
                                      static_cast<const void*>(context), cache_dir);
  return cores.get(key, [&] { return build_backward_core(problem, config, context, cache_dir); });
}

BackwardWorkspace backward_workspace(const Problem& p, std::int64_t rows) {
  BackwardWorkspace w;
  auto region = [&w](std::size_t bytes, std::size_t& offset) {
    offset = w.total;
    w.total = align_workspace(w.total + bytes);
  };
  const auto slabs = static_cast<std::size_t>(fj::backward_slab_bound(rows));
  const auto n = static_cast<std::size_t>(p.N);
  region(slabs * n * 8, w.dy_partials_offset);
  region(slabs * n * 8, w.dz_partials_offset);
  region(p.mode == Mode::train ? n * 16 : 0, w.coef_offset);
  region(static_cast<std::size_t>(rows) * n * storage_bytes(p.dtype), w.da_offset);
  return w;
}

void validate_backward_tensors(const Problem& p, const BackwardTensors& t) {
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
  auto param = [&](const void* ptr, bool present, const char* arg, const char* flag) {
    if (present)
      require_pointer(ptr, arg, pe,
                      [&] { return fmt::format("[{}] {}", p.N, name(p.param_dtype)); });
    else
      forbid(ptr, arg, fmt::format("the problem has {} = false", flag).c_str());
  };
  param(t.scale, p.has_scale, "scale", "has_scale");
  param(t.gamma, p.has_affine, "gamma", "has_affine");
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
}

void launch_backward(const BackwardCore& c, std::int64_t rows, bool accumulate, CUstream stream,
                     const BackwardTensors& t, void* workspace,
                     std::atomic<CUstream>* checked_stream) {
  const Driver& d = driver();
  CUcontext current = nullptr;
  check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != c.context) check(d.cuCtxSetCurrent(c.context), "cuCtxSetCurrent");
  if (!checked_stream || checked_stream->load(std::memory_order_relaxed) != stream) {
    validate_stream(c.context, stream);
    if (checked_stream) checked_stream->store(stream, std::memory_order_relaxed);
  }
  const Problem& p = c.problem;
  const fj::BackwardSlabs slabs = fj::backward_slabs(rows);
  const BackwardWorkspace w = backward_workspace(p, rows);
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
  bp.ws_dz_partials = reinterpret_cast<float*>(ws + w.dz_partials_offset);
  bp.ws_coef = p.mode == Mode::train ? reinterpret_cast<float*>(ws + w.coef_offset) : nullptr;
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
  auto go = [&](CUfunction f, unsigned grid, unsigned threads, unsigned smem, void** args,
                const char* what) {
    check(d.cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, stream, args, nullptr), what);
  };
  go(c.reduce, elementwise_grid, fj::kBackwardThreads, 0, bargs, "cuLaunchKernel(fj_bwd_reduce)");
  if (p.mode == Mode::train) {
    go(c.coef, columns_grid, fj::kBackwardColumnThreads, 0, bargs, "cuLaunchKernel(fj_bwd_coef)");
    go(c.da, elementwise_grid, fj::kBackwardThreads, 0, bargs, "cuLaunchKernel(fj_bwd_da)");
  }
  go(c.params, columns_grid, fj::kBackwardColumnThreads, 0, bargs, "cuLaunchKernel(fj_bwd_params)");
  auto tiles = [](std::int64_t r, std::int64_t cols, const KernelConfig& k) {
    return static_cast<unsigned>(((r + k.bm - 1) / k.bm) * ((cols + k.bn - 1) / k.bn));
  };
  if (t.dx) {
    fj::GemmParams g{};
    g.a = bp.ws_da;
    g.b = t.w;
    g.c = t.dx;
    g.m = bp.m;
    g.accumulate = 0;
    void* args[] = {&g};
    go(c.dx, tiles(rows, p.K, c.config.dx), static_cast<unsigned>(c.config.dx.threads()),
       static_cast<unsigned>(c.dx_smem_bytes), args, "cuLaunchKernel(fj_bwd_dx)");
  }
  if (t.dw) {
    fj::GemmParams g{};
    g.a = bp.ws_da;
    g.b = t.x;
    g.c = t.dw;
    g.m = bp.m;
    g.accumulate = accumulate ? 1 : 0;
    void* args[] = {&g};
    go(c.dw, tiles(p.N, p.K, c.config.dw), static_cast<unsigned>(c.config.dw.threads()),
       static_cast<unsigned>(c.dw_smem_bytes), args, "cuLaunchKernel(fj_bwd_dw)");
  }
}

}  // namespace fusejit
