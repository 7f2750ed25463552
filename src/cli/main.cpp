// fusejit: inspect the GPU and the kernel cache, compile kernels ahead of time, benchmark and
// check the op. Bad arguments print one line and exit 2; failures exit 1.
#include <iostream>
#include <string>

#include "cli/verbs.hpp"
#include "fusejit/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"fusejit: fused Linear -> scale -> BatchNorm1d kernels, generated at run time"};
  fusejit::cli::Action action;
  fusejit::cli::add_verbs(app, action);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string verbs;
    for (const auto* sub : app.get_subcommands({})) {
      known |= sub->get_name() == argv[1];
      verbs += (verbs.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "fusejit: unknown verb '" << argv[1] << "'; expected one of " << verbs << "\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "fusejit: " << e.what() << " (see fusejit --help)\n";
    return 2;
  }
  try {
    return action ? action() : 0;
  } catch (const fusejit::InvalidArgument& e) {
    std::cerr << "fusejit: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "fusejit: error: " << e.what() << "\n";
    return 1;
  }
}
