#include "fusejit/plan/plan_core.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

#include "common/column_stats.h"
#include "common/input_stats.h"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fusejit {

namespace {

// Codegen, compile (or load from the caches), load and size: everything a core needs once.
std::shared_ptr<const PlanCore> build_plan_core(const Problem& problem, const KernelConfig& config,
                                                CUcontext context, const std::string& cache_dir) {
  auto core = std::make_shared<PlanCore>();
  core->problem = problem;
  core->context = context;
  FJ_CU(cuCtxSetCurrent(core->context));
  core->device = Device::current();
  core->config = config;
  core->gemm_problem = config.pad_operands ? padded_operands_problem(problem) : problem;
  const KernelSource src = generate(problem, core->config);
  LoadedKernelSet loaded = load_kernel_set(src, core->device, cache_dir);
  core->module = std::move(loaded.module);
  core->cache_hit = loaded.cache_hit;
  core->compile_seconds = loaded.compile_seconds;
  auto dynamic_smem = [&](CUfunction f, const char* kernel, const char* symbol) {
    return set_dynamic_smem(*core->module, f, kernel, symbol, core->device, core->config.key());
  };
  core->gemm = core->module->function("fj_gemm");
  core->smem_bytes = dynamic_smem(core->gemm, "fj_gemm", "fj_smem_bytes");
  if (config.grid_sync) {
    int per_sm = 0;
    FJ_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, core->gemm, config.threads(),
                                                      static_cast<std::size_t>(core->smem_bytes)));
    core->resident_tiles = resident_tiles(config, per_sm, core->device.sm_count);
  }
  auto launch_shape = [&](const char* symbol) {
    const std::vector<int> v = core->module->read_ints(symbol, 3);
    return LaunchShape{static_cast<unsigned>(v[0]), static_cast<unsigned>(v[1]),
                       static_cast<unsigned>(v[2])};
  };
  for (const auto& k : src.kernels) {
    if (k == "fj_splitk_reduce") {
      core->splitk_reduce = core->module->function(k);
      core->splitk_reduce_shape = launch_shape("fj_splitk_reduce_launch");
      core->splitk_reduce_smem_bytes =
          dynamic_smem(core->splitk_reduce, "fj_splitk_reduce", "fj_splitk_reduce_smem_bytes");
    }
    if (k == "fj_finalize" || k == "fj_rank_stats") {
      (k == "fj_finalize" ? core->finalize : core->rank_stats) = core->module->function(k);
      core->finalize_shape = launch_shape("fj_finalize_launch");
    }
    if (k == "fj_rank_finalize") {
      core->rank_finalize = core->module->function(k);
      core->rank_finalize_shape = launch_shape("fj_rank_finalize_launch");
    }
    if (k == "fj_apply" || k == "fj_apply_fold") {
      (k == "fj_apply" ? core->apply : core->apply_fold) = core->module->function(k);
      core->apply_shape = launch_shape("fj_apply_launch");
    }
    if (k == "fj_bump") core->bump = core->module->function(k);
    if (k == "fj_input_stats") {
      core->input_stats = core->module->function(k);
      int per_sm = 0;
      FJ_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, core->input_stats,
                                                        fj::kInputStatsThreads, 0));
      if (per_sm < 1)
        throw Error(fmt::format("fj_input_stats of {} cannot run on {}: no block fits an SM",
                                config.key(), core->device.name));
      // As many CTAs as fit (one per SM at the kernel's launch bounds: each warp holds its
      // accumulators, a slab's fragments and the next slab's loads), at most two per SM.
      core->input_stats_ctas = static_cast<unsigned>(
          std::min(fj::kInputStatsMaxCtas, std::min(per_sm, 2) * core->device.sm_count));
    }
    if (k == "fj_pad_operands") core->pad_operands = core->module->function(k);
    if (k == "fj_gemm_affine") {
      core->gemm_affine = core->module->function(k);
      core->gemm_affine_smem_bytes =
          dynamic_smem(core->gemm_affine, "fj_gemm_affine", "fj_gemm_affine_smem_bytes");
    }
  }
  log()->info("plan {} -> {} ({}, {:.3f} s compile)", src.name, core->config.key(),
              core->cache_hit ? "cached" : "compiled", core->compile_seconds);
  return core;
}

}  // namespace

LoadedKernelSet load_kernel_set(const KernelSource& src, const Device& device,
                                const std::string& cache_dir) {
  LoadedKernelSet out;
  const std::string arch = device.arch();
  const std::string key = cache_key(src, arch, nvrtc_version());
  out.module = Module::find(key);
  if (out.module) {
    out.cache_hit = true;
    return out;
  }
  const CompiledKernel compiled = compile_cached(src, arch, cache_dir);
  out.cache_hit = compiled.cache_hit;
  out.compile_seconds = compiled.compile_seconds;
  out.module = Module::get(key, compiled, src.kernels);
  return out;
}

int set_dynamic_smem(const Module& module, CUfunction f, const char* kernel, const char* symbol,
                     const Device& device, const std::string& config_key) {
  const int bytes = module.read_int(symbol);
  if (bytes > device.smem_per_block_optin)
    throw InvalidArgument(
        "config", fmt::format("{} needs {} bytes of shared memory in {}; {} "
                              "allows {}",
                              config_key, bytes, kernel, device.name, device.smem_per_block_optin));
  FJ_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
  return bytes;
}

WorkspaceLayout workspace_layout(const Problem& p, const KernelConfig& c) {
  WorkspaceLayout w;
  // Regions follow each other, each starting 256-byte aligned; an empty one takes no room.
  auto region = [&w](std::size_t bytes, std::size_t& offset, std::size_t& size) {
    offset = w.total;
    size = bytes;
    w.total = align_workspace(w.total + bytes);
  };
  const bool single_pass = single_pass_class(p, c);
  const auto row_tiles = static_cast<std::size_t>((p.M + c.bm - 1) / c.bm);
  const auto col_tiles = static_cast<std::size_t>((p.N + c.bn - 1) / c.bn);
  const auto n = static_cast<std::size_t>(p.N);
  const bool two_pass = p.mode == Mode::train && !single_pass;
  region(two_pass ? row_tiles * n * 8 : 0, w.partials_offset, w.partials_bytes);
  // {A, B, mean_a, unused} per column (fj::Params::ws_coef).
  region(two_pass ? n * 16 : 0, w.coef_offset, w.coef_bytes);
  const bool split_k = c.variant == Variant::tiled && c.split_k > 1;
  const std::size_t slices = split_k ? static_cast<std::size_t>(c.split_k) : 0;
  region(slices * row_tiles * col_tiles * static_cast<std::size_t>(c.bm) *
             static_cast<std::size_t>(c.bn) * 4,
         w.splitk_offset, w.splitk_bytes);
  w.rank_record_bytes = p.stat_ranks > 0 ? static_cast<std::size_t>(fj::rank_record_bytes(p.N)) : 0;
  region(w.rank_record_bytes * static_cast<std::size_t>(p.stat_ranks), w.ranks_offset,
         w.ranks_bytes);
  const std::size_t padded_row_bytes =
      c.pad_operands ? static_cast<std::size_t>(padded_row_elements(p)) * storage_bytes(p.dtype)
                     : 0;
  region(static_cast<std::size_t>(p.N + p.M) * padded_row_bytes, w.padded_offset, w.padded_bytes);
  w.padded_x_offset = w.padded_offset + static_cast<std::size_t>(p.N) * padded_row_bytes;
  // OverlapCounters (kernels/overlap_apply.cuh): per column tile its counted row tiles and its
  // merged strips, and two words.
  region(c.overlap_apply && two_pass ? (2 * col_tiles + 2) * 4 : 0, w.overlap_offset,
         w.overlap_bytes);
  const bool xstats = c.input_stats && two_pass && p.K <= fj::kInputStatsMaxK;
  region(xstats
             ? static_cast<std::size_t>(
                   fj::input_stats_layout(p.N, fj::input_stats_kp(static_cast<int>(p.K))).total) *
                   4
             : 0,
         w.xstats_offset, w.xstats_bytes);
  return w;
}

std::shared_ptr<const PlanCore> plan_core(const Problem& problem, const KernelConfig& config,
                                          CUcontext context, const std::string& cache_dir,
                                          bool* built) {
  // One build per key: concurrent callers wait for the first; built cores are kept for the
  // process, a failed build is retried by the next caller.
  static SingleFlight<std::shared_ptr<const PlanCore>> cores(
      SingleFlight<std::shared_ptr<const PlanCore>>::Keep::values);
  // Every M of a kernel set maps to one core (kernel_set_problem_key and the class).
  const std::string key = fmt::format("{}|{}|{}|{}|{}", kernel_set_problem_key(problem, config),
                                      int(single_pass_class(problem, config)),
                                      static_cast<const void*>(context), config.key(), cache_dir);
  // The cores hold their modules: they are bounded like the module registry.
  static std::atomic<std::size_t> capacity{0};
  if (const std::size_t want = Module::max_loaded(); capacity.exchange(want) != want)
    cores.set_capacity(want);
  return cores.get(
      key, [&] { return build_plan_core(problem, config, context, cache_dir); }, built);
}

}  // namespace fusejit
