// The tuning database without a GPU: round trip, atomic writes under concurrent writers and
// readers (separate processes), damaged files set aside with one warning, the nearest-bucket
// rule and the dispatch order (exact -> bucket -> heuristic, winners checked with valid_for).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/tune/dispatch.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/log.hpp"

using namespace fusejit;
namespace fs = std::filesystem;

namespace {

// A fingerprint made by hand: no NVRTC call, so forked children stay simple.
TuningIdentity identity(int cc, const std::string& gpu = "Test GPU") {
  TuningIdentity id;
  id.name = gpu;
  id.cc = cc;
  id.driver = 13000;
  id.nvrtc = "13.0";
  id.fusejit = "test";
  id.fingerprint = fmt::format("{}|cc{}|driver13000|nvrtc13.0|fusejittest", gpu, cc);
  return id;
}

Problem problem(std::int64_t M, std::int64_t N, std::int64_t K, DType d = DType::bf16,
                Mode m = Mode::train) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

constexpr const char* kTiled = "tiled.128x128x64.w2x2.s3.g8";
constexpr const char* kTiledBig = "tiled.128x256x64.w2x4.s3.g8";  // too much smem for sm_86
constexpr const char* kWarpspec = "warpspec.128x256x64.c2.s4.g8.cl1.p1";

TuningEntry entry(const Problem& p, const std::string& winner, double ms = 0.5) {
  TuningEntry e;
  e.problem = p;
  e.winner = winner;
  e.winner_ms = ms;
  e.reference_ms = ms * 1.25;
  if (winner != kReferenceCandidate) {
    e.best_fused = winner;
    e.best_fused_ms = ms;
    e.runner_up = std::string(kReferenceCandidate);
    e.runner_up_ms = ms * 1.25;
  } else {
    e.best_fused = kTiled;
    e.best_fused_ms = ms * 1.5;
    e.runner_up = kTiled;
    e.runner_up_ms = ms * 1.5;
  }
  e.error = 1.5e-3;
  e.candidates = 12;
  e.timestamp = 1700000000;
  return e;
}

fs::path temp_dir(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() /
                     fmt::format("fusejit-tuningdb-{}-{}", tag, static_cast<long>(::getpid()));
  fs::remove_all(p);
  return p;
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

void check_same(const TuningEntry& a, const TuningEntry& b) {
  CHECK(a.problem.key() == b.problem.key());
  CHECK(a.winner == b.winner);
  CHECK(a.winner_ms == b.winner_ms);
  CHECK(a.reference_ms == b.reference_ms);
  CHECK(a.runner_up == b.runner_up);
  CHECK(a.runner_up_ms == b.runner_up_ms);
  CHECK(a.best_fused == b.best_fused);
  CHECK(a.best_fused_ms == b.best_fused_ms);
  CHECK(a.error == b.error);
  CHECK(a.candidates == b.candidates);
  CHECK(a.timestamp == b.timestamp);
}

}  // namespace

TEST_CASE("file names are readable, safe and distinct per fingerprint") {
  const std::string a = TuningDb::file_name("NVIDIA H100 80GB HBM3|cc90|driver13000|nvrtc13.0");
  const std::string b = TuningDb::file_name("NVIDIA H100 80GB HBM3|cc90|driver13010|nvrtc13.0");
  CHECK(a != b);
  CHECK(a.starts_with("NVIDIA_H100_80GB_HBM3_cc90_driver13000_nvrtc13.0-"));
  CHECK(a.ends_with(".json"));
  const std::string evil = TuningDb::file_name("../../etc/passwd");
  CHECK(evil.find('/') == std::string::npos);
  CHECK(evil.front() != '.');
  CHECK(TuningDb::default_dir("/x/cache") == fs::path("/x/cache/tuning"));
}

TEST_CASE("entries round-trip through the file, exactly") {
  const fs::path dir = temp_dir("roundtrip");
  const TuningDb db(dir, identity(90));
  Problem odd = problem(1000, 200, 72, DType::fp16, Mode::eval);
  odd.param_dtype = DType::fp16;
  odd.momentum = std::nullopt;
  odd.eps = 1e-3;
  odd.has_scale = false;
  odd.ldx = 80;
  odd.ldy = 208;
  const TuningEntry fused = entry(problem(1024, 8192, 8192), kWarpspec, 0.71);
  const TuningEntry ref = entry(odd, std::string(kReferenceCandidate), 0.02);
  CHECK(db.record(fused));
  CHECK(db.record(ref));
  CHECK(db.path() == dir / TuningDb::file_name(identity(90).fingerprint));
  REQUIRE(fs::exists(db.path()));

  // Another handle on the same file, and the file itself parsed from scratch.
  const TuningDb again(dir, identity(90));
  auto f = again.find(fused.problem);
  auto r = again.find(odd);
  REQUIRE(f);
  REQUIRE(r);
  check_same(*f, fused);
  check_same(*r, ref);
  CHECK(r->problem.key() == odd.key());  // strides, eps, momentum=None, presence all kept
  const TuningTable t = parse_tuning_table(read_text(db.path()));
  CHECK(t.identity.fingerprint == identity(90).fingerprint);
  CHECK(t.identity.cc == 90);
  CHECK(t.entries.size() == 2);
  CHECK(tuning_table_json(t) == read_text(db.path()));  // canonical text
  CHECK(!again.find(problem(64, 64, 64)));

  // Replacing an entry keeps the others.
  CHECK(db.record(entry(fused.problem, kTiled, 0.9)));
  CHECK(again.find(fused.problem)->winner == kTiled);
  CHECK(again.find(odd));
  fs::remove_all(dir);
}

TEST_CASE("record refuses an entry it could not read back") {
  const fs::path dir = temp_dir("refuse");
  const TuningDb db(dir, identity(80));
  TuningEntry bad = entry(problem(64, 64, 64), kTiled);
  bad.winner = "tiled.fast";
  CHECK_THROWS_AS(db.record(bad), InvalidArgument);
  bad = entry(problem(64, 64, 64), kTiled);
  bad.winner_ms = -1;
  CHECK_THROWS_AS(db.record(bad), InvalidArgument);
  CHECK(!fs::exists(db.path()));
  fs::remove_all(dir);
}

TEST_CASE("another process's write is noticed (the in-memory copy follows the file)") {
  const fs::path dir = temp_dir("reload");
  const TuningDb db(dir, identity(80));
  const Problem a = problem(256, 256, 256), b = problem(512, 512, 512);
  REQUIRE(db.record(entry(a, kTiled)));
  REQUIRE(db.find(a));
  TuningTable other;
  other.identity = identity(80);
  other.entries[b.key()] = entry(b, kTiled);
  // Written the way a writer does it: a new file renamed over the old one.
  write_text(dir / "replacement.tmp", tuning_table_json(other));
  fs::rename(dir / "replacement.tmp", db.path());
  CHECK(db.find(b));
  CHECK(!db.find(a));
  fs::remove_all(dir);
}

TEST_CASE("concurrent writers keep every entry; concurrent readers never see a partial file") {
  const fs::path dir = temp_dir("atomic");
  const TuningIdentity id = identity(90);
  const TuningDb db(dir, id);
  constexpr int kWriters = 4, kPerWriter = 12, kReaders = 3;
  const auto warnings = log_warning_count();
  // Children must not inherit (and print again) what the parent has buffered.
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> kids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const TuningDb mine(dir, id);
      for (int i = 0; i < kPerWriter; ++i)
        if (!mine.record(entry(problem(64 * (w + 1), 64 * (i + 1), 128), kTiled, 0.1 + i)))
          ::_exit(3);
      ::_exit(log_warning_count() == warnings ? 0 : 4);
    }
    kids.push_back(pid);
  }
  for (int r = 0; r < kReaders; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const TuningDb mine(dir, id);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      int reads = 0;
      for (;;) {
        // Raw text first: every complete read must parse. Then through the database, which
        // would set a damaged file aside (and warn) if it ever saw one.
        const std::string text = read_text(db.path());
        std::size_t entries = 0;
        if (!text.empty()) {
          try {
            entries = parse_tuning_table(text).entries.size();
          } catch (const std::exception&) {
            ::_exit(5);
          }
          ++reads;
        }
        mine.table();
        if (entries == std::size_t{kWriters * kPerWriter}) break;
        if (std::chrono::steady_clock::now() > deadline) ::_exit(6);
      }
      ::_exit(reads > 0 && log_warning_count() == warnings ? 0 : 7);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(db.table()->entries.size() == std::size_t{kWriters * kPerWriter});
  for (const std::string& name : names_in(dir)) {
    CAPTURE(name);
    CHECK(name.find(".tmp") == std::string::npos);
    CHECK(name.find(".damaged-") == std::string::npos);
  }
  CHECK(log_warning_count() == warnings);
  fs::remove_all(dir);
}

TEST_CASE("a damaged file is set aside with one warning and never trusted") {
  TuningTable good;
  good.identity = identity(90);
  const Problem p = problem(1024, 1024, 1024);
  good.entries[p.key()] = entry(p, kTiled);
  const std::string text = tuning_table_json(good);
  auto mutate = [&](auto&& f) {
    nlohmann::json j = nlohmann::json::parse(text);
    f(j, j["entries"][p.key()]);
    return j.dump(2);
  };
  TuningTable other = good;
  other.identity = identity(90, "Another GPU");
  struct Case {
    std::string what, text;
  };
  const std::vector<Case> cases = {
      {"not JSON", "{ this is not json"},
      {"empty", ""},
      {"truncated", text.substr(0, text.size() / 2)},
      {"deep nesting", std::string(200, '[') + std::string(200, ']')},
      {"an array", "[]"},
      {"another schema", mutate([](auto& j, auto&) { j["schema"] = "something-else"; })},
      {"a future version", mutate([](auto& j, auto&) { j["version"] = 3; })},
      {"a backward_entries field in a version 1 file",
       mutate([](auto& j, auto&) { j["version"] = 1; })},
      {"a missing field", mutate([](auto&, auto& e) { e.erase("winner_ms"); })},
      {"a wrong type", mutate([](auto&, auto& e) { e["problem"]["M"] = "1024"; })},
      {"an invalid problem", mutate([](auto&, auto& e) { e["problem"]["alignment"] = 3; })},
      {"a key that is not its problem's",
       mutate([](auto&, auto& e) { e["problem"]["eps"] = 1e-3; })},
      {"a bad config key", mutate([](auto&, auto& e) { e["winner"] = "tiled.fast"; })},
      {"a negative time", mutate([](auto&, auto& e) { e["winner_ms"] = -0.5; })},
      {"another GPU's file", tuning_table_json(other)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const fs::path dir = temp_dir("damaged");
    const TuningDb db(dir, identity(90));
    write_text(db.path(), c.text);
    // The explicit reader (compile --from-db) reports it and leaves it alone...
    if (c.what != "another GPU's file") {
      CHECK_THROWS_AS(read_tuning_file(db.path()), Error);
      CHECK(fs::exists(db.path()));
    }
    // ...the database sets it aside, warns once, and reads as empty.
    const auto before = log_warning_count();
    CHECK(db.table()->entries.empty());
    CHECK(!db.find(p));
    CHECK(log_warning_count() == before + 1);
    CHECK(!fs::exists(db.path()));
    int aside = 0;
    for (const std::string& name : names_in(dir)) {
      if (name.starts_with(db.path().filename().string() + ".damaged-")) {
        ++aside;
        CHECK(read_text(dir / name) == c.text);  // kept for a post-mortem, byte for byte
      }
    }
    CHECK(aside == 1);
    CHECK(db.table()->entries.empty());
    CHECK(log_warning_count() == before + 1);
    // Recording afterwards starts a good file.
    CHECK(db.record(entry(p, kTiled)));
    CHECK(db.find(p));
    CHECK_NOTHROW(read_tuning_file(db.path()));
    fs::remove_all(dir);
  }
}

TEST_CASE("an unwritable database keeps results in memory, with one warning") {
  // A directory under a regular file cannot be created, even by root.
  const TuningDb db("/dev/null/tuning", identity(80));
  const auto before = log_warning_count();
  const Problem a = problem(96, 96, 96), b = problem(160, 160, 160);
  CHECK(!db.record(entry(a, kTiled)));
  CHECK(log_warning_count() == before + 1);
  CHECK(!db.record(entry(b, kTiled)));
  CHECK(log_warning_count() == before + 1);
  CHECK(db.find(a));
  CHECK(db.find(b));
}

TEST_CASE("bucket rule: same kind of problem, nearest in log2 space, within 4x per dimension") {
  TuningTable t;
  t.identity = identity(80);
  auto add = [&](const Problem& p, const char* w) { t.entries[p.key()] = entry(p, w); };
  const Problem small = problem(1024, 1024, 1024), large = problem(8192, 1024, 1024);
  add(small, kTiled);
  add(large, kTiledBig);

  // 3000 rows: linearly nearer 1024, but log2(3000/1024) = 1.55 > log2(8192/3000) = 1.45.
  auto m = nearest_bucket(t, problem(3000, 1024, 1024));
  REQUIRE(m);
  CHECK(m->entry->problem.key() == large.key());
  CHECK(m->distance == doctest::Approx(std::log2(8192.0 / 3000.0)));
  CHECK(log2_distance(problem(2048, 512, 4096), small) == doctest::Approx(4.0));

  // The distance sums over M, N and K.
  m = nearest_bucket(t, problem(1024, 2048, 2048));
  REQUIRE(m);
  CHECK(m->entry->problem.key() == small.key());
  CHECK(m->distance == doctest::Approx(2.0));

  // Exactly 4x is inside the radius, beyond it is not (in any one dimension).
  CHECK(nearest_bucket(t, problem(1024, 1024, 4096)));
  CHECK(!nearest_bucket(t, problem(1024, 1024, 4097)));
  CHECK(!nearest_bucket(t, problem(1024, 255, 1024)));
  CHECK(nearest_bucket(t, problem(256, 1024, 1024)));

  // Only problems of the same kind are neighbours.
  CHECK(!nearest_bucket(t, problem(1024, 1024, 1024, DType::fp16)));
  CHECK(!nearest_bucket(t, problem(1024, 1024, 1024, DType::bf16, Mode::eval)));
  Problem q = problem(1024, 1024, 1024);
  q.param_dtype = DType::bf16;
  CHECK(!nearest_bucket(t, q));
  q = problem(1024, 1024, 1024);
  q.has_bias = false;
  CHECK(!nearest_bucket(t, q));
  q = problem(1024, 1024, 1024);
  q.has_affine = false;
  CHECK(!nearest_bucket(t, q));
  q = problem(1024, 1024, 1024);
  q.alignment = 8;
  CHECK(!nearest_bucket(t, q));
  CHECK(!same_bucket(q, small));
  // Momentum, eps and strides do not change the bucket.
  q = problem(1024, 1024, 1000);
  q.momentum = std::nullopt;
  q.eps = 1e-3;
  q.ldx = 1008;
  q.ldw = 1016;
  CHECK(same_bucket(q, small));
  CHECK(nearest_bucket(t, q));
}

TEST_CASE("dispatch: exact entry, then the nearest valid bucket, then the heuristic") {
  const Device sm80 = Device::for_arch("sm_80"), sm86 = Device::for_arch("sm_86");
  const Device sm90 = Device::for_arch("sm_90a");
  TuningTable t;
  t.identity = identity(80);
  const Problem tuned = problem(1024, 1024, 1024);
  t.entries[tuned.key()] = entry(tuned, kTiledBig);

  KernelChoice c = choose_from_table(t, tuned, sm80);
  CHECK(c.source == KernelChoice::Source::exact);
  CHECK(c.config.key() == kTiledBig);
  CHECK(!c.reference);

  const Problem near = problem(2048, 1024, 1024);
  c = choose_from_table(t, near, sm80);
  CHECK(c.source == KernelChoice::Source::bucket);
  CHECK(c.config.key() == kTiledBig);

  // The same winner cannot run on sm_86 (shared memory): never used, the heuristic decides.
  REQUIRE(!KernelConfig::parse(kTiledBig).valid_for(near, sm86));
  c = choose_from_table(t, near, sm86);
  CHECK(c.source == KernelChoice::Source::heuristic);
  CHECK(c.config.key() == default_config(near, sm86).key());
  c = choose_from_table(t, tuned, sm86);  // an exact entry that cannot run falls through too
  CHECK(c.source == KernelChoice::Source::heuristic);

  // Too far: the heuristic.
  c = choose_from_table(t, problem(1024, 1024, 8192), sm80);
  CHECK(c.source == KernelChoice::Source::heuristic);
  CHECK(c.config.key() == default_config(problem(1024, 1024, 8192), sm80).key());

  // A warpspec winner runs on sm_90a only; an exact entry beats a nearer-looking bucket.
  TuningTable h;
  h.identity = identity(90);
  const Problem hp = problem(4096, 4096, 4096);
  h.entries[hp.key()] = entry(hp, kWarpspec);
  const Problem other = problem(2048, 4096, 4096);
  h.entries[other.key()] = entry(other, kTiled);
  c = choose_from_table(h, hp, sm90);
  CHECK(c.source == KernelChoice::Source::exact);
  CHECK(c.config.key() == kWarpspec);
  c = choose_from_table(h, problem(4096, 4096, 3000), sm90);
  CHECK(c.source == KernelChoice::Source::bucket);
  CHECK(c.config.key() == kWarpspec);
  c = choose_from_table(h, hp, sm80);
  CHECK(c.source != KernelChoice::Source::exact);
  CHECK(c.config.variant == Variant::tiled);

  // The reference winner: run the reference op, report the best fused config.
  TuningTable r;
  r.identity = identity(80);
  const Problem rp = problem(512, 64, 4096, DType::bf16, Mode::eval);
  r.entries[rp.key()] = entry(rp, std::string(kReferenceCandidate));
  c = choose_from_table(r, rp, sm80);
  CHECK(c.source == KernelChoice::Source::exact);
  CHECK(c.reference);
  CHECK(c.config.key() == kTiled);
  // 600 rows: the same layer and M class (257..1024) as the entry.
  c = choose_from_table(r, problem(600, 64, 4096, DType::bf16, Mode::eval), sm80);
  CHECK(c.source == KernelChoice::Source::m_class);
  CHECK(c.reference);
  // 1100 rows: the next class; the nearest-bucket rule still finds the entry.
  c = choose_from_table(r, problem(1100, 64, 4096, DType::bf16, Mode::eval), sm80);
  CHECK(c.source == KernelChoice::Source::bucket);
  CHECK(c.reference);
}

TEST_CASE("dispatch: a tuned M serves its layer's whole M class, as the dynamic-M twin") {
  const Device sm80 = Device::for_arch("sm_80");
  TuningTable t;
  t.identity = identity(80);
  const std::string exact = std::string(kTiled) + ".xm";
  const Problem at1000 = problem(1000, 256, 512), at3000 = problem(3000, 256, 512);
  t.entries[at1000.key()] = entry(at1000, exact);
  t.entries[at3000.key()] = entry(at3000, kTiled);
  // Its own M: the exact-M config as tuned.
  KernelChoice c = choose_from_table(t, at1000, sm80);
  CHECK(c.source == KernelChoice::Source::exact);
  CHECK(c.config.exact_m);
  // Another M of the class 257..1024: the same config without exact M (one kernel set).
  for (const std::int64_t m : {257, 700, 1024}) {
    CAPTURE(m);
    c = choose_from_table(t, problem(m, 256, 512), sm80);
    CHECK(c.source == KernelChoice::Source::m_class);
    CHECK(c.config.key() == kTiled);
  }
  // 2049..4096 holds only M = 3000, even where M = 1000 is nearer by ratio.
  c = choose_from_table(t, problem(2100, 256, 512), sm80);
  CHECK(c.source == KernelChoice::Source::m_class);
  CHECK(c.detail.find("M = 3000") != std::string::npos);
  // Another layer (N differs) never counts as the same class.
  c = choose_from_table(t, problem(700, 128, 512), sm80);
  CHECK(c.source != KernelChoice::Source::m_class);
  CHECK(same_m_class(t, problem(700, 128, 512)) == nullptr);
  CHECK(same_m_class(t, problem(5000, 256, 512)) == nullptr);
  // An exact entry that cannot run here does not hide a usable one of its class.
  const Device sm86 = Device::for_arch("sm_86");
  TuningTable mixed;
  mixed.identity = identity(86);
  const Problem at700 = problem(700, 256, 512);
  mixed.entries[at1000.key()] = entry(at1000, kTiledBig);
  mixed.entries[at700.key()] = entry(at700, kTiled);
  CHECK(same_m_class(mixed, at1000)->problem.M == 700);
  c = choose_from_table(mixed, at1000, sm86);
  CAPTURE(c.detail);
  CHECK(c.source == KernelChoice::Source::m_class);
  CHECK(c.config.key() == kTiled);
  CHECK(c.detail.find("tuned entry skipped") != std::string::npos);
}

TEST_CASE("M classes: bounds as documented, each inside one schedule class of every tile") {
  CHECK(m_class(1).lo == 1);
  CHECK(m_class(64).hi == 64);
  CHECK(m_class(65).lo == 65);
  CHECK(m_class(128).hi == 128);
  CHECK(m_class(1000).lo == 257);
  CHECK(m_class(1000).hi == 1024);
  CHECK(m_class(16385).hi == kMaxDim);
  CHECK(m_class(16385).representative() == 65536);
  int classes = 0;
  for (std::int64_t m = 1; m <= 8192; m = m_class(m).hi + 1) ++classes;
  CHECK(classes == kMaxMClassesUpTo8192);
  // No class straddles the tile heights fusejit uses (64, 128): whether a train plan is
  // single-pass is the same for every M of a class (folded apply or not is each run's choice).
  for (const std::int64_t bm : {64, 128})
    for (std::int64_t m = 1; m < 100000; m = m_class(m).hi + 1) {
      const MClass c = m_class(m);
      CHECK((c.hi <= bm) == (c.lo <= bm));
    }
}

TEST_CASE("dispatch heuristic: the reference op for strict fp32 with a long K, else fused") {
  const Device sm80 = Device::for_arch("sm_80"), sm90 = Device::for_arch("sm_90a");
  const TuningTable empty;
  for (const Device& d : {sm80, sm90}) {
    CAPTURE(d.arch());
    for (Mode m : {Mode::train, Mode::eval}) {
      // Large with K >= 1024, or K >= 1536 at any size: SGEMM + BatchNorm passes.
      for (const Problem& p :
           {problem(2048, 2048, 1024, DType::fp32, m), problem(1024, 8192, 8192, DType::fp32, m),
            problem(16384, 4096, 4096, DType::fp32, m), problem(2048, 2047, 4096, DType::fp32, m),
            problem(64, 256, 8192, DType::fp32, m)}) {
        CAPTURE(p.key());
        const KernelChoice c = choose_from_table(empty, p, d);
        CHECK(c.source == KernelChoice::Source::heuristic);
        CHECK(c.reference);
        CHECK(c.config.key() == default_config(p, d).key());  // still reported
      }
      // Short K, K < 1536 with a small output, or another dtype: the fused kernels.
      for (const Problem& p :
           {problem(8192, 8192, 512, DType::fp32, m), problem(1024, 1024, 1024, DType::fp32, m),
            problem(2048, 2047, 1024, DType::fp32, m), problem(1024, 2048, 1535, DType::fp32, m),
            problem(4096, 4096, 4096, DType::tf32, m), problem(4096, 4096, 4096, DType::bf16, m),
            problem(4096, 4096, 4096, DType::fp16, m)}) {
        CAPTURE(p.key());
        const KernelChoice c = choose_from_table(empty, p, d);
        CHECK(c.source == KernelChoice::Source::heuristic);
        CHECK(!c.reference);
      }
    }
  }
  // A tuned fused winner still beats the heuristic's preference.
  TuningTable t;
  t.identity = identity(80);
  const Problem fp = problem(4096, 4096, 4096, DType::fp32, Mode::eval);
  const std::string fp32_tiled = "tiled.128x128x32.w4x2.s3.g8";
  REQUIRE(KernelConfig::parse(fp32_tiled).valid_for(fp, sm80));
  t.entries[fp.key()] = entry(fp, fp32_tiled);
  const KernelChoice c = choose_from_table(t, fp, sm80);
  CHECK(c.source == KernelChoice::Source::exact);
  CHECK(!c.reference);
  CHECK(c.config.key() == fp32_tiled);
}

namespace {

// A backward entry as tune_backward records it: the winner (a BackwardConfig key) is also the
// best fused one; no cuBLASLt contender.
TuningEntry backward_entry(const Problem& p, const std::string& winner, double ms = 0.5) {
  TuningEntry e;
  e.problem = p;
  e.winner = winner;
  e.winner_ms = ms;
  e.best_fused = winner;
  e.best_fused_ms = ms;
  e.error = 2e-3;
  e.candidates = 30;
  e.timestamp = 1700000000;
  return e;
}

const std::string kBackwardTiled = std::string("dx.") + kTiled + ".dw." + kTiled;
const std::string kBackwardWarpspec =
    "dx.warpspec.128x128x64.c2.s4.g8.cl1.p1.dw.warpspec.128x256x64.c2.s3.g8.cl1.p1";

}  // namespace

TEST_CASE("backward entries: their own map in the file, round trip, forward entries untouched") {
  const fs::path dir = temp_dir("backward");
  const TuningDb db(dir, identity(90));
  const Problem p = problem(1024, 8192, 8192);
  REQUIRE(db.record(entry(p, kWarpspec, 0.4)));
  REQUIRE(db.record(backward_entry(p, kBackwardWarpspec, 0.6), TunedPass::backward));
  const TuningDb again(dir, identity(90));
  const auto f = again.find(p);
  const auto b = again.find(p, TunedPass::backward);
  REQUIRE(f);
  REQUIRE(b);
  CHECK(f->winner == kWarpspec);
  check_same(*b, backward_entry(p, kBackwardWarpspec, 0.6));
  CHECK(!again.find(problem(64, 64, 64), TunedPass::backward));
  const std::string text = read_text(db.path());
  const TuningTable t = parse_tuning_table(text);
  CHECK(t.entries.size() == 1);
  CHECK(t.backward.size() == 1);
  CHECK(tuning_table_json(t) == text);
  // A file written before backward entries existed (version 1) has none and still reads.
  auto j = nlohmann::json::parse(text);
  CHECK(j["version"] == 2);
  j.erase("backward_entries");
  j["version"] = 1;
  const TuningTable old = parse_tuning_table(j.dump());
  CHECK(old.entries.size() == 1);
  CHECK(old.backward.empty());
  fs::remove_all(dir);
}

TEST_CASE("backward entries: a forward key, the reference or a cuBLASLt time is damage") {
  const fs::path dir = temp_dir("backward-bad");
  const TuningDb db(dir, identity(90));
  const Problem p = problem(256, 256, 256);
  CHECK_THROWS_AS(db.record(backward_entry(p, kTiled), TunedPass::backward), InvalidArgument);
  TuningEntry ref = backward_entry(p, kBackwardTiled);
  ref.winner = std::string(kReferenceCandidate);
  CHECK_THROWS_AS(db.record(ref, TunedPass::backward), InvalidArgument);
  TuningEntry timed = backward_entry(p, kBackwardTiled);
  timed.reference_ms = 0.3;
  CHECK_THROWS_AS(db.record(timed, TunedPass::backward), InvalidArgument);
  // ...and the forward map refuses a backward key.
  CHECK_THROWS_AS(db.record(backward_entry(p, kBackwardTiled)), InvalidArgument);
  CHECK(!fs::exists(db.path()));
  // The same damage in a file: the read names the backward entry.
  TuningTable t;
  t.identity = identity(90);
  t.backward[p.key()] = backward_entry(p, kBackwardTiled);
  auto j = nlohmann::json::parse(tuning_table_json(t));
  j["backward_entries"][p.key()]["winner"] = kTiled;
  try {
    parse_tuning_table(j.dump());
    FAIL("a backward entry with a forward key was read");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("backward entry") != std::string::npos);
  }
  // A backward entry filed under another momentum than the default is damage too (the backward
  // ignores the momentum, so entries are filed under the default); one entry serves them all.
  Problem other = p;
  other.momentum = 0.3;
  TuningTable filed;
  filed.identity = identity(90);
  filed.backward[other.key()] = backward_entry(other, kBackwardTiled);
  CHECK_THROWS_AS(parse_tuning_table(tuning_table_json(filed)), Error);
  CHECK_THROWS_AS(db.record(backward_entry(other, kBackwardTiled), TunedPass::backward),
                  InvalidArgument);
  REQUIRE(db.record(backward_entry(backward_entry_problem(other), kBackwardTiled),
                    TunedPass::backward));
  CHECK(db.find(other, TunedPass::backward));
  CHECK(db.find(p, TunedPass::backward));
  CHECK(!db.find(other));  // the forward's entries keep their momentum
  // A problem BackwardPlan refuses was never tuned: its entry in a file is damage. (The one
  // refusal left, synchronized statistics, has no field in a file: such a key never matches its
  // problem's. tf32x3, refused until its backward pass was built, is tested as accepted.)
  {
    Problem refused = p;
    refused.stat_ranks = 2;
    REQUIRE_NOTHROW(refused.validate());
    TuningTable r;
    r.identity = identity(90);
    r.backward[refused.key()] = backward_entry(refused, kBackwardTiled);
    try {
      parse_tuning_table(tuning_table_json(r));
      FAIL("a backward entry of a refused problem was read");
    } catch (const Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find("backward entry") != std::string::npos);
    }
    Problem x3 = p;
    x3.dtype = DType::tf32x3, x3.param_dtype = DType::fp32;
    TuningTable ok;
    ok.identity = identity(90);
    ok.backward[x3.key()] = backward_entry(x3, kBackwardTiled);
    CHECK(parse_tuning_table(tuning_table_json(ok)).backward.size() == 1);
  }
  fs::remove_all(dir);
}

TEST_CASE("backward dispatch: exact entry, then the M class, a winner that cannot run skipped") {
  const Device hopper = Device::for_arch("sm_90a"), sm80 = Device::for_arch("sm_80");
  const Problem p = problem(1000, 512, 384);
  TuningTable t;
  t.identity = identity(90);
  // Empty: the heuristic.
  BackwardChoice c = choose_backward_from_table(t, p, hopper);
  CHECK(c.source == KernelChoice::Source::heuristic);
  CHECK(c.config.key() == default_backward_config(p, hopper).key());
  t.backward[p.key()] = backward_entry(p, kBackwardWarpspec);
  c = choose_backward_from_table(t, p, hopper);
  CHECK(c.source == KernelChoice::Source::exact);
  CHECK(c.config.key() == kBackwardWarpspec);
  // Another M of the class 257..1024 shares it; one outside the class does not.
  c = choose_backward_from_table(t, problem(300, 512, 384), hopper);
  CAPTURE(c.detail);
  CHECK(c.source == KernelChoice::Source::m_class);
  CHECK(c.config.key() == kBackwardWarpspec);
  CHECK(c.detail.find("M = 1000") != std::string::npos);
  c = choose_backward_from_table(t, problem(2000, 512, 384), hopper);
  CHECK(c.source == KernelChoice::Source::heuristic);
  // The forward's entries are not the backward's.
  TuningTable forward_only;
  forward_only.entries[p.key()] = entry(p, kWarpspec);
  CHECK(choose_backward_from_table(forward_only, p, hopper).source ==
        KernelChoice::Source::heuristic);
  // Warpspec gradient GEMMs cannot run on sm_80: skipped, with the reason, for the heuristic.
  c = choose_backward_from_table(t, p, sm80);
  CHECK(c.source == KernelChoice::Source::heuristic);
  CHECK(c.detail.find("skipped") != std::string::npos);
  CHECK(c.config.key() == default_backward_config(p, sm80).key());
  // The backward pass ignores the momentum: the entry serves the layer with any momentum.
  for (const std::optional<double> momentum : {std::optional<double>(), std::optional(0.3)}) {
    Problem m = p;
    m.momentum = momentum;
    REQUIRE(m.key() != p.key());
    c = choose_backward_from_table(t, m, hopper);
    CHECK(c.source == KernelChoice::Source::exact);
    CHECK(c.config.key() == kBackwardWarpspec);
    m.M = 300;
    CHECK(choose_backward_from_table(t, m, hopper).source == KernelChoice::Source::m_class);
  }
  // An exact entry that cannot run does not hide a usable one of the same M class.
  TuningTable mixed;
  mixed.identity = identity(90);
  const Problem q = problem(700, 512, 384);
  mixed.backward[p.key()] = backward_entry(p, kBackwardWarpspec);
  mixed.backward[q.key()] = backward_entry(q, kBackwardTiled);
  c = choose_backward_from_table(mixed, p, sm80);
  CAPTURE(c.detail);
  CHECK(c.source == KernelChoice::Source::m_class);
  CHECK(c.config.key() == kBackwardTiled);
  CHECK(c.detail.find("skipped") != std::string::npos);
  CHECK(c.detail.find("M = 700") != std::string::npos);
}
