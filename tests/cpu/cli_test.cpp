// The `fusejit` command: each verb's happy path, and bad arguments -> one line, exit code 2.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include "test_process.hpp"

#include <unistd.h>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using Result = fusejit::test::CommandResult;
Result run(const std::string& args) {
  return fusejit::test::run_cli(args);
}

std::string temp_dir(const char* tag) {
  auto p = std::filesystem::temp_directory_path() /
           (std::string("fusejit-cli-") + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("info reports NVRTC, the GPU (or its absence) and the cache") {
  const std::string dir = temp_dir("info");
  const Result r = run("info --cache-dir " + dir);
  CHECK(r.code == 0);
  CHECK(r.out.find("nvrtc:") != std::string::npos);
  CHECK(r.out.find("gpu") != std::string::npos);
  CHECK(r.out.find(dir) != std::string::npos);
}

TEST_CASE("compile warms the cache without a GPU; a second run hits; cache ls/verify/clear") {
  const std::string dir = temp_dir("compile");
  const std::string args =
      "compile --arch sm_80 --shapes 100x72x40,64x64x64 --dtypes bf16 "
      "--modes train,eval --cache-dir " +
      dir;
  const Result first = run(args);
  REQUIRE_MESSAGE(first.code == 0, first.out);
  CHECK(first.out.find("4 kernel set(s): 0 hit, 4 compiled") != std::string::npos);
  const Result second = run(args);
  CHECK(second.code == 0);
  CHECK_MESSAGE(second.out.find("4 kernel set(s): 4 hit, 0 compiled") != std::string::npos,
                second.out);
  const Result ls = run("cache ls --cache-dir " + dir);
  CHECK(ls.code == 0);
  CHECK(ls.out.find("4 entries") != std::string::npos);
  CHECK(run("cache verify --cache-dir " + dir).code == 0);
  // Damage one entry: verify must notice and fail.
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".fjc") continue;
    std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) / 2);
    break;
  }
  const Result bad = run("cache verify --cache-dir " + dir);
  CHECK(bad.code == 1);
  CHECK(bad.out.find("DAMAGED") != std::string::npos);
  const Result cleared = run("cache clear --cache-dir " + dir);
  CHECK(cleared.code == 0);
  CHECK(run("cache ls --cache-dir " + dir).out.find("0 entries") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("bad arguments get one clear line and exit code 2") {
  const std::string dir = temp_dir("bad");
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"compile --arch sm_80 --shape 10x10 --cache-dir " + dir, "shape"},
           {"compile --arch sm_80 --shape 0x10x10 --cache-dir " + dir, "shape"},
           {"compile --arch sm_80 --dtype fp64 --cache-dir " + dir, "dtype"},
           {"compile --arch sm_80 --mode infer --cache-dir " + dir, "mode"},
           {"compile --arch sm_75 --cache-dir " + dir, "arch"},
           {"compile --arch sm_80 --variant fast --cache-dir " + dir, "variant"},
           {"compile --arch sm_80 --shape 1x64x64 --mode train --cache-dir " + dir, "M"},
           {"compile --arch sm_80 --momentum lots --cache-dir " + dir, "momentum"},
           {"compile --arch sm_80 --bogus", "bogus"},
           {"compile --arch sm_80 --config tiled.64x64x16.w2x1.s3.g8 --variant tiled --cache-dir " +
                dir,
            "config"},
           {"compile --arch sm_80 --dtype fp32 --config warpspec.128x256x64.c2.s4.g8.cl1.p1 "
            "--cache-dir " +
                dir,
            "config"},
           {"check --config tiled.64x64x16.w2x1.s3.g8.k --list", "config"},
           {"check --config tiled.64x64x16.w2x1.s3.g8.k4 --variant tiled --list", "config"},
           {"check --config tiled.64x64x16.w2x1.s3.g8.k4 --op reference --list", "config"},
           {"frobnicate", "frobnicate"},
           {"", "subcommand"},
           {"cache", "subcommand"},
       }) {
    CAPTURE(c.args);
    const Result r = run(c.args);
    CHECK(r.code == 2);
    CHECK(lines(r.out) == 1);
    CHECK_MESSAGE(r.out.find(c.expect) != std::string::npos, r.out);
  }
}

TEST_CASE("compile --config compiles exactly that config") {
  const std::string dir = temp_dir("compile-config");
  const Result r =
      run("compile --arch sm_90a --shape 128x512x1024 --dtype fp32 --mode eval "
          "--config tiled.64x64x16.w2x1.s3.g8.k8 --cache-dir " +
          dir);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(r.out.find("fj.fp32.eval.128x512x1024.tiled.64x64x16.w2x1.s3.g8.k8") != std::string::npos);
  CHECK(r.out.find("1 kernel set(s): 0 hit, 1 compiled") != std::string::npos);
}

TEST_CASE("check --config takes split-K keys (no GPU needed to list the cases)") {
  const Result r =
      run("check --config tiled.64x64x16.w2x1.s3.g8.k4 --dtypes fp32 --modes eval --list");
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK(r.out.find("128x512x1024 fp32 eval") != std::string::npos);
}
