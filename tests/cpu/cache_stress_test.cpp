// Many processes sharing one cache directory while it is being damaged and cleared under them:
// 16 worker processes load and store a small key set for several rounds, one more process keeps
// corrupting entries in place (truncations, flipped header and payload bytes) and another keeps
// calling DiskCache::clear(). Every payload a load() hands back is compared byte for byte with
// what that key must hold, so "no damaged binary is ever loaded" is counted, not assumed.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include "test_tempdir.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/base_sink.h>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/util/hash.hpp"
#include "fusejit/util/log.hpp"

namespace fs = std::filesystem;
using fusejit::DiskCache;

namespace {

// The refused loads are counted from the cache's own "damaged cache entry" warnings, so they
// must reach the logger whatever the caller's environment says. Runs before main.
const bool kLogLevelSet = [] { return ::setenv("FUSEJIT_LOG_LEVEL", "warn", 1) == 0; }();

constexpr int kWorkers = 16;
constexpr int kRounds = 200;
constexpr int kKeys = 8;
// Every entry carries this description, so the header is 40 + its length bytes and the
// corrupter knows where the payload starts without trusting the (maybe damaged) header.
constexpr std::string_view kDescription = "cache-stress";
constexpr std::size_t kHeaderBytes = 40 + kDescription.size();

std::string key_of(int i) {
  return fusejit::Hasher().add("cache-stress-key-" + std::to_string(i)).hex();
}

// The only bytes key `i` may ever hold: sizes from 1 KiB to ~57 KiB, no byte zero, so neither a
// short read nor a zeroed page can pass for it.
std::vector<char> payload_of(int i) {
  std::mt19937 rng(0xC0FFEEu + static_cast<unsigned>(i));
  std::uniform_int_distribution<int> byte(1, 255);
  std::vector<char> out(1024 + static_cast<std::size_t>(i) * 8009);
  for (char& c : out) c = static_cast<char>(byte(rng));
  return out;
}

// What each child reports through the results pipe (well under PIPE_BUF, so written at once).
struct Report {
  int role = 0;                  // 0 worker, 1 corrupter, 2 clearer
  int failed = 0;                // a store that failed or an exception (must stay 0)
  std::uint64_t stores = 0;      // successful store() calls
  std::uint64_t loads = 0;       // load() calls that returned a payload
  std::uint64_t mismatches = 0;  // of those, payloads that differ from payload_of(key)
  std::uint64_t misses = 0;      // load() calls that returned nothing
  std::uint64_t refused = 0;     // misses where the cache found a damaged entry and removed it
  std::uint64_t other_warnings = 0;
  std::uint64_t corruptions = 0;                // corrupter: entries damaged in place
  std::uint64_t clears = 0, cleared_files = 0;  // clearer
};

// Counts the cache's warnings by kind instead of printing thousands of them to stderr.
class WarningTally final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::uint64_t damaged = 0, other = 0;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn) return;
    const std::string_view text(msg.payload.data(), msg.payload.size());
    if (text.find("damaged cache entry") != std::string_view::npos)
      ++damaged;
    else
      ++other;
  }
  void flush_() override {}
};

std::shared_ptr<WarningTally> install_tally() {
  auto tally = std::make_shared<WarningTally>();
  // Only this (single-threaded, freshly forked) child uses the logger, so swapping the sinks
  // races with nothing.
  auto logger = fusejit::log();
  logger->sinks().clear();
  logger->sinks().push_back(tally);
  return tally;
}

bool stop_requested(int stop_fd) {
  pollfd p{stop_fd, POLLIN, 0};
  // The parent closes the write end once every worker has exited: POLLHUP (or EOF).
  return ::poll(&p, 1, 0) > 0;
}

void wait_gate(int gate_fd) {
  char c;
  while (::read(gate_fd, &c, 1) < 0 && errno == EINTR) {
  }
}

Report run_worker(const DiskCache& cache, int id) {
  Report r;
  auto tally = install_tally();
  std::vector<std::vector<char>> expected;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) {
    expected.push_back(payload_of(i));
    keys.push_back(key_of(i));
  }
  std::mt19937 rng(static_cast<unsigned>(id) * 7919u + 1u);
  std::vector<int> order(kKeys);
  for (int i = 0; i < kKeys; ++i) order[static_cast<std::size_t>(i)] = i;
  for (int round = 0; round < kRounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      const auto idx = static_cast<std::size_t>(i);
      // Load first; a miss (never stored, cleared, or damaged and removed) is rebuilt, as the
      // compiler path does.
      if (auto got = cache.load(keys[idx])) {
        ++r.loads;
        if (*got != expected[idx]) ++r.mismatches;
      } else {
        ++r.misses;
        if (cache.store(keys[idx], expected[idx], std::string(kDescription)))
          ++r.stores;
        else
          ++r.failed;
      }
    }
    // One unconditional store per round, so writers of one key race each other too.
    const auto idx = static_cast<std::size_t>((round + id) % kKeys);
    if (cache.store(keys[idx], expected[idx], std::string(kDescription)))
      ++r.stores;
    else
      ++r.failed;
  }
  r.refused = tally->damaged;
  r.other_warnings = tally->other;
  return r;
}

// Damages one entry in place (the inode readers may have open), never through the cache's
// API: truncation, a flipped header byte or a flipped payload byte.
bool corrupt_one(const fs::path& path, std::mt19937& rng) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;  // cleared or replaced since the directory was read
  bool done = false;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size > 0) {
    const int how = std::uniform_int_distribution<int>(0, 2)(rng);
    if (how == 0) {
      done = ::ftruncate(fd, std::uniform_int_distribution<off_t>(0, size - 1)(rng)) == 0;
    } else {
      const auto header_end = std::min<off_t>(size, static_cast<off_t>(kHeaderBytes));
      off_t at = 0;
      if (how == 1 || header_end >= size)
        at = std::uniform_int_distribution<off_t>(0, header_end - 1)(rng);
      else
        at = std::uniform_int_distribution<off_t>(header_end, size - 1)(rng);
      unsigned char b = 0;
      if (::pread(fd, &b, 1, at) == 1) {
        b = static_cast<unsigned char>(b ^ std::uniform_int_distribution<int>(1, 255)(rng));
        done = ::pwrite(fd, &b, 1, at) == 1;
      }
    }
  }
  ::close(fd);
  return done;
}

Report run_corrupter(const fs::path& dir, int stop_fd) {
  Report r;
  r.role = 1;
  std::mt19937 rng(12345);
  while (!stop_requested(stop_fd)) {
    std::vector<fs::path> entries;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".fjc") entries.push_back(it->path());
    if (!entries.empty()) {
      const auto pick = std::uniform_int_distribution<std::size_t>(0, entries.size() - 1)(rng);
      if (corrupt_one(entries[pick], rng)) ++r.corruptions;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  return r;
}

Report run_clearer(const DiskCache& cache, int stop_fd) {
  Report r;
  r.role = 2;
  auto tally = install_tally();
  while (!stop_requested(stop_fd)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    r.cleared_files += cache.clear();
    ++r.clears;
  }
  r.other_warnings = tally->other;
  return r;
}

int count_suffix(const fs::path& dir, std::string_view suffix) {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().ends_with(suffix)) ++n;
  return n;
}

using fusejit::test::TempDir;

}  // namespace

TEST_CASE("16 processes share a cache that is corrupted and cleared under them: no bad load") {
  TempDir tmp;
  const DiskCache cache(tmp.path() / "shared");
  const auto started = std::chrono::steady_clock::now();

  int gate[2], stop[2], results[2];
  REQUIRE(::pipe(gate) == 0);
  REQUIRE(::pipe(stop) == 0);
  REQUIRE(::pipe(results) == 0);

  // Forks one child running `body`; the child keeps only the ends it needs.
  auto spawn = [&](auto body) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      ::close(stop[1]);
      ::close(results[0]);
      wait_gate(gate[0]);
      Report r;
      try {
        r = body();
      } catch (...) {
        r.failed = 1;
      }
      const bool sent = ::write(results[1], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
      ::_exit(sent ? 0 : 3);
    }
    return pid;
  };

  std::vector<pid_t> workers;
  for (int id = 0; id < kWorkers; ++id)
    workers.push_back(spawn([&, id] { return run_worker(cache, id); }));
  const pid_t corrupter = spawn([&] { return run_corrupter(cache.dir(), stop[0]); });
  const pid_t clearer = spawn([&] { return run_clearer(cache, stop[0]); });
  ::close(gate[0]);
  ::close(gate[1]);  // everyone starts now
  ::close(results[1]);

  auto reap = [](pid_t pid) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CAPTURE(pid);
    CHECK_MESSAGE(WIFEXITED(status),
                  "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);
  };
  for (pid_t pid : workers) reap(pid);
  // Every writer has exited: nothing may be mid-write, so no temp file may be left, young or old
  // (clear() would keep young ones, so list the directory rather than trust it).
  const int temps_after_workers = count_suffix(cache.dir(), ".tmp");
  ::close(stop[1]);
  ::close(stop[0]);
  reap(corrupter);
  reap(clearer);

  Report total;
  std::uint64_t corruptions = 0, clears = 0, cleared = 0;
  int reports = 0;
  for (Report r; ::read(results[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r); ++reports) {
    total.failed += r.failed;
    total.stores += r.stores;
    total.loads += r.loads;
    total.mismatches += r.mismatches;
    total.misses += r.misses;
    total.refused += r.refused;
    total.other_warnings += r.other_warnings;
    corruptions += r.corruptions;
    clears += r.clears;
    cleared += r.cleared_files;
  }
  ::close(results[0]);

  // A fresh process clears what is left; then the directory holds nothing of ours.
  const pid_t final_clear = ::fork();
  REQUIRE(final_clear >= 0);
  if (final_clear == 0) {
    DiskCache(cache.dir()).clear();
    ::_exit(0);
  }
  reap(final_clear);
  const int entries_left = count_suffix(cache.dir(), ".fjc");
  const int temps_left = count_suffix(cache.dir(), ".tmp");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  MESSAGE(fmt::format(
      "cache stress: {} processes ({} workers + corrupter + clearer), {} rounds x {} keys, "
      "{} stores, {} loads verified ({} mismatched), {} misses, {} corruptions injected, "
      "{} loads refused (damaged entry found and removed), {} clears removing {} files, "
      "{} other warnings, {:.1f} s",
      kWorkers + 2, kWorkers, kRounds, kKeys, total.stores, total.loads, total.mismatches,
      total.misses, corruptions, total.refused, clears, cleared, total.other_warnings, seconds));

  CHECK(reports == kWorkers + 2);
  CHECK(total.failed == 0);
  CHECK(total.mismatches == 0);  // no damaged binary is ever loaded
  CHECK(total.other_warnings == 0);
  CHECK(temps_after_workers == 0);
  CHECK(temps_left == 0);
  CHECK(entries_left == 0);
  // The test exercised what it claims to: hits, damage found by readers, clears.
  CHECK(total.loads > 0);
  CHECK(corruptions > 0);
  CHECK(total.refused > 0);
  CHECK(clears > 0);
}
