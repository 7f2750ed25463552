#include "fusejit/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/comm/nccl_exchange.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/runtime/module.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fusejit {

bool autotune_from_env() {
  const char* v = std::getenv("FUSEJIT_AUTOTUNE");
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s == "1" || s == "true" || s == "on" || s == "yes";
}

struct Plan::RunState {
  Problem problem;
  WorkspaceLayout workspace;
  RunShape shape;  // for problem.M rows
  std::vector<std::string> kernel_names;
  bool cache_hit = false;
  double compile_seconds = 0;
  RunCache cache;
  std::optional<StatsExchange> exchange;  // problem.stat_ranks > 0: the caller's communicator
};

namespace {

// What every Plan of one (problem, options, context) shares: the dispatch's choice, the loaded
// kernel set and the run geometry. Made once and kept (bounded like the kernel sets), so a
// Plan whose kernels are already loaded costs a validation, a lookup and its own workspace.
struct PlanRecipe {
  std::shared_ptr<const PlanCore> core;
  std::shared_ptr<const ReferenceOp> reference;
  std::string dispatch;
  WorkspaceLayout workspace;
  RunShape shape;
  std::vector<std::string> kernel_names;
  bool built_core = false;  // making this recipe built the core (compile or disk load)
};

template <class T>
void append_bytes(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Every field of the problem and the options that can change the recipe, as bytes (no
// formatting: this is the hot path of planning). The tuning database may change under a
// running process (another process tunes): a dispatch that reads it is redone when the
// second changes, so a new tuning is seen within a second.
std::string recipe_key(const Problem& p, const PlanOptions& o, CUcontext ctx) {
  std::string key;
  key.reserve(160 + o.cache_dir.size());
  for (const std::int64_t v : {p.M, p.N, p.K, p.lda_x(), p.lda_w(), p.lda_y()})
    append_bytes(key, v);
  for (const int v :
       {static_cast<int>(p.dtype), static_cast<int>(p.param_dtype), static_cast<int>(p.mode),
        p.effective_alignment(), int(p.has_bias), int(p.has_scale), int(p.has_affine),
        int(p.momentum.has_value()), p.stat_ranks})
    append_bytes(key, v);
  append_bytes(key, p.eps);
  append_bytes(key, p.momentum.value_or(0.0));
  append_bytes(key, ctx);
  const bool reads_db = !o.config && !o.variant && o.use_tuning_db;
  const std::int64_t epoch = reads_db ? std::chrono::duration_cast<std::chrono::seconds>(
                                            std::chrono::steady_clock::now().time_since_epoch())
                                            .count()
                                      : 0;
  append_bytes(key, epoch);
  for (const int v : {o.variant ? static_cast<int>(*o.variant) : -1, int(o.autotune),
                      int(o.use_tuning_db), int(o.config.has_value())})
    append_bytes(key, v);
  if (o.config) {
    // Every field: a forced config that differs in one flag is another recipe (recompute, and
    // later input_stats, were missing here, so a forced .rc config could be served the plain
    // one's recipe, and a forced .rc one the .rc.cv one's). Not KernelConfig::key(): it leaves
    // out the fields a variant ignores, and a forced config that sets one of them must still get
    // why_invalid's refusal rather than its valid twin's recipe. The static_assert makes a new
    // field fail to compile until it is listed (a bool that fits the padding does not change the
    // size: grid_sync and input_stats did not; check the list by hand too).
    const KernelConfig& c = *o.config;
    static_assert(sizeof(KernelConfig) == 52,
                  "KernelConfig changed: list every field in recipe_key, then update the size");
    for (const int v :
         {static_cast<int>(c.variant), c.bm, c.bn, c.bk, c.warps_m, c.warps_n, c.stages, c.group_m,
          c.cluster_m, int(c.persistent), int(c.pingpong), int(c.tma_store), c.split_k,
          int(c.exact_m), int(c.recompute), int(c.pad_operands), int(c.grid_sync),
          int(c.overlap_apply), int(c.input_stats)})
      append_bytes(key, v);
  }
  key += o.cache_dir;
  return key;
}

std::shared_ptr<const PlanRecipe> make_recipe(const Problem& problem, const PlanOptions& options,
                                              CUcontext ctx) {
  auto r = std::make_shared<PlanRecipe>();
  // context_for made ctx current; the device is read once (its attributes are driver calls).
  const Device device = Device::current();
  KernelConfig config;
  bool reference = false;
  if (options.config) {
    // A caller's config is the caller's mistake when it cannot run: an InvalidArgument. The
    // dispatch's are checked below, as internal errors.
    if (auto why = options.config->why_invalid(problem, device); !why.empty())
      throw InvalidArgument("config", options.config->key() + ": " + why);
    config = *options.config;
    r->dispatch = "config";
  } else if (options.variant || !options.use_tuning_db) {
    config = default_config(problem, device, options.variant);
    r->dispatch = options.variant ? "variant" : "heuristic";
    // Without the database the dispatch's last step decides, the same rule as with it.
    reference = !options.variant && heuristic_prefers_reference(problem);
  } else {
    // Synchronized statistics are chosen (and tuned) through the same problem unsynchronized:
    // choose_kernel says how.
    const KernelChoice choice = choose_kernel(problem, device, options.cache_dir, options.autotune);
    FJ_CU(cuCtxSetCurrent(ctx));  // tuning may have worked in another context
    config = choice.config;
    reference = choice.reference;
    r->dispatch = std::string(name(choice.source));
  }
  // A dispatch choice that cannot run the problem would load a kernel set of another schedule
  // (as a recompute config chosen for a synchronized plan did: y left unwritten): fail the plan.
  if (auto why = options.config ? std::string() : config.why_invalid(problem, device); !why.empty())
    throw Error(fmt::format("internal: plan {} was given config {} ({}): {}", problem.key(),
                            config.key(), r->dispatch, why));
  r->core = plan_core(problem, config, ctx, options.cache_dir, &r->built_core);
  if (reference) {
    try {
      ReferenceOpOptions ro;
      ro.device = options.device;
      ro.cache_dir = options.cache_dir;
      ro.own_workspace = false;  // run() passes the plan's (or the caller's)
      r->reference = std::make_shared<const ReferenceOp>(problem, ro);
    } catch (const std::exception& e) {
      log()->warn("plan {}: the tuned cuBLASLt reference path is unavailable ({}); running {}",
                  problem.key(), e.what(), r->core->config.key());
    }
  }
  r->workspace = workspace_layout(problem, config);
  r->shape = run_shape(*r->core, problem.M, r->workspace);
  r->kernel_names = r->reference
                        ? r->reference->kernel_names()
                        : schedule(problem, config, problem.M, r->core->resident_tiles).kernels;
  return r;
}

}  // namespace

Plan::Plan(const Problem& problem, const PlanOptions& options) {
  problem.validate();
  if (problem.stat_ranks > 0 && !options.stats_comm)
    throw InvalidArgument("stats_comm",
                          fmt::format("problem.stat_ranks = {} synchronizes the statistics over "
                                      "an NCCL communicator of that many ranks; got null",
                                      problem.stat_ranks));
  if (problem.stat_ranks == 0 && options.stats_comm)
    throw InvalidArgument("stats_comm",
                          "expected null: problem.stat_ranks is 0 (statistics of this run's rows "
                          "alone); set it to the communicator's rank count to synchronize");
  if (options.cache_max_bytes) DiskCache::set_default_max_bytes(options.cache_max_bytes);
  if (options.max_kernel_sets) Module::set_max_loaded(options.max_kernel_sets);
  const CUcontext ctx = context_for(options.device);
  // Before anything is compiled: a communicator that does not fit fails the plan at once.
  std::optional<StatsExchange> exchange;
  if (problem.stat_ranks > 0) exchange.emplace(options.stats_comm, problem.stat_ranks);
  // The choice is made before the core cache is consulted and becomes part of its key, so a
  // tuning recorded since an earlier plan of the same problem takes effect (within a second,
  // see recipe_key).
  static SingleFlight<std::shared_ptr<const PlanRecipe>> recipes(
      SingleFlight<std::shared_ptr<const PlanRecipe>>::Keep::values);
  static std::atomic<std::size_t> capacity{0};
  // Recipes hold kernel sets (through their cores): bounded like them.
  if (const std::size_t want = Module::max_loaded(); capacity.exchange(want) != want)
    recipes.set_capacity(want);
  bool made = false;
  const auto recipe = recipes.get(recipe_key(problem, options, ctx), [&] {
    made = true;
    return make_recipe(problem, options, ctx);
  });
  core_ = recipe->core;
  reference_ = recipe->reference;
  dispatch_ = recipe->dispatch;
  state_ = std::make_unique<RunState>();
  state_->problem = problem;
  state_->workspace = recipe->workspace;
  state_->shape = recipe->shape;
  state_->kernel_names = recipe->kernel_names;
  state_->exchange = std::move(exchange);
  // This plan's own story: kernels another plan loaded (any M of the kernel set) cost nothing.
  const bool built = made && recipe->built_core;
  state_->cache_hit = !built || core_->cache_hit;
  state_->compile_seconds = built ? core_->compile_seconds : 0.0;
  if (const std::size_t bytes = workspace_size(); bytes && options.allocate_workspace) {
    FJ_CU(cuCtxSetCurrent(core_->context));
    FJ_CU(cuMemAlloc(&own_workspace_, bytes));
  }
}

Plan::~Plan() {
  if (own_workspace_ && driver_available()) driver().cuMemFree(own_workspace_);
}

Plan::Plan(Plan&& o) noexcept
    : core_(std::move(o.core_)),
      state_(std::move(o.state_)),
      own_workspace_(o.own_workspace_),
      reference_(std::move(o.reference_)),
      dispatch_(std::move(o.dispatch_)) {
  o.own_workspace_ = 0;
}

Plan& Plan::operator=(Plan&& o) noexcept {
  if (this != &o) {
    if (own_workspace_ && driver_available()) driver().cuMemFree(own_workspace_);
    core_ = std::move(o.core_);
    state_ = std::move(o.state_);
    own_workspace_ = o.own_workspace_;
    o.own_workspace_ = 0;
    reference_ = std::move(o.reference_);
    dispatch_ = std::move(o.dispatch_);
  }
  return *this;
}

const Problem& Plan::problem() const {
  return state_->problem;
}
const KernelConfig& Plan::config() const {
  return core_->config;
}
// A plan whose reference op runs M rows only runs fewer on its fused config: a workspace for both.
std::size_t Plan::workspace_size() const {
  if (!reference_) return state_->workspace.total;
  return reference_->runs_fewer_rows()
             ? reference_->workspace_size()
             : std::max(reference_->workspace_size(), state_->workspace.total);
}
std::vector<std::string> Plan::kernel_names() const {
  return state_->kernel_names;
}
const std::string& Plan::dispatch() const {
  return dispatch_;
}
bool Plan::uses_reference() const {
  return reference_ != nullptr;
}
bool Plan::cache_hit() const {
  return state_->cache_hit;
}
double Plan::compile_seconds() const {
  return state_->compile_seconds;
}

void Plan::validate(const Tensors& t) const {
  if (reference_) {
    reference_->validate(t);
    return;
  }
  validate_tensors(state_->problem, t, 0, reinterpret_cast<const void*>(own_workspace_),
                   state_->workspace.total);
}

void Plan::run(CUstream stream, const Tensors& t) const {
  run(stream, t, reinterpret_cast<void*>(own_workspace_), workspace_size());
}

void Plan::run(CUstream stream, const Tensors& t, void* workspace, std::size_t bytes) const {
  if (reference_) {
    reference_->run(stream, t, workspace, bytes);  // validates t and workspace as below
    return;
  }
  validate_tensors(state_->problem, t, 0, workspace, state_->workspace.total);
  validate_workspace(workspace, bytes, state_->workspace.total);
  launch(*core_, state_->shape, stream, t, workspace, &state_->cache,
         state_->exchange ? &*state_->exchange : nullptr);
}

void Plan::run(CUstream stream, const Tensors& t, std::int64_t rows) const {
  run(stream, t, rows, reinterpret_cast<void*>(own_workspace_), workspace_size());
}

void Plan::run(CUstream stream, const Tensors& t, std::int64_t rows, void* workspace,
               std::size_t bytes) const {
  const Problem& p = state_->problem;
  if (rows == p.M) {
    run(stream, t, workspace, bytes);
    return;
  }
  // Synchronized ranks may hold any share of the batch, none included.
  const std::int64_t least = p.stat_ranks > 0 ? 0 : p.mode == Mode::train ? 2 : 1;
  if (rows < least || rows > p.M)
    throw InvalidArgument(
        "rows",
        fmt::format(
            "expected {} <= rows <= M = {} (the plan's M{}); got {}", least, p.M,
            p.mode == Mode::train && least == 2 ? "; train mode needs two rows for a variance" : "",
            rows));
  if (reference_ && reference_->runs_fewer_rows()) {
    reference_->run(stream, t, rows, workspace, bytes);
    return;
  }
  if (core_->config.exact_m)
    throw InvalidArgument("rows", fmt::format("this plan's kernels were compiled for M = {} "
                                              "exactly (config {}); got {}",
                                              p.M, core_->config.key(), rows));
  // An empty rank's tensors span at most a row (validate_tensors reads 0 as M).
  validate_tensors(p, t, std::max<std::int64_t>(rows, 1), workspace, state_->workspace.total);
  validate_workspace(workspace, bytes, state_->workspace.total);
  launch(*core_, run_shape(*core_, rows, state_->workspace), stream, t, workspace, &state_->cache,
         state_->exchange ? &*state_->exchange : nullptr);
}

}  // namespace fusejit
