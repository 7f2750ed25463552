// fusejit compile: warm the disk cache for a problem without a GPU (deployment images, CI).
#include <fmt/format.h>

#include <future>
#include <thread>

#include "cli/problem_options.hpp"
#include "cli/verbs.hpp"
#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/kernel_config.hpp"
#include "fusejit/device/device.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"

namespace fusejit::cli {

namespace {

struct CompileArgs {
  ProblemOptions problem;
  std::string arch;  // empty: the GPU's
  std::string variant = "auto";
  std::string cache_dir;
};

int run_compile(const CompileArgs& a) {
  Device dev;
  if (!a.arch.empty()) {
    dev = Device::for_arch(a.arch);
  } else if (driver_available()) {
    dev = Device::get(0);
  } else {
    throw InvalidArgument("arch", "no GPU here: say which architecture to compile for (--arch sm_90a)");
  }
  // The 'a' suffix only matters on sm_90, where it unlocks wgmma; elsewhere plain sm_XY.
  const std::string arch = dev.arch();
  if (a.variant != "auto" && a.variant != "all") parse_variant(a.variant);
  struct Job {
    Problem problem;
    KernelConfig config;
  };
  std::vector<Job> jobs;
  for (const Problem& p : a.problem.problems()) {
    if (a.variant == "all") {
      for (const auto& c : candidate_configs(p, dev)) jobs.push_back({p, c});
    } else {
      std::optional<Variant> v;
      if (a.variant != "auto") v = parse_variant(a.variant);
      jobs.push_back({p, default_config(p, dev, v)});
    }
  }
  const std::string dir = a.cache_dir.empty() ? DiskCache::default_dir().string() : a.cache_dir;
  fmt::print("compiling {} kernel set(s) for {} into {}\n", jobs.size(), arch, dir);
  // NVRTC is thread-safe; the disk cache dedupes concurrent writers.
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::future<CompiledKernel>> results(jobs.size());
  std::size_t next = 0;
  int failures = 0, hits = 0;
  double total = 0;
  auto start = [&](std::size_t i) {
    results[i] = std::async(std::launch::async, [&, i] {
      return compile_cached(generate(jobs[i].problem, jobs[i].config), arch, dir);
    });
  };
  for (; next < jobs.size() && next < workers; ++next) start(next);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const KernelSource src = generate(jobs[i].problem, jobs[i].config);
    try {
      const CompiledKernel k = results[i].get();
      hits += k.cache_hit;
      total += k.compile_seconds;
      fmt::print("  {:<4} {:7.3f} s  {:>8} B  {}\n", k.cache_hit ? "hit" : "miss",
                 k.compile_seconds, k.binary.size(), src.name);
    } catch (const CompileError& e) {
      ++failures;
      fmt::print("  FAIL {}\n{}\n", src.name, e.what());
    }
    if (next < jobs.size()) start(next++);
  }
  fmt::print("{} kernel set(s): {} hit, {} compiled ({:.2f} s of NVRTC time), {} failed\n",
             jobs.size(), hits, jobs.size() - hits - failures, total, failures);
  return failures ? 1 : 0;
}

}  // namespace

void add_compile(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("compile", "Compile a problem's kernels into the cache (no GPU needed)");
  auto a = std::make_shared<CompileArgs>();
  a->problem.add_to(*cmd, true);
  cmd->add_option("--arch", a->arch, "Target, e.g. sm_80, sm_90a (default: this machine's GPU)");
  cmd->add_option("--variant", a->variant, "tiled, warpspec, auto (the planner's pick) or all")
      ->capture_default_str();
  cmd->add_option("--cache-dir", a->cache_dir, "Cache directory (default: see README)");
  cmd->callback([&action, a] { action = [a] { return run_compile(*a); }; });
}

}  // namespace fusejit::cli
