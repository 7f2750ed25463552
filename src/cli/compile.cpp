// fusejit compile: warm the disk cache for a problem without a GPU (deployment images, CI),
// or (--from-db) for the winners a tuning database recorded on the deployment GPU.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "cli/problem_options.hpp"
#include "cli/verbs.hpp"
#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/tune/backward_tuner.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuner.hpp"
#include "fusejit/tune/tuning_db.hpp"

namespace fusejit::cli {

namespace {

struct CompileArgs {
  ProblemOptions problem;
  std::string arch;  // empty: the GPU's
  std::string variant = "auto";
  std::string config;  // a KernelConfig key: compile exactly that config (overrides --variant)
  std::string cache_dir;
  // --from-db [FILE]: FILE, or (no FILE) every database under <cache dir>/tuning.
  bool from_db = false;
  std::string db_file;
  // --shapes, --dtypes, --modes, --variant, --config, --every-m or --backward given
  bool problem_given = false;
  std::string emit_dir;         // --emit-source: also write each generated translation unit here
  bool every_m = false;         // --every-m: each problem's layer for every M class
  bool backward = false;        // --backward: each problem's backward kernel set too
  std::string backward_config;  // --backward-config: that BackwardConfig key instead
};

// --every-m: the problem at one M per M class (config/candidates.hpp), the class's largest
// (the top class: the problem's own M when larger), so a Plan of any M of the layer finds its
// kernel set. With M a run-time value, problems of one class share a source: jobs dedupe.
std::vector<Problem> every_m_class(const Problem& p) {
  std::vector<Problem> out;
  for (std::int64_t m = 1; m <= kMaxDim;) {
    const MClass c = m_class(m);
    Problem q = p;
    q.M = c.hi == kMaxDim ? std::max<std::int64_t>(p.M, c.lo) : c.hi;
    if (q.mode == Mode::train && q.M < 2) q.M = 2;
    out.push_back(q);
    if (c.hi == kMaxDim) break;
    m = c.hi + 1;
  }
  return out;
}

struct Job {
  KernelSource source;
  std::string arch;
  std::string key;  // the binary's cache key (JobSet)
};

// Jobs are one per binary: the cache's own key, which names everything that changes it (a set's
// name leaves out bias, eps, strides and more, so two entries of one name may differ).
class JobSet {
 public:
  void add(KernelSource src, const std::string& arch, std::vector<Job>& jobs) {
    std::string key = cache_key(src, arch, nvrtc_);
    if (keys_.insert(key).second) jobs.push_back({std::move(src), arch, std::move(key)});
  }

 private:
  std::string nvrtc_ = nvrtc_version();
  std::set<std::string> keys_;
};

// What the tuning databases' Plans will load: each entry's winner and best fused config (a
// Plan whose winner is the reference still builds that one), for --arch or the database's CC.
// Configs that cannot run on that arch are skipped with a note.
// Files that could not be read or validated go to `bad_files` (reported, the run fails).
std::vector<Job> database_jobs(const CompileArgs& a, std::string* target,
                               std::vector<std::string>* bad_files) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  if (!a.db_file.empty()) {
    files.push_back(a.db_file);
  } else {
    const fs::path dir = TuningDb::default_dir(a.cache_dir);
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".json" && it->path().filename().string()[0] != '.')
        files.push_back(it->path());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw Error(
          fmt::format("no tuning database under {} (run fusejit autotune on the GPU, or "
                      "name a file: --from-db FILE)",
                      dir.string()));
  }
  std::vector<Job> jobs;
  JobSet seen;
  std::set<std::string> archs;
  for (const auto& file : files) {
    TuningTable t;
    try {
      t = read_tuning_file(file);
    } catch (const Error& e) {
      // One bad file must not cost the others' kernels; the run still fails at the end.
      fmt::print("  skip {}: {}\n", file.string(), e.what());
      bad_files->push_back(file.string());
      continue;
    }
    const Device dev =
        Device::for_arch(a.arch.empty() ? fmt::format("sm_{}", t.identity.cc) : a.arch);
    archs.insert(dev.arch());
    for (const auto& entry : t.entries) {
      const TuningEntry& e = entry.second;
      // Exactly what a Plan of this problem on that arch would choose and load (the entry's
      // winner, or where it cannot run there the dispatch's fallback, which a Plan builds).
      const KernelChoice choice = choose_from_table(t, e.problem, dev);
      if (choice.source != KernelChoice::Source::exact)
        fmt::print("  skip {} {} on {}: {}; the plan falls back to {}\n",
                   format_shape(e.problem.shape()), e.winner, dev.arch(), choice.detail,
                   choice.config.key());
      for (KernelSource& src : plan_sources(e.problem, choice))
        seen.add(std::move(src), dev.arch(), jobs);
    }
    // The backward entries' kernel sets, as a BackwardPlan on that arch chooses them.
    for (const auto& entry : t.backward) {
      const TuningEntry& e = entry.second;
      const BackwardChoice choice = choose_backward_from_table(t, e.problem, dev);
      if (choice.source != KernelChoice::Source::exact)
        fmt::print("  skip backward {} {} on {}: {}; the plan falls back to {}\n",
                   format_shape(e.problem.shape()), e.winner, dev.arch(), choice.detail,
                   choice.config.key());
      seen.add(generate_backward(e.problem, choice.config), dev.arch(), jobs);
    }
  }
  std::string list;
  for (const auto& s : archs) list += (list.empty() ? "" : ", ") + s;
  *target = fmt::format("{} (the winners of {} tuning database(s))", list,
                        files.size() - bad_files->size());
  return jobs;
}

// The generated translation units with their template headers, as files nvcc can build
// (`nvcc -I DIR/include DIR/NAME.cu`): for reading the code a problem really runs, profiling it
// outside fusejit, or reporting a compiler bug.
void emit_sources(const std::vector<Job>& jobs, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  auto write = [](const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) throw Error(fmt::format("cannot write {}", path.string()));
  };
  // Sets of one name may differ (another arch, bias, eps, strides): each file is its own, the
  // later ones named by their cache key too.
  std::set<std::string> written;
  for (const Job& j : jobs) {
    const KernelSource& src = j.source;
    std::string file = src.name;
    if (!written.insert(file).second) {
      file += "." + j.arch + "." + j.key.substr(0, 16);
      written.insert(file);
    }
    write(root / (file + ".cu"), src.text);
    for (const auto& [name, text] : src.headers) write(root / "include" / name, text);
  }
  fmt::print("wrote {} source(s) to {} (headers under include/)\n", jobs.size(), dir);
}

int run_compile(const CompileArgs& a) {
  if (a.from_db && a.problem_given)
    throw InvalidArgument("from-db",
                          "the problems come from the tuning database (its backward entries "
                          "too); drop --shapes, --dtypes, --modes, --param-dtype, --momentum, "
                          "--eps, --stat-ranks, --variant, --config, --every-m, --backward and "
                          "--backward-config");
  if (!a.backward_config.empty() && !a.backward)
    throw InvalidArgument("backward-config", "needs --backward");
  std::vector<Job> jobs;
  std::string target;
  std::vector<std::string> bad_files;
  if (a.from_db) {
    jobs = database_jobs(a, &target, &bad_files);
  } else {
    Device dev;
    if (!a.arch.empty()) {
      dev = Device::for_arch(a.arch);
    } else if (driver_available()) {
      dev = Device::get(0);
    } else {
      throw InvalidArgument("arch",
                            "no GPU here: say which architecture to compile for (--arch sm_90a)");
    }
    // The 'a' suffix only matters on sm_90, where it unlocks wgmma; elsewhere plain sm_XY.
    const std::string arch = dev.arch();
    if (a.variant != "auto" && a.variant != "all") parse_variant(a.variant);
    std::optional<KernelConfig> forced;
    if (!a.config.empty()) {
      if (a.variant != "auto")
        throw InvalidArgument("config",
                              "give --config or --variant, not both (a key names its "
                              "variant)");
      forced = KernelConfig::parse(a.config);
    }
    JobSet seen;  // the reference op's kernels are shared by many problems
    auto add = [&](KernelSource src) { seen.add(std::move(src), arch, jobs); };
    std::vector<Problem> problems;
    for (const Problem& p : a.problem.problems()) {
      if (!a.every_m) {
        problems.push_back(p);
        continue;
      }
      for (const Problem& q : every_m_class(p))
        // Classes above the problem's M (the largest classes) only where they can run.
        if (q.M <= p.M || !forced || forced->valid_for(q, dev)) problems.push_back(q);
    }
    for (const Problem& p : problems) {
      if (forced) {
        if (const std::string why = forced->why_invalid(p, dev); !why.empty())
          throw InvalidArgument(
              "config", fmt::format("{} cannot run {} on {}: {}", a.config, p.key(), arch, why));
        add(generate(p, *forced));
      } else if (a.variant == "all") {
        // Everything `fusejit autotune` would compile for the problem on that arch, so a tune
        // on the GPU later finds its kernels cached and only times.
        for (KernelSource& src : tuning_sources(p, dev)) add(std::move(src));
      } else if (a.variant != "auto") {
        add(generate(p, default_config(p, dev, parse_variant(a.variant))));
      } else {
        // What a Plan without a tuning entry loads (the heuristic's choice, the reference op's
        // kernels with it where it prefers that path).
        for (KernelSource& src : plan_sources(p, choose_from_table(TuningTable{}, p, dev)))
          add(std::move(src));
      }
      // What a BackwardPlan of the problem loads without a tuning entry; with --variant all,
      // everything `fusejit autotune --backward` times.
      const std::string refusal = a.backward ? backward_refusal(p) : std::string();
      if (!refusal.empty())
        fmt::print("{}: no backward kernel set ({})\n", p.key(), refusal);
      else if (a.backward) {
        if (!a.backward_config.empty()) {
          const BackwardConfig c = BackwardConfig::parse(a.backward_config);
          if (const std::string why = backward_config_why_invalid(p, c, dev); !why.empty())
            throw InvalidArgument("backward-config", fmt::format("{}: {}", c.key(), why));
          add(generate_backward(p, c));
        } else if (a.variant == "all") {
          for (KernelSource& src : backward_tuning_sources(p, dev)) add(std::move(src));
        } else {
          add(generate_backward(p, default_backward_config(p, dev)));
        }
      }
    }
    target = arch;
  }
  const std::string dir = DiskCache::resolve_dir(a.cache_dir).string();
  if (!a.emit_dir.empty()) emit_sources(jobs, a.emit_dir);
  fmt::print("compiling {} kernel set(s) for {} into {}\n", jobs.size(), target, dir);
  // NVRTC is thread-safe; the disk cache dedupes concurrent writers.
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::future<CompiledKernel>> results(jobs.size());
  std::size_t next = 0;
  int failures = 0, hits = 0, unstored = 0;
  double total = 0;
  auto start = [&](std::size_t i) {
    results[i] = std::async(std::launch::async,
                            [&, i] { return compile_cached(jobs[i].source, jobs[i].arch, dir); });
  };
  for (; next < jobs.size() && next < workers; ++next) start(next);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const KernelSource& src = jobs[i].source;
    try {
      const CompiledKernel k = results[i].get();
      hits += k.cache_hit;
      unstored += !k.stored;
      total += k.compile_seconds;
      fmt::print("  {:<4} {:7.3f} s  {:>8} B  {}{}\n", k.cache_hit ? "hit" : "miss",
                 k.compile_seconds, k.binary.size(), src.name, k.stored ? "" : "  NOT STORED");
      // Not a failure (the kernel is correct), but what it costs is worth knowing before a run.
      if (const std::string spills = describe_spills(k.functions); !spills.empty())
        fmt::print("       ptxas spilled: {}\n", spills);
    } catch (const CompileError& e) {
      ++failures;
      fmt::print("  FAIL {}\n{}\n", src.name, e.what());
    }
    if (next < jobs.size()) start(next++);
  }
  fmt::print("{} kernel set(s): {} hit, {} compiled ({:.2f} s of NVRTC time), {} failed\n",
             jobs.size(), hits, jobs.size() - hits - failures, total, failures);
  // Warming a cache is this command's job: a kernel that did not reach the disk is a failure
  // even though it compiled.
  if (unstored > 0)
    fmt::print("{} kernel set(s) could not be stored in {} (see the warning above)\n", unstored,
               dir);
  for (const auto& f : bad_files) fmt::print("damaged or unreadable tuning database: {}\n", f);
  return failures || unstored || !bad_files.empty() ? 1 : 0;
}

}  // namespace

void add_compile(CLI::App& app, Action& action) {
  auto* cmd =
      app.add_subcommand("compile", "Compile a problem's kernels into the cache (no GPU needed)");
  auto a = std::make_shared<CompileArgs>();
  a->problem.add_to(*cmd, true);
  cmd->add_option("--stat-ranks", a->problem.stat_ranks,
                  "Train problems: kernels for statistics synchronized over this many ranks "
                  "(Problem::stat_ranks; 0: none)")
      ->capture_default_str();
  cmd->add_option("--arch", a->arch, "Target, e.g. sm_80, sm_90a (default: this machine's GPU)");
  cmd->add_option("--variant", a->variant,
                  "tiled, warpspec, auto (the planner's pick) or all (every kernel `fusejit "
                  "autotune` times)")
      ->capture_default_str();
  cmd->add_option("--config", a->config,
                  "Compile this kernel config (a key as `fusejit bench` prints it) instead of the "
                  "planner's pick");
  cmd->add_option("--cache-dir", a->cache_dir, "Cache directory (default: see README)");
  cmd->add_option("--from-db", a->db_file,
                  "Compile a tuning database's winners (FILE, or every database under "
                  "<cache dir>/tuning) for --arch or the tuned GPU's architecture")
      ->expected(0, 1);
  cmd->add_flag(
      "--every-m", a->every_m,
      "Warm every batch size of each layer: one kernel set per M class (1-64, 65-128, "
      "129-256, 257-1024, 1025-2048, 2049-4096, 4097-16384, larger), so a Plan of any M compiles "
      "nothing");
  cmd->add_flag("--backward", a->backward,
                "Also compile each problem's backward kernel set: the heuristic's (what a "
                "BackwardPlan loads without a tuning entry), or with --variant all every set "
                "`autotune --backward` times; problems the backward pass refuses are skipped");
  cmd->add_option("--backward-config", a->backward_config,
                  "With --backward: compile this backward config (dx.<key>.dw.<key>, as `fusejit "
                  "bench --backward` prints it) instead of the heuristic's");
  cmd->add_option("--emit-source", a->emit_dir,
                  "Also write the generated CUDA sources (and template headers) to DIR");
  cmd->callback([&action, a, cmd] {
    a->from_db = cmd->get_option("--from-db")->count() > 0;
    // Everything that shapes a problem: with --from-db the database's entries do, and an option
    // that would be silently ignored there (--stat-ranks 2 warming unsynchronized sets) is refused.
    for (const char* o :
         {"--shapes", "--dtypes", "--modes", "--param-dtype", "--momentum", "--eps", "--stat-ranks",
          "--variant", "--config", "--every-m", "--backward", "--backward-config"})
      a->problem_given |= cmd->get_option(o)->count() > 0;
    action = [a] { return run_compile(*a); };
  });
}

}  // namespace fusejit::cli
