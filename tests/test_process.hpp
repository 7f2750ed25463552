// Running programs from tests: the `fusejit` command (FUSEJIT_CLI, set by tests/CMakeLists.txt)
// and toolkit tools such as nvcc. Header-only; doctest must be included first.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

namespace fusejit::test {

// nobody: the unprivileged user a test run as root drops to (or hands files to).
inline constexpr uid_t kNobody = 65534;

// Sets FUSEJIT_LOG_LEVEL=warn so the cache's warnings reach the logger (log_warning_count()),
// whatever the caller's environment says. Call it from a namespace-scope initializer, so it
// runs before main and before the logger is first made.
inline bool log_warnings_for_tests() {
  return ::setenv("FUSEJIT_LOG_LEVEL", "warn", 1) == 0;
}

struct CommandResult {
  int code = -1;    // exit status, -1 when killed by a signal
  std::string out;  // stdout and stderr together
};

// Runs `body` in a forked child and returns its exit code (100 if it returned nothing usable,
// 101 if it threw, 128 + signal if killed). The child gets fresh copies of process-wide state
// (the warn-once flag, fault counts as of the fork) and exits without running the parent's
// destructors; tests have it return 0 when every property held, else the first that failed.
inline int in_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 100;
    try {
      code = body();
    } catch (...) {
      code = 101;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE_MESSAGE(f, "popen failed for: " << cmd);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), f)) r.out += buf.data();
  const int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `fusejit ARGS`.
inline CommandResult run_cli(const std::string& args) {
  const char* cli = std::getenv("FUSEJIT_CLI");
  REQUIRE_MESSAGE(cli, "FUSEJIT_CLI is set by tests/CMakeLists.txt");
  return run_command(std::string(cli) + " " + args);
}

// nvcc from PATH, else the toolkit's default location; empty when there is none.
inline std::string find_nvcc() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (const char* path = std::getenv("PATH")) {
    const std::string p(path);
    for (std::size_t start = 0; start <= p.size();) {
      const std::size_t end = std::min(p.find(':', start), p.size());
      const fs::path cand = fs::path(p.substr(start, end - start)) / "nvcc";
      if (end > start && fs::is_regular_file(cand, ec)) return cand.string();
      start = end + 1;
    }
  }
  if (fs::is_regular_file("/usr/local/cuda/bin/nvcc", ec)) return "/usr/local/cuda/bin/nvcc";
  return {};
}

}  // namespace fusejit::test
