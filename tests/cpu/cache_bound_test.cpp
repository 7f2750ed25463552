// Bounded caches (issue 15): SingleFlight and the module registry keep at most their bound,
// least recently used dropped first, never a flight in progress; the disk cache stays within
// its byte bound as it is filled, evicts by last use (the mtime load() refreshes), never
// follows a link, never touches a read-only cache, and `fusejit cache prune` does the same.
#include <doctest/doctest.h>

#include "test_bytes.hpp"
#include "test_process.hpp"
#include "test_tempdir.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/runtime/module.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/util/single_flight.hpp"

namespace fs = std::filesystem;
using fusejit::CacheAccess;
using fusejit::DiskCache;
using fusejit::SingleFlight;
using fusejit::test::in_child;
using fusejit::test::key_for;
using fusejit::test::payload;
using fusejit::test::TempDir;

namespace {

const bool kLogLevelSet = fusejit::test::log_warnings_for_tests();

using fusejit::test::kNobody;

using Flights = SingleFlight<int>;

// A directory on tmpfs when there is one: the 10,000-store test fsyncs every entry, which
// costs nothing there and seconds on a disk.
class FastTempDir {
 public:
  FastTempDir() {
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm")
                              : fs::temp_directory_path();
    std::string pattern = (base / "fusejit-bound-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~FastTempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

fs::path entry_path(const fs::path& dir, const std::string& key) {
  return dir / (key + ".fjc");
}

// The entry files' total as a user would count it (links as links).
std::uintmax_t entry_bytes(const fs::path& dir) {
  std::uintmax_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".fjc") continue;
    struct stat st {};
    REQUIRE(::lstat(e.path().c_str(), &st) == 0);
    total += static_cast<std::uintmax_t>(st.st_size);
  }
  return total;
}

void set_mtime(const fs::path& path, std::time_t seconds) {
  const struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}

std::time_t mtime_of(const fs::path& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mtime;
}

std::time_t now() {
  return std::time(nullptr);
}

}  // namespace

TEST_CASE("SingleFlight with a capacity keeps at most that many values over 10,000 keys") {
  constexpr std::size_t kCapacity = 50;
  Flights flights(Flights::Keep::values, kCapacity);
  int runs = 0;
  std::size_t largest = 0;
  for (int i = 0; i < 10000; ++i) {
    CHECK(flights.get(std::to_string(i), [&] { return ++runs, i * 3; }) == i * 3);
    largest = std::max(largest, flights.size());
  }
  CHECK(runs == 10000);
  CHECK(largest == kCapacity);
  CHECK(flights.size() == kCapacity);
  // The newest are kept (no rerun); the oldest were dropped (rerun).
  CHECK(flights.get("9999", [&] { return ++runs, -1; }) == 9999 * 3);
  CHECK(runs == 10000);
  CHECK(flights.get("0", [&] { return ++runs, -1; }) == -1);
  CHECK(runs == 10001);
  CHECK(flights.size() == kCapacity);
}

TEST_CASE("SingleFlight drops the least recently used: a refreshed key survives") {
  Flights flights(Flights::Keep::values, 3);
  std::map<std::string, int> runs;
  auto get = [&](const std::string& key) { return flights.get(key, [&] { return ++runs[key]; }); };
  get("a");
  get("b");
  get("c");
  get("a");  // a hit: now b is the least recently used
  get("d");  // drops b
  CHECK(flights.size() == 3);
  get("a");
  get("c");
  get("d");
  CHECK(runs["a"] == 1);
  CHECK(runs["c"] == 1);
  CHECK(runs["d"] == 1);
  get("b");
  CHECK(runs["b"] == 2);

  // Shrinking applies at once and keeps the most recent (b, then d).
  flights.set_capacity(2);
  CHECK(flights.size() == 2);
  get("b");
  get("d");
  CHECK(runs["b"] == 2);
  CHECK(runs["d"] == 1);
  // 0: unbounded from now on.
  flights.set_capacity(0);
  for (int i = 0; i < 100; ++i) get("k" + std::to_string(i));
  CHECK(flights.size() == 102);
}

// `computed` says whether the call ran compute(): what a plan reports as its cache_hit().
TEST_CASE("SingleFlight says whether a call computed its value") {
  Flights flights(Flights::Keep::values, 1);
  bool computed = false;
  auto value = [](int v) { return [v] { return v; }; };
  CHECK(flights.get("a", value(1), &computed) == 1);
  CHECK(computed);
  CHECK(flights.get("a", value(2), &computed) == 1);
  CHECK_FALSE(computed);
  flights.get("b", value(3));  // drops a
  CHECK(flights.get("a", value(4), &computed) == 4);
  CHECK(computed);
  Flights once(Flights::Keep::nothing);
  CHECK(once.get("a", value(5), &computed) == 5);
  CHECK(computed);
}

TEST_CASE("SingleFlight never drops a flight in progress, whatever its capacity") {
  Flights flights(Flights::Keep::values, 1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> slow_runs{0};
  std::atomic<bool> started{false};
  auto slow = [&] {
    return flights.get("slow", [&] {
      ++slow_runs;
      started = true;
      released.wait();
      return 7;
    });
  };
  std::thread first([&] { CHECK(slow() == 7); });
  while (!started) std::this_thread::yield();
  // Finished values come and go past the bound of 1 while "slow" is still running.
  int others = 0;
  for (int i = 0; i < 20; ++i) flights.get("x" + std::to_string(i), [&] { return ++others; });
  CHECK(others == 20);
  CHECK(flights.size() == 2);  // "slow" in flight + one finished value
  // A second caller must join the flight, not start another one.
  std::thread second([&] { CHECK(slow() == 7); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release.set_value();
  first.join();
  second.join();
  CHECK(slow_runs == 1);
  CHECK(flights.size() == 1);  // now finished, it counts against the bound like any other
  CHECK(flights.get("slow", [&] { return ++slow_runs, -1; }) == 7);
  CHECK(slow_runs == 1);
}

TEST_CASE("the module registry's bound: set, default, FUSEJIT_MAX_KERNEL_SETS, bad values") {
  // Process-wide state and the environment: in a child, so other tests see neither.
  CHECK(in_child([] {
          using fusejit::Module;
          if (Module::loaded_count() != 0) return 1;  // no GPU here: nothing was ever loaded
          ::unsetenv("FUSEJIT_MAX_KERNEL_SETS");
          Module::set_max_loaded(0);
          if (Module::max_loaded() != 256) return 2;
          Module::set_max_loaded(7);
          if (Module::max_loaded() != 7) return 3;
          ::setenv("FUSEJIT_MAX_KERNEL_SETS", "12", 1);
          Module::set_max_loaded(0);
          if (Module::max_loaded() != 12) return 4;
          const auto before = fusejit::log_warning_count();
          for (const char* bad : {"0", "-3", "lots", "12x"}) {
            ::setenv("FUSEJIT_MAX_KERNEL_SETS", bad, 1);
            Module::set_max_loaded(0);
            if (Module::max_loaded() != 256) return 5;
          }
          if (fusejit::log_warning_count() != before + 1) return 6;  // one warning, not four
          return 0;
        }) == 0);
}

TEST_CASE("parse_byte_size takes bytes and K/M/G suffixes, nothing else") {
  using fusejit::parse_byte_size;
  CHECK(parse_byte_size("0") == 0u);
  CHECK(parse_byte_size("1048576") == 1048576u);
  CHECK(parse_byte_size("64K") == 65536u);
  CHECK(parse_byte_size("64k") == 65536u);
  CHECK(parse_byte_size("500M") == 500ull << 20);
  CHECK(parse_byte_size("2G") == 2ull << 30);
  for (const char* bad :
       {"", "K", "-1", "1.5G", "12Q", "1 G", "1GB", " 1", "99999999999999999999", "17179869184G"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_byte_size(bad).has_value());
  }
}

TEST_CASE("the disk cache's bound: set, default, FUSEJIT_CACHE_MAX_BYTES, bad values") {
  CHECK(in_child([] {
          ::unsetenv("FUSEJIT_CACHE_MAX_BYTES");
          DiskCache::set_default_max_bytes(0);
          if (DiskCache::default_max_bytes() != (2ull << 30)) return 1;
          ::setenv("FUSEJIT_CACHE_MAX_BYTES", "300M", 1);
          if (DiskCache::default_max_bytes() != (300ull << 20)) return 2;
          DiskCache::set_default_max_bytes(12345);
          if (DiskCache::default_max_bytes() != 12345) return 3;
          DiskCache c("/nonexistent-fusejit-dir");
          if (c.max_bytes() != 12345) return 4;
          c.set_max_bytes(99);
          if (c.max_bytes() != 99) return 5;
          DiskCache::set_default_max_bytes(0);
          if (DiskCache::default_max_bytes() != (300ull << 20)) return 6;
          const auto before = fusejit::log_warning_count();
          for (const char* bad : {"0", "lots", "-5", "2T"}) {
            ::setenv("FUSEJIT_CACHE_MAX_BYTES", bad, 1);
            if (DiskCache::default_max_bytes() != (2ull << 30)) return 7;
          }
          if (fusejit::log_warning_count() != before + 1) return 8;
          return 0;
        }) == 0);
}

TEST_CASE("storing 10,000 entries under a small bound keeps the cache within it") {
  FastTempDir tmp;
  DiskCache cache(tmp.path() / "c");
  constexpr std::uintmax_t kBound = 16 * 1024;
  cache.set_max_bytes(kBound);
  std::uintmax_t largest = 0;
  std::string last;
  for (int i = 0; i < 10000; ++i) {
    last = key_for("bound" + std::to_string(i));
    REQUIRE(cache.store(last, payload(64 + static_cast<std::size_t>(i % 64), 1u + i % 7), "x"));
    // Every store checked would make the test a directory-scanning benchmark; every 37th
    // (prime, so it falls at every phase of store()'s rescan period) is as strict.
    if (i % 37 == 0 || i == 9999) {
      const std::uintmax_t total = entry_bytes(cache.dir());
      largest = std::max(largest, total);
      REQUIRE_MESSAGE(total <= kBound, "after store " << i << ": " << total << " bytes");
    }
  }
  CHECK(largest > kBound / 2);  // the bound is used, not emptied on every store
  CHECK(cache.load(last).has_value());
  // The most recent entries survive: whatever remains is a suffix of the stores.
  CHECK(cache.load(key_for("bound9998")).has_value());
  CHECK_FALSE(cache.load(key_for("bound0")).has_value());
}

TEST_CASE("store never evicts the entry it just stored, even one larger than the bound") {
  TempDir tmp;
  DiskCache cache(tmp.path() / "c");
  cache.set_max_bytes(100);
  const std::string a = key_for("big-a"), b = key_for("big-b");
  REQUIRE(cache.store(a, payload(1000, 1), ""));
  CHECK(cache.load(a) == payload(1000, 1));
  REQUIRE(cache.store(b, payload(1000, 2), ""));
  CHECK(cache.load(b) == payload(1000, 2));
  CHECK_FALSE(fs::exists(entry_path(cache.dir(), a)));  // the older one made room
}

TEST_CASE("prune removes the least recently used entries first, by last use") {
  TempDir tmp;
  const DiskCache cache(tmp.path() / "c");
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) {
    keys.push_back(key_for("lru" + std::to_string(i)));
    REQUIRE(cache.store(keys.back(), payload(200, 1u + static_cast<unsigned>(i)), ""));
  }
  const std::uintmax_t one = fs::file_size(entry_path(cache.dir(), keys[0]));
  // Last use, oldest first: 3, 0, 5, 1, 4, 2 (stored in another order on purpose).
  const std::time_t base = now() - 100000;
  const int order[] = {3, 0, 5, 1, 4, 2};
  for (int rank = 0; rank < 6; ++rank)
    set_mtime(entry_path(cache.dir(), keys[order[rank]]), base + rank);
  const auto listed = cache.list();
  REQUIRE(listed.size() == 6);
  for (const auto& e : listed) {
    CHECK(e.last_use == mtime_of(entry_path(cache.dir(), e.key)));
    CHECK(e.last_use >= base);
  }
  const auto r = cache.prune(3 * one + one / 2);  // room for three
  CHECK(r.removed == 3);
  CHECK(r.bytes_removed == 3 * one);
  CHECK(r.bytes_left == 3 * one);
  for (int rank = 0; rank < 6; ++rank) {
    CAPTURE(rank);
    CHECK(fs::exists(entry_path(cache.dir(), keys[order[rank]])) == (rank >= 3));
  }
  // Bound already met: nothing more goes.
  CHECK(cache.prune(3 * one).removed == 0);
  CHECK(cache.prune(0).removed == 3);
  CHECK(entry_bytes(cache.dir()) == 0);
}

TEST_CASE("load marks an entry used, at most once a minute; a read-only cache is never marked") {
  TempDir tmp;
  const DiskCache cache(tmp.path() / "c");
  const std::string key = key_for("touched");
  REQUIRE(cache.store(key, payload(100, 3), ""));
  const fs::path path = entry_path(cache.dir(), key);

  set_mtime(path, now() - 3600);
  REQUIRE(cache.load(key).has_value());
  CHECK(mtime_of(path) >= now() - 5);

  // Recently marked: a hot loop of loads writes no metadata.
  const std::time_t recent = now() - 10;
  set_mtime(path, recent);
  for (int i = 0; i < 3; ++i) REQUIRE(cache.load(key).has_value());
  CHECK(mtime_of(path) == recent);

  // Read-only: a directory this user cannot write, holding entries this user owns (so only
  // the read-only rule, not a permission, stops the mark).
  const fs::path ro = tmp.path() / "ro";
  const std::string rokey = key_for("read-only");
  REQUIRE(DiskCache(ro).store(rokey, payload(100, 4), ""));
  const std::time_t old = now() - 3600;
  set_mtime(entry_path(ro, rokey), old);
  if (::geteuid() == 0) {
    fs::permissions(tmp.path(), static_cast<fs::perms>(0755));
    fs::permissions(ro, static_cast<fs::perms>(0755));
    REQUIRE(::chown(entry_path(ro, rokey).c_str(), kNobody, kNobody) == 0);
    CHECK(in_child([&] {
            if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 50;
            const DiskCache c(ro);
            if (c.access() != CacheAccess::read_only) return 1;
            if (!c.load(rokey)) return 2;
            return 0;
          }) == 0);
  } else {
    fs::permissions(ro, static_cast<fs::perms>(0555));
    CHECK(in_child([&] {
            const DiskCache c(ro);
            if (c.access() != CacheAccess::read_only) return 1;
            if (!c.load(rokey)) return 2;
            return 0;
          }) == 0);
    fs::permissions(ro, fs::perms::owner_all);
  }
  CHECK(mtime_of(entry_path(ro, rokey)) == old);
}

TEST_CASE("prune never removes from a read-only cache") {
  TempDir tmp;
  const fs::path ro = tmp.path() / "ro";
  std::vector<std::string> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(key_for("ro-prune" + std::to_string(i)));
    REQUIRE(DiskCache(ro).store(keys.back(), payload(100, 5u + static_cast<unsigned>(i)), ""));
  }
  auto prune_read_only = [&] {
    const DiskCache c(ro);
    if (c.access() != CacheAccess::read_only) return 1;
    const auto before = fusejit::log_warning_count();
    const auto r = c.prune(0);
    if (r.removed != 0 || r.bytes_removed != 0) return 2;
    // Not even an attempt (which would warn when the unlink fails).
    if (fusejit::log_warning_count() != before) return 3;
    return 0;
  };
  if (::geteuid() == 0) {
    fs::permissions(tmp.path(), static_cast<fs::perms>(0755));
    fs::permissions(ro, static_cast<fs::perms>(0755));
    for (const auto& k : keys) REQUIRE(::chown(entry_path(ro, k).c_str(), kNobody, kNobody) == 0);
    CHECK(in_child([&] {
            if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 50;
            return prune_read_only();
          }) == 0);
  } else {
    fs::permissions(ro, static_cast<fs::perms>(0555));
    CHECK(in_child(prune_read_only) == 0);
    fs::permissions(ro, fs::perms::owner_all);
  }
  for (const auto& k : keys) CHECK(fs::exists(entry_path(ro, k)));
}

TEST_CASE("prune removes a link named like an entry as a name, never what it points to") {
  TempDir tmp;
  const DiskCache cache(tmp.path() / "c");
  const std::string real = key_for("real");
  REQUIRE(cache.store(real, payload(100, 6), ""));
  // A large file outside the cache: counting it through the link would make prune evict the
  // real entry for a bound the cache itself meets.
  const fs::path outside = tmp.path() / "precious";
  {
    std::ofstream out(outside, std::ios::binary);
    const auto bytes = payload(1 << 20, 7);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const fs::path link = entry_path(cache.dir(), key_for("link"));
  fs::create_symlink(outside, link);
  set_mtime(link, now() - 100000);
  const auto kept = cache.prune(64 * 1024);
  CHECK(kept.removed == 0);
  CHECK(kept.bytes_left < 64 * 1024);
  CHECK(fs::is_symlink(link));
  // Evicted first (oldest), as the link itself.
  const auto r = cache.prune(fs::file_size(entry_path(cache.dir(), real)));
  CHECK(r.removed == 1);
  CHECK_FALSE(fs::is_symlink(link));
  CHECK(fs::exists(outside));
  CHECK(fs::file_size(outside) == (1u << 20));
  CHECK(cache.load(real).has_value());
}

TEST_CASE("prune leaves another user's entries (root: an entry chowned to another user)") {
  if (::geteuid() != 0) {
    MESSAGE("not root: cannot make a file another user's; covered when run as root");
    return;
  }
  TempDir tmp;
  const DiskCache cache(tmp.path() / "c");
  const std::string mine = key_for("mine"), theirs = key_for("theirs");
  REQUIRE(cache.store(theirs, payload(100, 8), ""));
  REQUIRE(cache.store(mine, payload(100, 9), ""));
  REQUIRE(::chown(entry_path(cache.dir(), theirs).c_str(), kNobody, kNobody) == 0);
  set_mtime(entry_path(cache.dir(), theirs), now() - 100000);  // the oldest
  const auto r = cache.prune(0);
  CHECK(r.removed == 1);
  CHECK(fs::exists(entry_path(cache.dir(), theirs)));
  CHECK_FALSE(fs::exists(entry_path(cache.dir(), mine)));
  CHECK(r.bytes_left == fs::file_size(entry_path(cache.dir(), theirs)));
}

TEST_CASE("fusejit cache prune --max-bytes and cache ls's last use") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "c";
  const DiskCache cache(dir);
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(key_for("cli" + std::to_string(i)));
    REQUIRE(cache.store(keys.back(), payload(900, 10u + static_cast<unsigned>(i)), "k"));
  }
  // Entries of 973 bytes: a 2K bound keeps the newest two. Last uses 2026-11-24T06:30:00Z on.
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 24;
  tm.tm_hour = 6;
  tm.tm_min = 30;
  const std::time_t when = ::timegm(&tm);
  for (int i = 0; i < 4; ++i)
    set_mtime(entry_path(dir, keys[static_cast<std::size_t>(i)]), when + i);

  const auto ls = fusejit::test::run_cli("cache ls --cache-dir " + dir.string());
  CHECK(ls.code == 0);
  CHECK_MESSAGE(ls.out.find("2026-11-24T06:30:00Z") != std::string::npos, ls.out);
  CHECK_MESSAGE(ls.out.find("2026-11-24T06:30:03Z") != std::string::npos, ls.out);

  const auto pruned =
      fusejit::test::run_cli("cache prune --max-bytes 2K --cache-dir " + dir.string());
  CHECK_MESSAGE(pruned.code == 0, pruned.out);
  CHECK_MESSAGE(pruned.out.find("removed 2 entries") != std::string::npos, pruned.out);
  CHECK(entry_bytes(dir) <= 2048);
  CHECK_FALSE(fs::exists(entry_path(dir, keys[0])));
  CHECK_FALSE(fs::exists(entry_path(dir, keys[1])));
  CHECK(fs::exists(entry_path(dir, keys[2])));
  CHECK(fs::exists(entry_path(dir, keys[3])));

  for (const char* bad : {"--max-bytes 2T", "--max-bytes lots", "--max-bytes -1", ""}) {
    CAPTURE(bad);
    const auto r =
        fusejit::test::run_cli(std::string("cache prune ") + bad + " --cache-dir " + dir.string());
    CHECK(r.code == 2);
    int lines = 0;
    for (char ch : r.out) lines += ch == '\n';
    CHECK(lines == 1);
    CHECK_MESSAGE(r.out.find("max-bytes") != std::string::npos, r.out);
  }
  CHECK(fs::exists(entry_path(dir, keys[3])));  // a bad argument removes nothing
}
