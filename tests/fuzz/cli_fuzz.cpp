// The `fusejit` command line: argument vectors through the real verbs' CLI11 definitions (the
// src/cli verb files, registered as src/cli/main.cpp registers them) and through
// ProblemOptions::problems(), which turns the problem options into validated Problems. Parsing
// only: an action is chosen but never run. Properties: only CLI11's parse errors and
// fusejit::InvalidArgument escape, nothing crashes, and every Problem returned is valid.
//
// Input: arguments separated by '\n' (a NUL byte ends an argument too, as in a real argv).
#include <cstdint>
#include <string>
#include <vector>

#include "cli/problem_options.hpp"
#include "cli/verbs.hpp"
#include "fusejit/error.hpp"
#include "fuzz_check.hpp"

namespace {

std::vector<std::string> split_args(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size() && out.size() < 64) {
    const std::size_t nl = text.find('\n', start);
    std::string arg = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    arg = arg.substr(0, arg.find('\0'));
    out.push_back(std::move(arg));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

// Parses like main(): CLI11 owns the argv[0] convention, so prepend the program name.
template <class Setup>
void parse(const std::vector<std::string>& args, Setup&& setup) {
  CLI::App app{"fuzz"};
  std::vector<char*> argv;
  std::string program = "fusejit";
  argv.push_back(program.data());
  std::vector<std::string> copies = args;
  for (auto& a : copies) argv.push_back(a.data());
  setup(app);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    // Includes --help (CallForHelp): main() prints and exits 0 or 2; nothing else happens.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> args = split_args(fusejit::fuzz::as_string(data, size));

  // 1. The real verbs (add_verbs, as src/cli/main.cpp registers them).
  fusejit::cli::Action action;
  parse(args, [&](CLI::App& app) { fusejit::cli::add_verbs(app, action); });

  // 2. The problem options as compile (lists) and bench (single values) declare them, then the
  //    Problems they describe, which must each be valid.
  for (const bool lists : {true, false}) {
    fusejit::cli::ProblemOptions options;
    bool parsed = false;
    parse(args, [&](CLI::App& app) {
      options.add_to(app, lists);
      app.allow_extras();
      app.callback([&parsed] { parsed = true; });
    });
    if (!parsed) continue;
    std::vector<fusejit::Problem> problems;
    try {
      problems = options.problems();
    } catch (const fusejit::InvalidArgument&) {
      continue;
    }
    FJ_FUZZ_CHECK(!problems.empty(), "problems() returned none without throwing");
    for (const auto& p : problems) {
      try {
        p.validate();
      } catch (const fusejit::InvalidArgument& e) {
        FJ_FUZZ_CHECK(false, "problems() returned an invalid problem: %s", e.what());
      }
    }
  }
  return 0;
}
