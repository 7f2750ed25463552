// The autotuner's GPU-free parts: which candidates it considers (both variants on sm_90a, only
// tiled on sm_80, always the reference contender), which columns verification checks, the
// progress display, PlanOptions::autotune's default, and the `fusejit autotune` and
// `fusejit compile --from-db` command lines (bad arguments exit 2; no GPU exits 1).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuner.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "tools/progress.hpp"
#include "tools/sweep.hpp"

using namespace fusejit;
namespace fs = std::filesystem;

namespace {

Problem problem(std::int64_t M, std::int64_t N, std::int64_t K, DType d = DType::bf16,
                Mode m = Mode::train) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

int count_prefix(const std::vector<std::string>& v, const std::string& prefix) {
  return static_cast<int>(std::count_if(
      v.begin(), v.end(), [&](const std::string& s) { return s.starts_with(prefix); }));
}

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
};

Result run_cli(const std::string& args, const std::string& env = {}) {
  const char* cli = std::getenv("FUSEJIT_CLI");
  REQUIRE_MESSAGE(cli, "FUSEJIT_CLI is set by tests/CMakeLists.txt");
  Result r;
  FILE* f = popen((env + " " + std::string(cli) + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(f);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), f)) r.out += buf.data();
  const int status = pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

int lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

fs::path temp_dir(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() /
                     fmt::format("fusejit-tuner-{}-{}", tag, static_cast<long>(::getpid()));
  fs::remove_all(p);
  return p;
}

std::string read_file(std::FILE* f) {
  std::string out;
  std::rewind(f);
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  return out;
}

}  // namespace

TEST_CASE("tuning_sources: what tune() compiles, one source per candidate in its order") {
  const Device h100 = Device::for_arch("sm_90a");
  for (const Problem& p : {problem(1024, 8192, 8192), problem(1024, 1024, 1024, DType::fp32)}) {
    CAPTURE(p.key());
    const auto keys = tuning_candidates(p, h100);
    const auto sources = tuning_sources(p, h100);
    REQUIRE(sources.size() == keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      CAPTURE(keys[i]);
      const KernelSource want = keys[i] == kReferenceCandidate
                                    ? reference_kernel_source(p.dtype, p.param_dtype)
                                    : generate(p, KernelConfig::parse(keys[i]));
      CHECK(sources[i].name == want.name);
      CHECK(sources[i].text == want.text);
    }
  }
}

TEST_CASE("candidates: both variants on sm_90a, only tiled on sm_80, plus the reference") {
  const Problem p = problem(1024, 8192, 8192);
  const Device h100 = Device::for_arch("sm_90a"), a100 = Device::for_arch("sm_80");

  const auto hopper = tuning_candidates(p, h100);
  CHECK(count_prefix(hopper, "warpspec.") >= 2);
  CHECK(count_prefix(hopper, "tiled.") >= 2);
  CHECK(std::count(hopper.begin(), hopper.end(), std::string(kReferenceCandidate)) == 1);
  // The heuristic's choice is timed first (it sets the early-exit bar), the reference next.
  CHECK(hopper.front() == default_config(p, h100).key());
  CHECK(hopper[1] == kReferenceCandidate);
  CHECK(std::set<std::string>(hopper.begin(), hopper.end()).size() == hopper.size());
  // Exactly candidate_configs (every one valid for the device), the reference, and last the
  // heuristic's config compiled for this exact M.
  const auto configs = candidate_configs(p, h100);
  CHECK(hopper.size() == configs.size() + 2);
  CHECK(hopper.back() == default_config(p, h100).key() + ".xm");
  for (const auto& c : configs) {
    CHECK(std::count(hopper.begin(), hopper.end(), c.key()) == 1);
    CHECK(c.valid_for(p, h100));
  }

  const auto ampere = tuning_candidates(p, a100);
  CHECK(count_prefix(ampere, "warpspec.") == 0);
  CHECK(count_prefix(ampere, "tiled.") >= 2);
  CHECK(std::count(ampere.begin(), ampere.end(), std::string(kReferenceCandidate)) == 1);

  // Pruning: strict fp32 has no wgmma path; rows TMA cannot load get the warpspec configs only
  // behind the padding copy (KernelConfig::pad_operands).
  const auto strict = tuning_candidates(problem(1024, 1024, 1024, DType::fp32), h100);
  CHECK(count_prefix(strict, "warpspec.") == 0);
  CHECK(count_prefix(strict, "tiled.") >= 1);
  Problem unaligned = problem(1024, 1024, 1001);
  unaligned.alignment = 2;
  const auto padded = tuning_candidates(unaligned, h100);
  const auto pads = std::count_if(padded.begin(), padded.end(), [](const std::string& k) {
    return k.find(".pad") != std::string::npos;
  });
  CHECK(pads >= 2);
  CHECK(count_prefix(padded, "warpspec.") == pads);
  // Without the contender.
  const auto fused_only = tuning_candidates(p, h100, false);
  CHECK(std::count(fused_only.begin(), fused_only.end(), std::string(kReferenceCandidate)) == 0);
  CHECK(fused_only.size() == configs.size() + 1);
}

TEST_CASE("heuristic_prefers_reference: strict fp32 at long K, narrow layers included") {
  auto fp32 = [](std::int64_t m, std::int64_t n, std::int64_t k, Mode mode) {
    Problem q = problem(m, n, k, DType::fp32);
    q.mode = mode;
    return q;
  };
  for (const Mode mode : {Mode::train, Mode::eval}) {
    CAPTURE(name(mode));
    // K >= 1536 at any output size, where cuBLASLt's split-K SGEMM beat the fused tiles.
    CHECK(heuristic_prefers_reference(fp32(512, 2048, 2048, mode)));
    CHECK(heuristic_prefers_reference(fp32(1536, 1536, 1536, mode)));
    CHECK(heuristic_prefers_reference(fp32(4, 2048, 1536, mode)));
    // K = 1024 only on large outputs; shorter K never.
    CHECK(heuristic_prefers_reference(fp32(1024, 4096, 1024, mode)));
    CHECK_FALSE(heuristic_prefers_reference(fp32(1024, 1024, 1024, mode)));
    CHECK_FALSE(heuristic_prefers_reference(fp32(1024, 1024, 1535, mode)));
    CHECK_FALSE(heuristic_prefers_reference(fp32(8192, 8192, 512, mode)));
    // Only strict fp32: the other dtypes fuse onto tensor cores.
    for (const DType d : {DType::tf32, DType::tf32x3, DType::bf16, DType::fp16}) {
      Problem q = fp32(512, 2048, 2048, mode);
      q.dtype = d;
      CHECK_FALSE(heuristic_prefers_reference(q));
    }
    // Narrow layers, tall or not (train's statistics pass splits the rows).
    CHECK(heuristic_prefers_reference(fp32(64, 256, 8192, mode)));
    CHECK(heuristic_prefers_reference(fp32(16384, 512, 2048, mode)));
    CHECK(heuristic_prefers_reference(fp32(65536, 256, 1024, mode)));
  }
  // The sanitizer's "reference" sweep does run the reference op.
  const char* source = std::getenv("FUSEJIT_SOURCE_DIR");
  REQUIRE_MESSAGE(source, "FUSEJIT_SOURCE_DIR is set by tests/CMakeLists.txt");
  const auto lines = read_sweep_file(std::string(source) + "/tests/sanitize/reference_small.sweep");
  CHECK(lines.size() >= 4);
  for (const SweepCase& c : lines) {
    CAPTURE(c.text());
    CHECK(heuristic_prefers_reference(c.problem));
  }
}

TEST_CASE("verification checks every column of small problems, a budgeted subset of large ones") {
  const Problem small = problem(256, 200, 128);
  const auto all = verification_columns(small);
  REQUIRE(all.size() == 200);
  for (std::int64_t n = 0; n < 200; ++n) CHECK(all[static_cast<std::size_t>(n)] == n);

  const Problem big = problem(16384, 4096, 4096);
  const auto cols = verification_columns(big);
  CHECK(std::is_sorted(cols.begin(), cols.end()));
  CHECK(std::adjacent_find(cols.begin(), cols.end()) == cols.end());
  CHECK(cols.size() >= 64);
  CHECK(cols.front() == 0);
  CHECK(cols.back() == 4095);
  for (std::int64_t c : {1, 7, 63, 64, 127, 128, 511, 512, 4088})
    CHECK(std::binary_search(cols.begin(), cols.end(), c));
  // Budget: about kVerifyBudget multiply-adds, but never fewer than 64 spread columns (plus
  // edges and boundaries).
  CHECK(static_cast<double>(cols.size()) <=
        std::max(static_cast<double>(kVerifyBudget) / (16384.0 * 4096.0), 64.0) + 40.0);
  // Spread over the whole width, not bunched at the start.
  CHECK(std::count_if(cols.begin(), cols.end(), [](std::int64_t c) { return c >= 2048; }) >= 24);
  // Where the budget (not the minimum) decides, a larger budget checks more.
  const Problem wide = problem(1024, 8192, 8192);
  const auto some = verification_columns(wide);
  CHECK(some.size() >= 128);
  CHECK(some.size() < 200);
  CHECK(verification_columns(wide, kVerifyBudget * 4).size() >= 512);
}

TEST_CASE("progress: fractions, durations, the bar and the ETA") {
  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(7.4) == "7s");
  CHECK(format_duration(65) == "1m05s");
  CHECK(format_duration(7380) == "2h03m");
  CHECK(render_bar(0.5, 10) == "[#####-----]");
  CHECK(render_bar(0, 4) == "[----]");
  CHECK(render_bar(2, 4) == "[####]");
  CHECK(eta_seconds(10, 0.25) == doctest::Approx(30));
  CHECK(eta_seconds(10, 0.001) < 0);
  CHECK(eta_seconds(10, 1.0) == doctest::Approx(0));

  // Monotonic through the stages of one tune.
  double last = -1;
  for (auto stage : {TuneProgress::Stage::compiling, TuneProgress::Stage::timing,
                     TuneProgress::Stage::verifying, TuneProgress::Stage::done}) {
    for (std::size_t done = 0; done <= 4; ++done) {
      TuneProgress p;
      p.stage = stage;
      p.done = done;
      p.total = 4;
      const double f = tune_fraction(p);
      CHECK(f >= last);
      CHECK(f <= 1.0);
      last = f;
    }
  }
  CHECK(last == 1.0);
}

TEST_CASE("progress: plain lines off a terminal, a bar redrawn in place on one") {
  auto drive = [](TuneProgressBar& bar) {
    bar.start(0, "64x64x64 bf16 train");
    for (auto stage : {TuneProgress::Stage::compiling, TuneProgress::Stage::timing,
                       TuneProgress::Stage::verifying}) {
      for (std::size_t i = 1; i <= 3; ++i) {
        TuneProgress p;
        p.stage = stage;
        p.done = i;
        p.total = 3;
        p.candidate = "tiled.64x64x64.w2x2.s3.g8";
        bar.update(p);
      }
    }
    bar.finish("64x64x64 bf16 train: tiled.64x64x64.w2x2.s3.g8 0.0100 ms");
    bar.start(1, "64x64x64 bf16 eval");
    bar.finish("64x64x64 bf16 eval: FAILED: no GPU");
    bar.close();
  };
  std::FILE* plain = std::tmpfile();
  REQUIRE(plain);
  TuneProgressBar p(plain, 2, false);
  drive(p);
  const std::string text = read_file(plain);
  std::fclose(plain);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find("[1/2] 64x64x64 bf16 train: compiling 3 candidates\n") != std::string::npos);
  CHECK(text.find("[1/2] 64x64x64 bf16 train: timing\n") != std::string::npos);
  CHECK(text.find("[1/2] 64x64x64 bf16 train: verifying\n") != std::string::npos);
  CHECK(text.find("[1/2] 64x64x64 bf16 train: tiled.64x64x64.w2x2.s3.g8 0.0100 ms\n") !=
        std::string::npos);
  CHECK(text.find("[2/2] 64x64x64 bf16 eval: FAILED: no GPU\n") != std::string::npos);
  CHECK(lines(text) == 5);  // a line per stage begun, and one per result

  std::FILE* tty = std::tmpfile();
  REQUIRE(tty);
  TuneProgressBar b(tty, 2, true, 80);
  drive(b);
  const std::string drawn = read_file(tty);
  std::fclose(tty);
  CHECK(drawn.find("\r\x1b[K[") != std::string::npos);
  CHECK(drawn.find("ETA") != std::string::npos);
  CHECK(drawn.find("[1/2] 64x64x64 bf16 train: tiled.64x64x64.w2x2.s3.g8 0.0100 ms\n") !=
        std::string::npos);
  // No drawn line is wider than the terminal.
  std::size_t start = 0;
  while (start < drawn.size()) {
    std::size_t end = drawn.find_first_of("\r\n", start);
    if (end == std::string::npos) end = drawn.size();
    std::string seg = drawn.substr(start, end - start);
    if (seg.starts_with("\x1b[K")) seg = seg.substr(3);
    CHECK(seg.size() < 80);
    start = end + 1;
  }
}

TEST_CASE("PlanOptions::autotune defaults from FUSEJIT_AUTOTUNE") {
  const char* old = std::getenv("FUSEJIT_AUTOTUNE");
  const std::string saved = old ? old : "";
  ::unsetenv("FUSEJIT_AUTOTUNE");
  CHECK(!PlanOptions{}.autotune);
  CHECK(PlanOptions{}.use_tuning_db);
  ::setenv("FUSEJIT_AUTOTUNE", "1", 1);
  CHECK(PlanOptions{}.autotune);
  ::setenv("FUSEJIT_AUTOTUNE", "TRUE", 1);
  CHECK(PlanOptions{}.autotune);
  ::setenv("FUSEJIT_AUTOTUNE", "0", 1);
  CHECK(!PlanOptions{}.autotune);
  ::setenv("FUSEJIT_AUTOTUNE", "", 1);
  CHECK(!PlanOptions{}.autotune);
  if (old)
    ::setenv("FUSEJIT_AUTOTUNE", saved.c_str(), 1);
  else
    ::unsetenv("FUSEJIT_AUTOTUNE");
}

TEST_CASE("fusejit autotune: bad arguments get one line and exit 2, before any GPU question") {
  const fs::path dir = temp_dir("cli-bad");
  fs::create_directories(dir);
  const fs::path bad_file = dir / "shapes.txt";
  std::ofstream(bad_file) << "# shapes\n1024x8192x8192\n64x64 # no K\n";
  const fs::path empty_file = dir / "empty.txt";
  std::ofstream(empty_file) << "# nothing\n";
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"autotune", "shapes"},
           {"autotune --shapes 64x64", "shape"},
           {"autotune --shapes 64x64x64 --dtypes fp64", "dtype"},
           {"autotune --shapes 64x64x64 --modes infer", "mode"},
           {"autotune --shapes 1x64x64 --modes train", "M"},
           {"autotune --shapes 64x64x64 --momentum lots", "momentum"},
           {"autotune --shapes 64x64x64 --device -1", "device"},
           {"autotune --shapes 64x64x64 --bogus", "bogus"},
           {"autotune --shapes 64x64x64 --shapes-file " + bad_file.string(), "not both"},
           {"autotune --shapes-file " + (dir / "missing.txt").string(), "cannot read"},
           {"autotune --shapes-file " + bad_file.string(), "shapes.txt:3"},
           {"autotune --shapes-file " + empty_file.string(), "no shape"},
       }) {
    CAPTURE(c.args);
    // Hide any GPU: argument errors must win over "no GPU".
    const Result r = run_cli(c.args, "CUDA_VISIBLE_DEVICES=");
    CHECK(r.code == 2);
    CHECK(lines(r.out) == 1);
    CHECK_MESSAGE(r.out.find(c.expect) != std::string::npos, r.out);
  }
  fs::remove_all(dir);
}

TEST_CASE("fusejit autotune without a GPU: one clear line, exit 1") {
  const fs::path dir = temp_dir("cli-nogpu");
  fs::create_directories(dir);
  const fs::path file = dir / "shapes.txt";
  std::ofstream(file) << "64x64x64, 128x128x128  # two shapes\n";
  for (const std::string& args :
       {std::string("autotune --shapes 64x64x64,128x64x32 --dtypes bf16,fp16 --modes train,eval"),
        "autotune --shapes-file " + file.string() + " --json"}) {
    CAPTURE(args);
    // CUDA_VISIBLE_DEVICES= hides every GPU, so this holds on GPU machines too.
    const Result r =
        run_cli(args + " --cache-dir " + (dir / "cache").string(), "CUDA_VISIBLE_DEVICES=");
    CHECK(r.code == 1);
    CHECK(lines(r.out) == 1);
    CHECK_MESSAGE(r.out.find("no GPU") != std::string::npos, r.out);
    CHECK(!fs::exists(dir / "cache" / "tuning"));
  }
  fs::remove_all(dir);
}

namespace {

// A database's identity as autotune on an A100 would write it (made by hand: no GPU here).
TuningIdentity a100_identity() {
  TuningIdentity id;
  id.name = "NVIDIA A100-SXM4-80GB";
  id.cc = 80;
  id.driver = 13000;
  id.nvrtc = "13.0";
  id.fusejit = "test";
  id.fingerprint = "NVIDIA A100-SXM4-80GB|cc80|driver13000|nvrtc13.0|fusejittest";
  return id;
}

}  // namespace

TEST_CASE("fusejit compile --from-db compiles the tuned winners without a GPU") {
  const fs::path dir = temp_dir("fromdb");
  const std::string cache = (dir / "cache").string();
  // A database as autotune on an A100 would leave it: a fused winner, a reference winner
  // (its plain kernels and its best fused config), and a warpspec winner that sm_80 cannot run.
  const TuningDb db(TuningDb::default_dir(cache), a100_identity());
  auto add = [&](const Problem& p, const std::string& winner, const std::string& best_fused) {
    TuningEntry e;
    e.problem = p;
    e.winner = winner;
    e.winner_ms = 0.01;
    e.reference_ms = 0.012;
    e.best_fused = best_fused;
    e.best_fused_ms = 0.011;
    e.timestamp = 1700000000;
    REQUIRE(db.record(e));
  };
  add(problem(64, 64, 64, DType::bf16, Mode::eval), "tiled.64x64x64.w2x2.s3.g8",
      "tiled.64x64x64.w2x2.s3.g8");
  add(problem(100, 72, 40), std::string(kReferenceCandidate), "tiled.64x128x64.w2x2.s3.g8");
  add(problem(256, 256, 256), "warpspec.128x128x64.c2.s6.g8.cl1.p1",
      "warpspec.128x128x64.c2.s6.g8.cl1.p1");
  // The reference won, and its best fused config cannot run on sm_80: a Plan there still
  // builds fused kernels (the heuristic's), which --from-db used to leave cold.
  add(problem(512, 128, 64), std::string(kReferenceCandidate),
      "warpspec.128x128x64.c2.s6.g8.cl1.p1");
  // What a Plan on sm_80 loads for each entry, by the library's own rule.
  const Device a100 = Device::for_arch("sm_80");
  const auto table = db.table();
  std::set<std::string> plan_loads;
  for (const auto& [key, e] : table->entries)
    for (const auto& src : plan_sources(e.problem, choose_from_table(*table, e.problem, a100)))
      plan_loads.insert(src.name);
  CHECK(plan_loads.size() == 5);  // the two reference winners share the plain kernels

  const Result first = run_cli("compile --from-db --cache-dir " + cache, "CUDA_VISIBLE_DEVICES=");
  REQUIRE_MESSAGE(first.code == 0, first.out);
  CHECK(first.out.find("for sm_80") != std::string::npos);
  CHECK(first.out.find("5 kernel set(s): 0 hit, 5 compiled") != std::string::npos);
  for (const auto& name : plan_loads)
    CHECK_MESSAGE(first.out.find(name) != std::string::npos, name);
  CHECK(first.out.find("skip 256x256x256 warpspec") != std::string::npos);
  CHECK(first.out.find("fj.reference.bf16") != std::string::npos);  // the reference's kernels
  // The deployment image is warm: a second run (explicit file) only hits.
  const Result second = run_cli("compile --from-db " + db.path().string() + " --cache-dir " + cache,
                                "CUDA_VISIBLE_DEVICES=");
  CHECK(second.code == 0);
  CHECK_MESSAGE(second.out.find("5 kernel set(s): 5 hit, 0 compiled") != std::string::npos,
                second.out);
  // For another arch the warpspec winner can run.
  const Result hopper =
      run_cli("compile --from-db --arch sm_90a --cache-dir " + cache, "CUDA_VISIBLE_DEVICES=");
  CHECK(hopper.code == 0);
  CHECK(hopper.out.find("5 kernel set(s)") != std::string::npos);

  // Errors: the problems come from the database (2); a damaged database (1); none at all (1).
  Result r = run_cli("compile --from-db --shapes 64x64x64 --cache-dir " + cache);
  CHECK(r.code == 2);
  CHECK(lines(r.out) == 1);
  CHECK(r.out.find("from-db") != std::string::npos);
  const fs::path damaged = dir / "damaged.json";
  std::ofstream(damaged) << "{\"schema\": \"fusejit-tuning-db\"";
  r = run_cli("compile --from-db " + damaged.string() + " --cache-dir " + cache);
  CHECK(r.code == 1);
  CHECK(r.out.find("is damaged") != std::string::npos);
  CHECK(r.out.find("damaged or unreadable tuning database: " + damaged.string()) !=
        std::string::npos);
  // One bad file among good ones costs only itself: the good database's kernels are still
  // compiled (hits here), the bad one is named, and the run fails. A FIFO does not hang it.
  const fs::path tuning = fs::path(cache) / "tuning";
  std::ofstream(tuning / "zz-damaged.json") << "{\"schema\": 3}";
  REQUIRE(::mkfifo((tuning / "zz-fifo.json").c_str(), 0600) == 0);
  r = run_cli("compile --from-db --cache-dir " + cache, "CUDA_VISIBLE_DEVICES=");
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.out.find("5 kernel set(s): 5 hit, 0 compiled") != std::string::npos, r.out);
  CHECK(r.out.find("damaged or unreadable tuning database: " +
                   (tuning / "zz-damaged.json").string()) != std::string::npos);
  CHECK(r.out.find("damaged or unreadable tuning database: " +
                   (tuning / "zz-fifo.json").string()) != std::string::npos);
  fs::remove(tuning / "zz-damaged.json");
  fs::remove(tuning / "zz-fifo.json");
  r = run_cli("compile --from-db --cache-dir " + (dir / "empty").string());
  CHECK(r.code == 1);
  CHECK(lines(r.out) == 1);
  CHECK(r.out.find("no tuning database") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("fusejit compile --from-db warms the backward entries' kernel sets too") {
  const fs::path dir = temp_dir("fromdb-backward");
  const std::string cache = (dir / "cache").string();
  const TuningDb db(TuningDb::default_dir(cache), a100_identity());
  const Device a100 = Device::for_arch("sm_80");
  auto add = [&](const Problem& p, const std::string& winner) {
    TuningEntry e;
    e.problem = p;
    e.winner = winner;
    e.winner_ms = 0.05;
    e.best_fused = winner;
    e.best_fused_ms = 0.05;
    e.timestamp = 1700000000;
    REQUIRE(db.record(e, TunedPass::backward));
  };
  // A tiled pair the A100 runs, and a warpspec pair it cannot (its plan falls back to the
  // heuristic's pair, which is what must be warm).
  const Problem tiled = problem(256, 128, 96),
                hopper_only = problem(200, 64, 64, DType::bf16, Mode::eval);
  KernelConfig other = default_backward_config(tiled, a100).dw;
  other.stages = other.stages == 3 ? 4 : 3;
  const BackwardConfig tuned{default_backward_config(tiled, a100).dx, other};
  add(tiled, tuned.key());
  add(hopper_only, "dx.warpspec.128x128x64.c2.s4.g8.cl1.p1.dw.warpspec.128x128x64.c2.s4.g8.cl1.p1");
  const std::string want_tuned = generate_backward(tiled, tuned).name;
  const std::string want_fallback =
      generate_backward(hopper_only, default_backward_config(hopper_only, a100)).name;

  const Result first = run_cli("compile --from-db --cache-dir " + cache, "CUDA_VISIBLE_DEVICES=");
  REQUIRE_MESSAGE(first.code == 0, first.out);
  CHECK(first.out.find("2 kernel set(s): 0 hit, 2 compiled") != std::string::npos);
  CHECK_MESSAGE(first.out.find(want_tuned) != std::string::npos, first.out);
  CHECK_MESSAGE(first.out.find(want_fallback) != std::string::npos, first.out);
  CHECK(first.out.find("skip backward 200x64x64") != std::string::npos);
  // What a BackwardPlan on sm_80 chooses, by the library's rule, is exactly what was warmed.
  CHECK(choose_backward_from_table(*db.table(), tiled, a100).config.key() == tuned.key());
  // compile --backward skips, and names, a problem the backward pass refuses; its forward set
  // still compiles and the command succeeds.
  const Result refused = run_cli(
      "compile --arch sm_80 --shapes 64x64x64 --dtypes bf16 --modes train --stat-ranks 2 "
      "--backward --cache-dir " +
      cache);
  CHECK_MESSAGE(refused.code == 0, refused.out);
  CHECK(refused.out.find("no backward kernel set") != std::string::npos);
  CHECK(refused.out.find("stat_ranks") != std::string::npos);
  CHECK(refused.out.find("1 kernel set(s)") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("fusejit compile --from-db warms every binary, also those a set's name does not tell") {
  // A set's name gives dtype, mode, N, K and the config, not the bias or eps, which change the
  // source and so the binary's cache key: two layers that differ only there need two sets. (The
  // command once kept one job per name and left the second cold.)
  const fs::path dir = temp_dir("fromdb-names");
  const std::string cache = (dir / "cache").string();
  const TuningDb db(TuningDb::default_dir(cache), a100_identity());
  const std::string tile = "tiled.64x64x64.w2x2.s3.g8";
  auto add = [&](const Problem& p) {
    TuningEntry e;
    e.problem = p;
    e.winner = e.best_fused = tile;
    e.winner_ms = 0.01;
    e.best_fused_ms = 0.01;
    e.timestamp = 1700000000;
    REQUIRE(db.record(e));
  };
  Problem biased = problem(64, 64, 64, DType::bf16, Mode::eval), plain = biased, loose = biased;
  plain.has_bias = false;
  loose.eps = 1e-3;
  for (const Problem& p : {biased, plain, loose}) add(p);
  const Result r = run_cli("compile --from-db --cache-dir " + cache, "CUDA_VISIBLE_DEVICES=");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(r.out.find("3 kernel set(s): 0 hit, 3 compiled") != std::string::npos, r.out);
  // Each Plan of the three finds its set warm: the cache holds what each one's source keys.
  const DiskCache disk(cache);
  for (const Problem& p : {biased, plain, loose}) {
    CAPTURE(p.key());
    const std::vector<KernelSource> srcs =
        plan_sources(p, choose_from_table(*db.table(), p, Device::for_arch("sm_80")));
    REQUIRE(srcs.size() == 1);
    CHECK(disk.load(cache_key(srcs[0], "sm_80", nvrtc_version())).has_value());
  }
  fs::remove_all(dir);
}
