// fusejit autotune: the command a user runs once on a new GPU. Measures every candidate
// kernel (and the cuBLASLt reference op) for each problem, verifies the winner against the
// float64 reference and records it in the GPU's tuning database, which every later Plan on
// this GPU consults (tune/dispatch.hpp). Progress bar on a terminal, plain lines otherwise;
// a summary table (or --json) at the end.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/problem_options.hpp"
#include "cli/verbs.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/tune/backward_tuner.hpp"
#include "fusejit/tune/tuner.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/durable_file.hpp"
#include "tools/progress.hpp"

namespace fusejit::cli {

namespace {

struct AutotuneArgs {
  ProblemOptions problem;
  bool shapes_given = false;
  std::string shapes_file;
  int device = 0;
  std::string cache_dir;
  unsigned compile_threads = 0;
  bool no_reference = false;
  bool backward = false;
  bool json = false;
  double target_ms = TunerOptions{}.target_ms;
};

// Shapes from a file: MxNxK tokens separated by blanks, commas or newlines; '#' starts a comment.
std::vector<std::string> read_shapes_file(const std::string& path) {
  std::istringstream f(read_text_input(path, "shapes-file"));
  std::vector<std::string> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    line = line.substr(0, line.find('#'));
    for (char& c : line)
      if (c == ',' || c == '\t' || c == '\r') c = ' ';
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      try {
        parse_shape(w);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument("shapes-file", fmt::format("{}:{}: {}", path, n, e.what()));
      }
      out.push_back(w);
    }
  }
  if (out.empty()) throw InvalidArgument("shapes-file", "'" + path + "' names no shape");
  return out;
}

std::string label(const Problem& p) {
  return fmt::format("{} {} {}", format_shape(p.shape()), name(p.dtype), name(p.mode));
}

std::string ms_text(const std::optional<double>& ms) {
  return ms ? fmt::format("{:.4f}", *ms) : std::string("-");
}

struct Outcome {
  Problem problem;
  std::optional<TuneResult> result;
  std::string failure;
  // --backward: the heuristic's pair as an untuned plan runs it (plan_backward_config of
  // default_backward_config), which the winner is compared with (the forward's with cuBLASLt).
  std::string heuristic;
  std::optional<double> heuristic_ms() const {
    if (result)
      for (const auto& c : result->candidates)
        if (c.key == heuristic) return c.median_ms;
    return std::nullopt;
  }
  // The winner's time over its yardstick: the cuBLASLt contender's, or with --backward the
  // heuristic pair's.
  std::optional<double> ratio() const {
    const TuningEntry& e = result->entry;
    const std::optional<double> base = heuristic.empty() ? e.reference_ms : heuristic_ms();
    return base ? std::optional<double>(e.winner_ms / *base) : std::nullopt;
  }
};

std::string ratio_text(const Outcome& o) {
  const auto r = o.ratio();
  return r ? fmt::format("{:.2f}x", *r) : std::string("-");
}

nlohmann::json outcome_json(const Outcome& o) {
  nlohmann::json j;
  const Problem& p = o.problem;
  j["problem"] = p.key();
  j["shape"] = format_shape(p.shape());
  j["dtype"] = name(p.dtype);
  j["mode"] = name(p.mode);
  j["param_dtype"] = name(p.param_dtype);
  if (!o.result) {
    j["failure"] = o.failure;
    return j;
  }
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  const TuningEntry& e = o.result->entry;
  j["winner"] = e.winner;
  j["winner_ms"] = e.winner_ms;
  j["reference_ms"] = opt(e.reference_ms);
  j["vs_reference"] =
      e.reference_ms ? nlohmann::json(e.winner_ms / *e.reference_ms) : nlohmann::json(nullptr);
  if (!o.heuristic.empty()) {
    j["pass"] = "backward";
    j["heuristic"] = o.heuristic;
    j["heuristic_ms"] = opt(o.heuristic_ms());
    j["vs_heuristic"] = opt(o.ratio());
  }
  j["runner_up"] = e.runner_up.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.runner_up);
  j["runner_up_ms"] = opt(e.runner_up_ms);
  j["best_fused"] = e.best_fused.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.best_fused);
  j["best_fused_ms"] = opt(e.best_fused_ms);
  j["verification_error"] = e.error;
  j["seconds"] = o.result->seconds;
  j["compile_seconds"] = o.result->compile_seconds;
  j["recorded"] = o.result->recorded;
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : o.result->candidates) {
    nlohmann::json cj{{"key", c.key}, {"status", name(c.status)}, {"runs", c.runs}};
    cj["ms"] = opt(c.median_ms);
    if (c.status == CandidateOutcome::Status::verified ||
        c.status == CandidateOutcome::Status::rejected)
      cj["error"] = c.error;
    if (!c.message.empty()) cj["message"] = c.message;
    j["candidates"].push_back(std::move(cj));
  }
  return j;
}

void print_summary(const std::vector<Outcome>& outcomes, bool backward) {
  std::size_t wp = 7, ww = 6;
  for (const auto& o : outcomes) {
    wp = std::max(wp, label(o.problem).size());
    if (o.result) ww = std::max(ww, o.result->entry.winner.size());
  }
  fmt::print("\n{:<{}}  {:<{}}  {:>9}  {:>12}  {:>7}  {}\n", "problem", wp, "winner", ww, "ms",
             backward ? "vs heuristic" : "vs cuBLASLt", "tune s", "runner-up");
  for (const auto& o : outcomes) {
    if (!o.result) {
      fmt::print("{:<{}}  FAILED: {}\n", label(o.problem), wp,
                 o.failure.substr(0, o.failure.find('\n')));
      continue;
    }
    const TuningEntry& e = o.result->entry;
    fmt::print("{:<{}}  {:<{}}  {:>9.4f}  {:>12}  {:>7.1f}  {}\n", label(o.problem), wp, e.winner,
               ww, e.winner_ms, ratio_text(o), o.result->seconds,
               e.runner_up.empty() ? std::string("-")
                                   : fmt::format("{} {} ms", e.runner_up, ms_text(e.runner_up_ms)));
  }
}

int run_autotune(const AutotuneArgs& a) {
  // Arguments first (exit 2), the GPU after (exit 1): a typo should not read as "no GPU".
  if (a.shapes_given && !a.shapes_file.empty())
    throw InvalidArgument("shapes-file", "give --shapes or --shapes-file, not both");
  if (!a.shapes_given && a.shapes_file.empty())
    throw InvalidArgument("shapes", "say what to tune: --shapes MxNxK,... or --shapes-file FILE");
  ProblemOptions po = a.problem;
  if (!a.shapes_file.empty()) {
    po.shapes.clear();
    for (const auto& s : read_shapes_file(a.shapes_file))
      po.shapes += (po.shapes.empty() ? "" : ",") + s;
  }
  const std::vector<Problem> problems = po.problems();
  if (a.device < 0) throw InvalidArgument("device", fmt::format("expected >= 0, got {}", a.device));

  std::string why;
  if (!driver_available(&why)) {
    fmt::print(stderr, "fusejit autotune: no GPU to tune on: {}\n", why);
    return 1;
  }
  primary_context(a.device);
  const Device dev = Device::get(a.device);
  const TuningDb db = TuningDb::for_device(dev, a.cache_dir);

  // With --json the JSON owns stdout; the progress goes to stderr.
  std::FILE* progress_out = a.json ? stderr : stdout;
  TuneProgressBar bar(progress_out, problems.size(), ::isatty(::fileno(progress_out)) == 1);
  if (!a.json)
    fmt::print("autotune{}: {} problem(s) on {} ({}), database {}\n",
               a.backward ? " --backward" : "", problems.size(), dev.name, dev.arch(),
               db.path().string());
  std::fflush(stdout);

  std::vector<Outcome> outcomes;
  for (std::size_t i = 0; i < problems.size(); ++i) {
    Outcome out;
    out.problem = problems[i];
    bar.start(i, label(problems[i]));
    TunerOptions o;
    o.device = a.device;
    o.cache_dir = a.cache_dir;
    o.compile_threads = a.compile_threads;
    o.include_reference = !a.no_reference;
    o.target_ms = a.target_ms;
    o.on_progress = [&bar](const TuneProgress& p) { bar.update(p); };
    try {
      if (a.backward) {
        out.heuristic =
            plan_backward_config(problems[i], default_backward_config(problems[i], dev), dev).key();
        out.result = tune_backward(problems[i], o);
      } else {
        out.result = tune(problems[i], o);
      }
      const TuningEntry& e = out.result->entry;
      bar.finish(fmt::format(
          "{}: {} {:.4f} ms ({} {}), runner-up {}, {:.1f} s{}", label(problems[i]), e.winner,
          e.winner_ms, ratio_text(out), a.backward ? "the heuristic" : "cuBLASLt",
          e.runner_up.empty() ? std::string("-") : e.runner_up, out.result->seconds,
          out.result->recorded ? "" : " (not recorded: database not writable)"));
    } catch (const std::exception& e) {
      out.failure = e.what();
      bar.finish(fmt::format("{}: FAILED: {}", label(problems[i]),
                             out.failure.substr(0, out.failure.find('\n'))));
    }
    outcomes.push_back(std::move(out));
  }
  bar.close();

  bool failed = false;
  for (const auto& o : outcomes) failed |= !o.result;
  if (a.json) {
    nlohmann::json j;
    j["device"] = {{"name", dev.name},
                   {"arch", dev.arch()},
                   {"sm_count", dev.sm_count},
                   {"driver", dev.driver_version},
                   {"fingerprint", db.identity().fingerprint}};
    j["database"] = db.path().string();
    j["results"] = nlohmann::json::array();
    for (const auto& o : outcomes) j["results"].push_back(outcome_json(o));
    fmt::print("{}\n", j.dump(2));
  } else {
    print_summary(outcomes, a.backward);
    const auto table = db.table();
    fmt::print("\ntuning database: {} ({} entries, {} backward)\n", db.path().string(),
               table->entries.size(), table->backward.size());
  }
  return failed ? 1 : 0;
}

}  // namespace

void add_autotune(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "autotune", "Measure every candidate kernel on this GPU and record the fastest verified one");
  auto a = std::make_shared<AutotuneArgs>();
  a->problem.shapes.clear();  // no default: tuning is asked for, shape by shape
  a->problem.add_to(*cmd, true);
  cmd->add_option("--shapes-file", a->shapes_file,
                  "File of MxNxK shapes (blank, comma or newline separated; # comments)");
  cmd->add_option("--device", a->device, "GPU ordinal")->capture_default_str();
  cmd->add_option("--cache-dir", a->cache_dir,
                  "Cache directory: kernels, and the database under tuning/ (default: see README)");
  cmd->add_option("--compile-threads", a->compile_threads,
                  "Parallel NVRTC compiles (default: one per core)");
  cmd->add_flag("--no-reference", a->no_reference,
                "Do not time the cuBLASLt reference op as a contender");
  cmd->add_flag("--backward", a->backward,
                "Tune BackwardPlan's gradient GEMMs instead (the tiles of dx and dW, timed as "
                "whole backward runs, verified against the float64 gradients)");
  cmd->add_option("--target-ms", a->target_ms,
                  "Timed work per candidate that survives the early exit, in ms (less: a faster, "
                  "noisier tune)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print the results as JSON (progress goes to stderr)");
  cmd->callback([&action, a, cmd] {
    a->shapes_given = cmd->get_option("--shapes")->count() > 0;
    action = [a] { return run_autotune(*a); };
  });
}

}  // namespace fusejit::cli
