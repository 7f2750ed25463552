#include "cli/verbs.hpp"

namespace fusejit::cli {

void add_verbs(CLI::App& app, Action& action) {
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every verb");
  add_info(app, action);
  add_compile(app, action);
  add_cache(app, action);
  add_check(app, action);
  add_bench(app, action);
  add_autotune(app, action);
}

}  // namespace fusejit::cli
