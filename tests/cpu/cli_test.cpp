// The `fusejit` command: each verb's happy path, and bad arguments -> one line, exit code 2.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include "test_process.hpp"

#include <unistd.h>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fusejit/device.hpp"
#include "fusejit/tune/tuner.hpp"

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
           // Issue 22's repros: sizes whose tile counts overflow 32-bit int, configs that
           // passed validation and then failed in NVRTC, control characters in a key.
           {"compile --arch sm_90a --shape 2x2147483600x1 --cache-dir " + dir, "N = 2147483600"},
           {"compile --arch sm_90a --shape 2x64x2147483647 --cache-dir " + dir, "K = 2147483647"},
           {"compile --arch sm_90a --shape 1000x200x64 --config tiled.64x96x64.w1x2.s3.g1 "
            "--cache-dir " +
                dir,
            "must nest"},
           {"compile --arch sm_90a --shape 1000x200x64 --config "
            "warpspec.64x192x64.c2.s2.g8.cl1.p1.pp --cache-dir " +
                dir,
            "must nest"},
           {"compile --arch sm_90a --config \"$(printf 'tiled.\\033[31m64')\" --cache-dir " + dir,
            "\\x1b[31m64"},
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
  CHECK(r.out.find("fj.fp32.eval.Mx512x1024.tiled.64x64x16.w2x1.s3.g8.k8") != std::string::npos);
  CHECK(r.out.find("1 kernel set(s): 0 hit, 1 compiled") != std::string::npos);
}

TEST_CASE("compile --variant all fills the cache with every kernel the autotuner times") {
  const std::string dir = temp_dir("compile-all");
  const Result r =
      run("compile --arch sm_90a --shape 300x256x128 --dtype fp32 --mode eval --variant all "
          "--cache-dir " +
          dir);
  REQUIRE_MESSAGE(r.code == 0, r.out);
  fusejit::Problem p;
  p.M = 300, p.N = 256, p.K = 128;
  p.dtype = fusejit::DType::fp32;
  p.mode = fusejit::Mode::eval;
  const auto sources = fusejit::tuning_sources(p, fusejit::Device::for_arch("sm_90a"));
  REQUIRE(sources.size() >= 3);  // configs, the reference op, the exact-M twin
  for (const auto& src : sources)
    CHECK_MESSAGE(r.out.find(src.name) != std::string::npos, src.name);
  CHECK(r.out.find(fmt::format("{} kernel set(s): 0 hit, {} compiled", sources.size(),
                               sources.size())) != std::string::npos);
}

TEST_CASE("check --config takes split-K keys (no GPU needed to list the cases)") {
  const Result r =
      run("check --config tiled.64x64x16.w2x1.s3.g8.k4 --dtypes fp32 --modes eval --list");
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK(r.out.find("128x512x1024 fp32 eval") != std::string::npos);
}

TEST_CASE("a swapped cache entry is rebuilt, never served (`mv A.fjc B.fjc`)") {
  namespace fs = std::filesystem;
  const std::string dir = temp_dir("swap");
  const std::string common = " --arch sm_90a --shape 1000x200x64 --mode train --cache-dir " + dir;
  REQUIRE(run("compile --dtype bf16" + common).code == 0);
  const auto entries = [&] {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".fjc") out.push_back(e.path());
    return out;
  };
  const std::vector<fs::path> bf16 = entries();
  REQUIRE(bf16.size() == 1);
  REQUIRE(run("compile --dtype fp16" + common).code == 0);
  std::vector<fs::path> both = entries();
  REQUIRE(both.size() == 2);
  const fs::path fp16 = both[0] == bf16[0] ? both[1] : both[0];
  fs::rename(fp16, bf16[0]);  // the fp16 kernel under the bf16 kernel's key

  const Result verify = run("cache verify --cache-dir " + dir);
  CHECK(verify.code == 1);
  CHECK_MESSAGE(verify.out.find("built for key " + fp16.stem().string()) != std::string::npos,
                verify.out);
  const Result again = run("compile --dtype bf16" + common);
  CHECK(again.code == 0);
  CHECK_MESSAGE(again.out.find("0 hit, 1 compiled") != std::string::npos, again.out);
  CHECK(again.out.find("damaged cache entry") != std::string::npos);
  CHECK(run("cache verify --cache-dir " + dir).code == 0);
  fs::remove_all(dir);
}

TEST_CASE("honest exit codes: nothing stored, a missing cache, an unbounded input") {
  namespace fs = std::filesystem;
  const std::string dir = temp_dir("honest");
  fs::create_directories(dir);
  // FUSEJIT_CACHE_DIR naming a file: compiled, not stored, exit 1 and says so.
  const std::string file = dir + "/a-file";
  std::ofstream(file) << "x";
  const Result unstored =
      fusejit::test::run_command("FUSEJIT_CACHE_DIR=" + file + " " + std::getenv("FUSEJIT_CLI") +
                                 " compile --arch sm_80 --shape 64x64x64 --dtype fp16 --mode eval");
  CHECK(unstored.code == 1);
  CHECK_MESSAGE(unstored.out.find("could not be stored") != std::string::npos, unstored.out);
  // A world-writable cache directory is not used: not stored, exit 1, the warning says why.
  const std::string open_dir = dir + "/open";
  fs::create_directories(open_dir);
  fs::permissions(open_dir, fs::perms::all);
  const Result untrusted =
      run("compile --arch sm_80 --shape 64x64x64 --dtype fp16 --mode eval --cache-dir " + open_dir);
  CHECK(untrusted.code == 1);
  CHECK_MESSAGE(untrusted.out.find("is not trusted") != std::string::npos, untrusted.out);
  CHECK(fs::is_empty(open_dir));
  CHECK(run("cache verify --cache-dir " + open_dir).code == 1);
  // verify of a directory that is not there checked nothing: an error, not "0 damaged".
  const Result missing = run("cache verify --cache-dir " + dir + "/missing");
  CHECK(missing.code == 1);
  CHECK(missing.out.find("no cache directory") != std::string::npos);
  // --shapes-file /dev/zero: one line, exit 2, at once (it took 13 s and 4.4 GB before).
  const auto t0 = std::chrono::steady_clock::now();
  const Result zero = run("autotune --shapes-file /dev/zero --dtypes bf16 --modes eval");
  CHECK(zero.code == 2);
  CHECK(lines(zero.out) == 1);
  CHECK(zero.out.find("shapes-file") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  const Result sweep = run("check --sweep /dev/zero --list");
  CHECK(sweep.code == 2);
  CHECK(lines(sweep.out) == 1);
  fs::remove_all(dir);
}

TEST_CASE("compile --every-m warms one kernel set per M class; a second run hits them all") {
  const std::string dir = temp_dir("compile-every-m");
  const std::string cmd =
      "compile --arch sm_90a --shape 1000x256x64 --dtype bf16 --mode eval --every-m "
      "--cache-dir " +
      dir;
  const Result first = run(cmd);
  REQUIRE_MESSAGE(first.code == 0, first.out);
  // Every kernel set is named for the layer, not for an M.
  CHECK(first.out.find("fj.bf16.eval.Mx256x64.") != std::string::npos);
  CHECK(first.out.find("fj.bf16.eval.1000x") == std::string::npos);
  const Result second = run(cmd);
  REQUIRE_MESSAGE(second.code == 0, second.out);
  CHECK(second.out.find(" 0 compiled") != std::string::npos);
  // --every-m names problems, so it does not go with --from-db; nor does any option that shapes
  // a problem (the database's entries do: --stat-ranks 2 would otherwise be silently ignored).
  for (const char* o :
       {"--every-m", "--stat-ranks 2", "--momentum none", "--param-dtype bf16", "--eps 1e-3"}) {
    CAPTURE(o);
    const Result r =
        run(std::string("compile --arch sm_90a --from-db ") + o + " --cache-dir " + dir);
    CHECK(r.code == 2);
    CHECK(r.out.find("from-db") != std::string::npos);
  }
  // --backward-config forces a backward set and needs --backward.
  const Result lone =
      run("compile --arch sm_90a --shape 300x72x40 --backward-config "
          "dx.tiled.64x64x64.w2x2.s3.g8.dw.tiled.64x64x64.w2x2.s3.g8.k4 --cache-dir " +
          dir);
  CHECK(lone.code == 2);
  CHECK(lone.out.find("needs --backward") != std::string::npos);
  const Result forced =
      run("compile --arch sm_90a --shape 300x72x40 --backward --backward-config "
          "dx.tiled.64x64x64.w2x2.s3.g8.dw.warpspec.64x64x64.c1.s8.g8.cl1.p1.k4 --cache-dir " +
          dir);
  REQUIRE_MESSAGE(forced.code == 0, forced.out);
  CHECK(forced.out.find("backward.Mx72x40.dx.tiled.64x64x64.w2x2.s3.g8.dw.warpspec.64x64x64.c1."
                        "s8.g8.cl1.p1.k4") != std::string::npos);
  const Result refused =
      run("compile --arch sm_90a --shape 300x72x40 --backward --backward-config "
          "dx.tiled.64x64x64.w2x2.s3.g8.dw.warpspec.64x64x64.c1.s8.g8.cl1.p1.k4.ts --cache-dir " +
          dir);
  CHECK(refused.code == 2);
  CHECK(refused.out.find("tma_store") != std::string::npos);
}
