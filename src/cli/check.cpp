// fusejit check: the regression sweep against the float64 reference (see check/sweep.hpp for
// the cases and the sweep-file syntax). Prints one line per failing case and a summary; exits 1
// when any case failed.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/problem_options.hpp"
#include "cli/verbs.hpp"
#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "tools/backward_check.hpp"
#include "tools/sweep.hpp"

namespace fusejit::cli {

namespace {

struct CheckArgs {
  std::string sweep = "quick";
  std::string dtypes = "fp32,tf32,fp16,bf16";
  std::string modes = "train,eval";
  std::string variant = "auto";
  std::string config;  // a KernelConfig key: forces that config; cases it cannot run are skipped
  std::string op = "fused";
  std::string seed;
  std::string cache_dir;
  int device = 0;
  unsigned build_threads = 0;
  bool verbose = false;
  bool list = false;
  bool backward = false;
  std::string backward_config;  // "dx.<key>.dw.<key>": forced; cases it cannot run are skipped
};

std::uint64_t parse_seed(const std::string& s) {
  std::size_t used = 0;
  std::uint64_t v = 0;
  try {
    v = std::stoull(s, &used, 0);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size())
    throw InvalidArgument("seed",
                          "expected an unsigned integer (decimal or 0x hex); got '" + s + "'");
  return v;
}

std::string figure(double v) {
  return std::isinf(v) ? std::string("inf") : fmt::format("{:.2e}", v);
}

// --backward: each case's forward (saving) and backward against the float64 gradients.
int run_backward_check(const CheckArgs& a, const std::vector<DType>& dtypes,
                       const std::vector<Mode>& modes) {
  if (a.op != "fused" || a.variant != "auto" || !a.config.empty())
    throw InvalidArgument("backward",
                          "--backward checks the fused backward; it takes no --op, "
                          "--variant or --config");
  std::vector<std::string> lines;
  if (a.sweep == "quick" || a.sweep == "full") {
    lines = builtin_backward_sweep(a.sweep == "full");
  } else {
    for (const auto& c : read_sweep_file(a.sweep)) lines.push_back(c.text());
  }
  std::vector<SweepCase> cases;
  for (const auto& l : lines) {
    const SweepCase c = parse_sweep_line(l);
    const bool dt = std::find(dtypes.begin(), dtypes.end(), c.problem.dtype) != dtypes.end();
    const bool md = std::find(modes.begin(), modes.end(), c.problem.mode) != modes.end();
    if (dt && md) cases.push_back(c);
  }
  if (a.list) {
    for (const auto& c : cases) fmt::print("{}\n", c.text());
    fmt::print("# {} cases\n", cases.size());
    return 0;
  }
  if (cases.empty()) throw InvalidArgument("sweep", "no case matches the dtypes and modes given");
  std::optional<BackwardConfig> forced;
  if (!a.backward_config.empty())
    forced = BackwardConfig::parse(a.backward_config, "backward-config");
  fmt::print("check --backward: {} cases{}\n", cases.size(),
             forced ? ", gradient GEMMs " + forced->key() : std::string());
  std::size_t failed = 0, skipped = 0;
  double worst = 0;
  const std::optional<Device> device =
      forced ? std::optional<Device>(Device::get(a.device)) : std::nullopt;
  for (const auto& c : cases) {
    BackwardCheckOptions o;
    o.device = a.device;
    o.cache_dir = a.cache_dir;
    if (forced) {
      const std::string why = backward_config_why_invalid(c.problem, *forced, *device);
      if (!why.empty()) {
        ++skipped;
        if (a.verbose) fmt::print("skip {}: {}\n", c.text(), why);
        continue;
      }
      force_backward_config(o, *forced);
    }
    std::string why;
    bool ok = false;
    BackwardCheckResult r;
    try {
      r = check_backward_case(c, o);
      ok = passes(r, sweep_threshold(c.problem.dtype), &why);
      worst = std::max(worst, r.errors.worst());
    } catch (const std::exception& e) {
      why = e.what();
    }
    failed += ok ? 0 : 1;
    if (a.verbose || !ok)
      fmt::print(
          "{} {} [{}] saved {} dx {} dw {} dbias {} dscale {} dgamma {} dbeta {} seed "
          "{:#x}{}{}\n",
          ok ? "pass" : "FAIL", c.text(), r.config, figure(r.errors.saved), figure(r.errors.dx),
          figure(r.errors.dw), figure(r.errors.dbias), figure(r.errors.dscale),
          figure(r.errors.dgamma), figure(r.errors.dbeta), r.seed, why.empty() ? "" : ": ", why);
    std::fflush(stdout);
  }
  fmt::print("check --backward: {} cases, {} passed, {} failed, {} skipped; worst error {}\n",
             cases.size(), cases.size() - failed - skipped, failed, skipped, figure(worst));
  // A forced pair that fits no case checked nothing: not a pass.
  if (skipped == cases.size()) {
    fmt::print("check --backward: {} can run none of the cases\n", forced->key());
    return 1;
  }
  return failed ? 1 : 0;
}

int run_check(const CheckArgs& a) {
  std::vector<DType> dtypes;
  for (const auto& d : split_list(a.dtypes)) dtypes.push_back(parse_dtype(d));
  std::vector<Mode> modes;
  for (const auto& m : split_list(a.modes)) modes.push_back(parse_mode(m));
  if (dtypes.empty()) throw InvalidArgument("dtypes", "no dtype given");
  if (modes.empty()) throw InvalidArgument("modes", "no mode given");
  if (a.backward) return run_backward_check(a, dtypes, modes);
  if (!a.backward_config.empty())
    throw InvalidArgument("backward-config", "forces the gradient GEMMs: give it with --backward");
  SweepOptions o;
  if (a.op == "fused")
    o.implementation = Implementation::plan;
  else if (a.op == "reference")
    o.implementation = Implementation::reference_op;
  else
    throw InvalidArgument("op", "expected fused or reference; got '" + a.op + "'");
  if (a.variant != "auto") {
    if (o.implementation != Implementation::plan)
      throw InvalidArgument("variant", "only the fused op has variants");
    o.variant = parse_variant(a.variant);
  }
  if (!a.config.empty()) {
    if (o.implementation != Implementation::plan)
      throw InvalidArgument("config", "only the fused op has kernel configs");
    if (o.variant)
      throw InvalidArgument("config",
                            "give --config or --variant, not both (a key names its "
                            "variant)");
    o.config = KernelConfig::parse(a.config);
  }
  if (!a.seed.empty()) o.seed = parse_seed(a.seed);
  o.device = a.device;
  o.cache_dir = a.cache_dir;
  o.build_threads = a.build_threads;
  const std::vector<SweepCase> cases = sweep_cases(a.sweep, dtypes, modes);
  if (a.list) {
    for (const auto& c : cases) fmt::print("{}\n", c.text());
    fmt::print("# {} cases\n", cases.size());
    return 0;
  }
  if (cases.empty()) throw InvalidArgument("sweep", "no case matches the dtypes and modes given");
  fmt::print("check: {} cases ({} op{}{}{})\n", cases.size(), name(o.implementation),
             o.variant ? ", variant " + std::string(name(*o.variant)) : std::string(),
             o.config ? ", config " + o.config->key() : std::string(),
             o.seed ? fmt::format(", seed {:#x}", *o.seed) : std::string());
  o.on_result = [&a](const CaseResult& r) {
    if (a.verbose || r.status == CaseResult::Status::failed) fmt::print("{}\n", format_result(r));
    std::fflush(stdout);
  };
  // What the sweep leaves allocated on the GPU, and the process's peak RSS: a soak that plans
  // thousands of problems must show neither growing (loaded modules stay by design).
  auto gpu_used = [&a]() -> std::optional<std::size_t> {
    if (!driver_available()) return std::nullopt;
    try {
      current_or_primary_context(a.device);
      std::size_t free = 0, total = 0;
      FJ_CU(cuMemGetInfo(&free, &total));
      return total - free;
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  const std::optional<std::size_t> used_before = gpu_used();
  const SweepReport rep = run_sweep(cases, o);
  const std::optional<std::size_t> used_after = gpu_used();
  if (used_before && used_after) {
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    fmt::print(
        "check: GPU memory in use {:.1f} MiB before the sweep, {:.1f} MiB after; peak RSS "
        "{:.1f} MiB\n",
        static_cast<double>(*used_before) / (1 << 20), static_cast<double>(*used_after) / (1 << 20),
        static_cast<double>(usage.ru_maxrss) / 1024);
  }
  const SweepSummary& s = rep.summary;
  std::string worst;
  for (const auto& [d, w] : s.worst)
    worst += fmt::format("{}{} {} (threshold {:.0e})", worst.empty() ? "" : ", ", name(d),
                         figure(w), sweep_threshold(d));
  fmt::print("check: {} cases, {} passed, {} failed, {} skipped; worst relative error: {}\n",
             s.cases, s.passed, s.failed, s.skipped, worst.empty() ? "-" : worst);
  return s.failed ? 1 : 0;
}

}  // namespace

void add_check(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("check",
                                 "Run the op on a sweep of problems against the float64 reference");
  auto a = std::make_shared<CheckArgs>();
  cmd->add_option("--sweep", a->sweep,
                  "quick, full, or a file with one case per line: "
                  "'MxNxK dtype mode [param_dtype] [flags]' (see check/sweep.hpp)")
      ->capture_default_str();
  cmd->add_option("--dtypes,--dtype", a->dtypes, "Comma-separated: fp32, tf32, fp16, bf16")
      ->capture_default_str();
  cmd->add_option("--modes,--mode", a->modes, "Comma-separated: train, eval")
      ->capture_default_str();
  cmd->add_option("--variant", a->variant, "auto, tiled or warpspec (fused op only)")
      ->capture_default_str();
  cmd->add_option("--config", a->config,
                  "Fused op: this kernel config (a key as `fusejit bench` prints it, e.g. "
                  "tiled.64x64x16.w2x1.s3.g8.k4); cases it cannot run are skipped");
  cmd->add_option("--op", a->op, "fused (fusejit::Plan) or reference (cuBLASLt + plain kernels)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Base seed (case i uses seed + i); default: fresh each run");
  cmd->add_option("--device", a->device, "GPU ordinal")->capture_default_str();
  cmd->add_option("--cache-dir", a->cache_dir, "Kernel cache directory (default: see README)");
  cmd->add_option("--build-threads", a->build_threads,
                  "Kernels compiled ahead in parallel (default: one per core)");
  cmd->add_flag("--verbose,-v", a->verbose, "Print every case, not only failures");
  cmd->add_flag("--backward", a->backward,
                "Check the backward pass (every gradient; the sweep: quick, full or a file)");
  cmd->add_option("--backward-config", a->backward_config,
                  "With --backward: the gradient GEMMs' tiles, dx.<config key>.dw.<config key>; "
                  "cases they cannot run are skipped");
  cmd->add_flag("--list", a->list, "Print the cases (sweep-file syntax) and exit; needs no GPU");
  cmd->callback([&action, a] { action = [a] { return run_check(*a); }; });
}

}  // namespace fusejit::cli
