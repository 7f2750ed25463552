#include <fmt/format.h>

#include <atomic>
#include <tuple>
#include <utility>

#include "fusejit/backward.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/util/log.hpp"

namespace fusejit {

struct BackwardPlan::RunState {
  BackwardRunCache cache;
  BackwardLt lt;                    // the GEMMs the config runs on cuBLASLt, if any
  std::size_t workspace_bytes = 0;  // for the plan's M, computed once (run checks it every call)
  // This plan's own: false only where making it compiled or loaded the kernel set.
  bool cache_hit = false;
};

BackwardPlan::BackwardPlan(const Problem& problem, const BackwardOptions& options)
    : state_(std::make_unique<RunState>()), problem_(problem), accumulate_(options.accumulate) {
  validate_backward_problem(problem);
  const CUcontext ctx = context_for(options.device);
  const Device device = Device::current();
  // Both tiles forced: the database is not read (nor a damaged one moved aside) for a choice
  // nothing would use. One forced: the other GEMM's tiles still come from the dispatch.
  for (const auto& [lt, tiles, arg] :
       {std::tuple{options.dx_cublaslt, options.dx_config.has_value(), "dx_cublaslt"},
        std::tuple{options.dw_cublaslt, options.dw_config.has_value(), "dw_cublaslt"}})
    if (lt && tiles)
      throw InvalidArgument(arg, fmt::format("a GEMM runs on cuBLASLt or on forced tiles, not "
                                             "both; {} and {} are set",
                                             arg, arg[1] == 'x' ? "dx_config" : "dw_config"));
  const bool forced_dx = options.dx_config || options.dx_cublaslt,
             forced_dw = options.dw_config || options.dw_cublaslt;
  BackwardConfig config;
  // Whether dX is a choice made for the M class (the heuristic's, or a tuning entry's for another
  // M of the class), which plan_backward_config may move to cuBLASLt at this plan's own M. An
  // entry tuned at this M timed its dX here.
  bool dx_of_class = false;
  if (forced_dx && forced_dw) {
    dispatch_ = "config";
  } else {
    const BackwardChoice choice = choose_backward(problem, device, options.cache_dir);
    config = choice.config;
    dispatch_ = forced_dx || forced_dw ? "config" : std::string(name(choice.source));
    dx_of_class = !forced_dx && choice.source != KernelChoice::Source::exact;
  }
  // Judged as the heuristic and the tuning entries are: at the M class's representative M.
  if (options.dx_config) {
    require_grad_gemm_config(problem, *options.dx_config, false, device, "dx_config");
    config.dx = *options.dx_config;
    config.dx_cublaslt = false;
  }
  if (options.dw_config) {
    require_grad_gemm_config(problem, *options.dw_config, true, device, "dw_config");
    config.dw = *options.dw_config;
    config.dw_cublaslt = false;
  }
  if (options.dx_cublaslt) config.dx = {}, config.dx_cublaslt = true;
  if (options.dw_cublaslt) config.dw = {}, config.dw_cublaslt = true;
  try {
    state_->lt = make_backward_lt(problem, config);
  } catch (const CudaError& e) {
    // cuBLASLt declined a GEMM the dispatch chose for it (no algorithm for these strides):
    // fusejit's own tiles run every layer. A GEMM forced onto cuBLASLt fails as asked.
    const std::optional<BackwardConfig> fallback =
        lt_declined_fallback(config, default_backward_tiles(problem, device), forced_dx, forced_dw);
    if (!fallback) throw;
    log()->warn("backward plan {}: {} ({}); running {}", problem.key(), config.key(), e.what(),
                fallback->key());
    // A dX this took off cuBLASLt (declined, or beside a declined dW: the refusal does not say
    // which) is not asked about again by the move below.
    if (config.dx_cublaslt) dx_of_class = false;
    config = *fallback;
    state_->lt = make_backward_lt(problem, config);  // a forced cuBLASLt GEMM may still decline
    if (!forced_dx && !forced_dw) dispatch_ = "heuristic";
  }
  // The class's dX at this plan's own M, on the class's kernel set; where cuBLASLt declines it,
  // the class's choice stands.
  const BackwardConfig run = dx_of_class ? plan_backward_config(problem, config, device) : config;
  bool dx_moved = false;
  if (run.dx_cublaslt != config.dx_cublaslt) {
    try {
      state_->lt = make_backward_lt(problem, run);
      dx_moved = true;
    } catch (const CudaError& e) {
      log()->warn("backward plan {}: {} ({}); running {}", problem.key(), run.key(), e.what(),
                  config.key());
    }
  }
  bool built = false;
  core_ = backward_core(problem, config, ctx, options.cache_dir, &built);
  if (dx_moved) core_ = with_dx_on_cublaslt(*core_, run);
  // This plan's own story, as Plan's: kernels another plan loaded cost it nothing.
  state_->cache_hit = !built || core_->cache_hit;
  state_->workspace_bytes =
      backward_workspace(problem, core_->config, problem.M, state_->lt.workspace).total;
  if (const std::size_t bytes = workspace_size(); bytes && options.allocate_workspace) {
    FJ_CU(cuCtxSetCurrent(core_->context));
    FJ_CU(cuMemAlloc(&own_workspace_, bytes));
  }
}

BackwardPlan::~BackwardPlan() {
  if (own_workspace_ && driver_available()) driver().cuMemFree(own_workspace_);
}

BackwardPlan::BackwardPlan(BackwardPlan&& o) noexcept
    : core_(std::move(o.core_)),
      state_(std::move(o.state_)),
      problem_(o.problem_),
      accumulate_(o.accumulate_),
      own_workspace_(o.own_workspace_),
      dispatch_(std::move(o.dispatch_)) {
  o.own_workspace_ = 0;
}

BackwardPlan& BackwardPlan::operator=(BackwardPlan&& o) noexcept {
  if (this != &o) {
    if (own_workspace_ && driver_available()) driver().cuMemFree(own_workspace_);
    core_ = std::move(o.core_);
    state_ = std::move(o.state_);
    problem_ = o.problem_;
    accumulate_ = o.accumulate_;
    own_workspace_ = o.own_workspace_;
    dispatch_ = std::move(o.dispatch_);
    o.own_workspace_ = 0;
  }
  return *this;
}

const Problem& BackwardPlan::problem() const {
  return problem_;
}
std::size_t BackwardPlan::workspace_size() const {
  return state_->workspace_bytes;
}
std::string BackwardPlan::config_key() const {
  return core_->config.key();
}
std::vector<std::string> BackwardPlan::kernel_names() const {
  std::vector<std::string> names = core_->kernel_names;
  if (core_->config.dx_cublaslt) names.push_back("cublasLtMatmul (dx)");
  if (core_->config.dw_cublaslt) names.push_back("cublasLtMatmul (dw)");
  return names;
}
bool BackwardPlan::cache_hit() const {
  return state_->cache_hit;
}
const std::string& BackwardPlan::dispatch() const {
  return dispatch_;
}

void BackwardPlan::validate(const BackwardTensors& t) const {
  validate_backward_tensors(problem_, t, 0, reinterpret_cast<const void*>(own_workspace_),
                            workspace_size());
}

void BackwardPlan::run(CUstream stream, const BackwardTensors& t) const {
  run(stream, t, problem_.M);
}

void BackwardPlan::run(CUstream stream, const BackwardTensors& t, std::int64_t rows) const {
  run(stream, t, rows, reinterpret_cast<void*>(own_workspace_), workspace_size());
}

void BackwardPlan::run(CUstream stream, const BackwardTensors& t, std::int64_t rows,
                       void* workspace, std::size_t bytes) const {
  const std::int64_t least = problem_.mode == Mode::train ? 2 : 1;
  if (rows < least || rows > problem_.M)
    throw InvalidArgument(
        "rows", fmt::format("expected {} <= rows <= M = {}; got {}", least, problem_.M, rows));
  validate_workspace(workspace, bytes, workspace_size());
  validate_backward_tensors(problem_, t, rows, workspace, workspace_size());
  launch_backward(*core_, rows, accumulate_, stream, t, workspace, &state_->cache, &state_->lt);
}

}  // namespace fusejit
