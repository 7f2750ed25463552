#include "fusejit/plan/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fusejit {

namespace {

std::string core_key(const Problem& p, CUcontext ctx, const PlanOptions& o) {
  return fmt::format("{}|{}|{}|{}|{}", p.key(), static_cast<const void*>(ctx),
                     o.variant ? name(*o.variant) : "auto", o.config ? o.config->key() : "-",
                     o.cache_dir);
}

}  // namespace

bool autotune_from_env() {
  const char* v = std::getenv("FUSEJIT_AUTOTUNE");
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s == "1" || s == "true" || s == "on" || s == "yes";
}

WorkspaceLayout workspace_layout(const Problem& p, const KernelConfig& c) {
  WorkspaceLayout w;
  // Regions follow each other, each starting 256-byte aligned; an empty one takes no room.
  auto region = [&w](std::size_t bytes, std::size_t& offset, std::size_t& size) {
    offset = w.total;
    size = bytes;
    w.total = align_workspace(w.total + bytes);
  };
  const KernelSchedule sched = schedule(p, c);
  const auto row_tiles = static_cast<std::size_t>((p.M + c.bm - 1) / c.bm);
  const auto col_tiles = static_cast<std::size_t>((p.N + c.bn - 1) / c.bn);
  const auto n = static_cast<std::size_t>(p.N);
  const bool two_pass = p.mode == Mode::train && !sched.single_pass;
  region(two_pass ? row_tiles * n * 8 : 0, w.partials_offset, w.partials_bytes);
  region(two_pass ? n * 8 : 0, w.coef_offset, w.coef_bytes);
  const std::size_t slices = sched.split_k ? static_cast<std::size_t>(c.split_k) : 0;
  region(slices * row_tiles * col_tiles * static_cast<std::size_t>(c.bm) *
             static_cast<std::size_t>(c.bn) * 4,
         w.splitk_offset, w.splitk_bytes);
  return w;
}

std::shared_ptr<const PlanCore> make_plan_core(const Problem& problem, const PlanOptions& o) {
  problem.validate();
  auto core = std::make_shared<PlanCore>();
  core->problem = problem;
  core->context = context_for(o.device);
  FJ_CU(cuCtxSetCurrent(core->context));
  core->device = Device::current();
  if (o.config) {
    if (auto why = o.config->why_invalid(problem, core->device); !why.empty())
      throw InvalidArgument("config", o.config->key() + ": " + why);
    core->config = *o.config;
  } else {
    core->config = default_config(problem, core->device, o.variant);
  }
  core->schedule = schedule(problem, core->config);
  core->workspace = workspace_layout(problem, core->config);
  const KernelSource src = generate(problem, core->config);
  const std::string arch = core->device.arch();
  const std::string key = cache_key(src, arch, nvrtc_version());
  core->module = Module::find(key);
  if (!core->module) {
    const CompiledKernel compiled = compile_cached(src, arch, o.cache_dir);
    core->cache_hit = compiled.cache_hit;
    core->compile_seconds = compiled.compile_seconds;
    core->module = Module::get(key, compiled, src.kernels);
  } else {
    core->cache_hit = true;
  }
  // A kernel's dynamic shared memory, as the module says, checked against the device and set
  // as the function's limit (above 48 KiB it must be raised before launching).
  auto dynamic_smem = [&](CUfunction f, const char* kernel, const char* symbol) {
    const int bytes = core->module->read_int(symbol);
    if (bytes > core->device.smem_per_block_optin)
      throw InvalidArgument(
          "config",
          fmt::format("{} needs {} bytes of shared memory in {}; {} allows {}", core->config.key(),
                      bytes, kernel, core->device.name, core->device.smem_per_block_optin));
    FJ_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
    return bytes;
  };
  core->gemm = core->module->function("fj_gemm");
  core->smem_bytes = dynamic_smem(core->gemm, "fj_gemm", "fj_smem_bytes");
  auto launch_shape = [&](const char* symbol) {
    const std::vector<int> v = core->module->read_ints(symbol, 3);
    return LaunchShape{static_cast<unsigned>(v[0]), static_cast<unsigned>(v[1]),
                       static_cast<unsigned>(v[2])};
  };
  for (const auto& k : core->schedule.kernels) {
    if (k == "fj_splitk_reduce") {
      core->splitk_reduce = core->module->function(k);
      core->splitk_reduce_shape = launch_shape("fj_splitk_reduce_launch");
      core->splitk_reduce_smem_bytes =
          dynamic_smem(core->splitk_reduce, "fj_splitk_reduce", "fj_splitk_reduce_smem_bytes");
    }
    if (k == "fj_finalize") {
      core->finalize = core->module->function(k);
      core->finalize_shape = launch_shape("fj_finalize_launch");
    }
    if (k == "fj_apply") {
      core->apply = core->module->function(k);
      core->apply_shape = launch_shape("fj_apply_launch");
    }
    if (k == "fj_bump") core->bump = core->module->function(k);
  }
  size_launches(*core);
  log()->info("plan {} -> {} ({}, {:.3f} s compile)", problem.key(), core->config.key(),
              core->cache_hit ? "cached" : "compiled", core->compile_seconds);
  return core;
}

Plan::Plan(const Problem& problem, const PlanOptions& options) {
  // One build per key: concurrent callers of the same plan wait for the first; built cores are
  // kept for the process, a failed build is retried by the next plan.
  static SingleFlight<std::shared_ptr<const PlanCore>> cores(
      SingleFlight<std::shared_ptr<const PlanCore>>::Keep::values);
  problem.validate();
  const CUcontext ctx = context_for(options.device);
  // The choice is made before the core cache is consulted and becomes part of its key, so a
  // tuning recorded since an earlier plan of the same problem takes effect.
  PlanOptions o = options;
  bool reference = false;
  if (!o.config && !o.variant && o.use_tuning_db) {
    const KernelChoice choice = choose_kernel(problem, Device::current(), o.cache_dir, o.autotune);
    FJ_CU(cuCtxSetCurrent(ctx));
    o.config = choice.config;
    reference = choice.reference;
    dispatch_ = name(choice.source);
  } else {
    dispatch_ = o.config ? "config" : o.variant ? "variant" : "heuristic";
    // Without the database the dispatch's last step decides, the same rule as with it.
    reference = !o.config && !o.variant && heuristic_prefers_reference(problem);
  }
  core_ = cores.get(core_key(problem, ctx, o), [&] { return make_plan_core(problem, o); });
  if (reference) {
    try {
      ReferenceOpOptions ro;
      ro.device = options.device;
      ro.cache_dir = options.cache_dir;
      ro.own_workspace = false;  // run() passes the plan's (or the caller's)
      reference_ = std::make_shared<const ReferenceOp>(problem, ro);
    } catch (const std::exception& e) {
      log()->warn("plan {}: the tuned cuBLASLt reference path is unavailable ({}); running {}",
                  problem.key(), e.what(), core_->config.key());
    }
  }
  if (const std::size_t bytes = workspace_size()) {
    FJ_CU(cuCtxSetCurrent(core_->context));
    FJ_CU(cuMemAlloc(&own_workspace_, bytes));
  }
}

Plan::~Plan() {
  if (own_workspace_ && driver_available()) driver().cuMemFree(own_workspace_);
}

Plan::Plan(Plan&& o) noexcept
    : core_(std::move(o.core_)),
      own_workspace_(o.own_workspace_),
      reference_(std::move(o.reference_)),
      dispatch_(std::move(o.dispatch_)) {
  o.own_workspace_ = 0;
}

Plan& Plan::operator=(Plan&& o) noexcept {
  if (this != &o) {
    if (own_workspace_ && driver_available()) driver().cuMemFree(own_workspace_);
    core_ = std::move(o.core_);
    own_workspace_ = o.own_workspace_;
    o.own_workspace_ = 0;
    reference_ = std::move(o.reference_);
    dispatch_ = std::move(o.dispatch_);
  }
  return *this;
}

const Problem& Plan::problem() const {
  return core_->problem;
}
const KernelConfig& Plan::config() const {
  return core_->config;
}
std::size_t Plan::workspace_size() const {
  return reference_ ? reference_->workspace_size() : core_->workspace.total;
}
std::vector<std::string> Plan::kernel_names() const {
  return reference_ ? reference_->kernel_names() : core_->schedule.kernels;
}
const std::string& Plan::dispatch() const {
  return dispatch_;
}
bool Plan::uses_reference() const {
  return reference_ != nullptr;
}
bool Plan::cache_hit() const {
  return core_->cache_hit;
}
double Plan::compile_seconds() const {
  return core_->compile_seconds;
}

void Plan::validate(const Tensors& t) const {
  validate_tensors(core_->problem, t);
}

void Plan::run(CUstream stream, const Tensors& t) const {
  run(stream, t, reinterpret_cast<void*>(own_workspace_), workspace_size());
}

void Plan::run(CUstream stream, const Tensors& t, void* workspace, std::size_t bytes) const {
  if (reference_) {
    reference_->run(stream, t, workspace, bytes);  // validates t and workspace as below
    return;
  }
  validate_tensors(core_->problem, t);
  validate_workspace(workspace, bytes, core_->workspace.total);
  launch(*core_, stream, t, workspace);
}

}  // namespace fusejit
