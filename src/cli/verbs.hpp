// The `fusejit` command's verbs. Each registers its options on the app and returns the action
// to run once parsing succeeded (so a bad argument never half-runs a verb).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace fusejit::cli {

using Action = std::function<int()>;

void add_info(CLI::App& app, Action& action);
void add_compile(CLI::App& app, Action& action);
void add_cache(CLI::App& app, Action& action);
void add_check(CLI::App& app, Action& action);
void add_bench(CLI::App& app, Action& action);
void add_autotune(CLI::App& app, Action& action);

// The whole command line: one verb required, --help-all, every verb above. main() and the CLI
// fuzzer register exactly this.
void add_verbs(CLI::App& app, Action& action);

}  // namespace fusejit::cli
