// DiskCache must never hand back bytes it has not verified, must survive many processes
// writing the same entry at once, and must degrade to a warned-once no-op when it cannot write.
#include <doctest/doctest.h>

#include "test_bytes.hpp"
#include "test_process.hpp"
#include "test_tempdir.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/cache/entry_format.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/hash.hpp"
#include "fusejit/util/log.hpp"

namespace fs = std::filesystem;
using fusejit::DiskCache;

namespace {

// Warnings must reach the logger for log_warning_count() to see them, whatever the caller's
// environment says. Runs before main, so before the logger exists.
const bool kLogLevelSet = [] { return ::setenv("FUSEJIT_LOG_LEVEL", "warn", 1) == 0; }();

using fusejit::test::in_child;
using fusejit::test::key_for;
using fusejit::test::payload;
using fusejit::test::TempDir;

fs::path entry_path(const DiskCache& cache, const std::string& key) {
  return cache.dir() / (key + ".fjc");
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int count_temp_files(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".tmp") ++n;
  }
  return n;
}

bool running_as_root_ignores_modes(const fs::path& read_only_dir) {
  const fs::path probe = read_only_dir / "probe";
  std::ofstream out(probe);
  const bool wrote = out.good();
  out.close();
  std::error_code ec;
  fs::remove(probe, ec);
  return wrote;
}

}  // namespace

TEST_CASE("store then load returns the same bytes; an unknown key misses") {
  REQUIRE(kLogLevelSet);
  TempDir tmp;
  const DiskCache cache(tmp.path() / "sub" / "dir");  // created on first store
  const std::string key = key_for("hit-miss");
  CHECK_FALSE(cache.load(key).has_value());

  const auto bytes = payload(100000, 1);
  REQUIRE(cache.store(key, bytes, "fj_kernel sm_90a"));
  CHECK(fs::is_regular_file(entry_path(cache, key)));
  const auto loaded = cache.load(key);
  REQUIRE(loaded.has_value());
  CHECK(*loaded == bytes);
  CHECK_FALSE(cache.load(key_for("other")).has_value());

  // Storing again replaces the entry whole.
  const auto replacement = payload(777, 2);
  REQUIRE(cache.store(key, replacement, "second"));
  CHECK(cache.load(key) == replacement);

  // An empty payload is a valid entry, distinct from a miss.
  const std::string empty_key = key_for("empty");
  REQUIRE(cache.store(empty_key, {}, ""));
  const auto empty = cache.load(empty_key);
  REQUIRE(empty.has_value());
  CHECK(empty->empty());

  CHECK(count_temp_files(cache.dir()) == 0);
}

TEST_CASE("keys that are not 32 lowercase hex digits are rejected") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string good = key_for("k");
  for (const std::string& bad :
       {std::string("../../etc/passwd"), good.substr(1), good + "0", std::string(32, 'A'),
        std::string(31, '0') + "/", std::string(), std::string(32, 'g')}) {
    CAPTURE(bad);
    try {
      (void)cache.load(bad);
      FAIL("load accepted a bad key");
    } catch (const fusejit::InvalidArgument& e) {
      CHECK(e.argument() == "key");
    }
    CHECK_THROWS_AS(cache.store(bad, {'x'}, ""), fusejit::InvalidArgument);
  }
  CHECK(fs::is_empty(tmp.path()));
}

TEST_CASE("a truncated entry is logged, removed and reported as a miss") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("truncated");
  const auto bytes = payload(4096, 3);
  const std::string description = "fj_kernel sm_80";
  const std::size_t header = fusejit::kCacheEntryFixedBytes + description.size() + 8;
  const std::size_t full = header + bytes.size();

  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{8}, std::size_t{31},
                           std::size_t{32}, header - 1, header, header + 1, full - 1}) {
    CAPTURE(size);
    REQUIRE(cache.store(key, bytes, description));
    REQUIRE(fs::file_size(entry_path(cache, key)) == full);
    fs::resize_file(entry_path(cache, key), size);
    const auto warnings = fusejit::log_warning_count();
    CHECK_FALSE(cache.load(key).has_value());
    CHECK(fusejit::log_warning_count() == warnings + 1);
    CHECK_FALSE(fs::exists(entry_path(cache, key)));
  }
  // The caller rebuilds and stores again; that works.
  REQUIRE(cache.store(key, bytes, description));
  CHECK(cache.load(key) == bytes);
}

TEST_CASE("an entry with bytes after its payload is rejected") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("trailing");
  const auto bytes = payload(1000, 4);
  REQUIRE(cache.store(key, bytes, "d"));
  auto file = read_bytes(entry_path(cache, key));
  file.push_back('x');
  write_bytes(entry_path(cache, key), file);
  CHECK_FALSE(cache.load(key).has_value());
  CHECK_FALSE(fs::exists(entry_path(cache, key)));
}

TEST_CASE("a flipped byte anywhere in the header is caught") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("header-flip");
  const auto bytes = payload(2048, 5);
  const std::string description = "fj_gemm_bn_tiled_128x128x32 sm_90a";
  const std::size_t header = fusejit::kCacheEntryFixedBytes + description.size() + 8;
  // Every header byte, description and both checksums included, each with a low and a high bit.
  for (std::size_t at = 0; at < header; ++at) {
    for (unsigned char bit : {0x01, 0x80}) {
      CAPTURE(at);
      CAPTURE(int{bit});
      REQUIRE(cache.store(key, bytes, description));
      auto file = read_bytes(entry_path(cache, key));
      REQUIRE(file.size() == header + bytes.size());
      file[at] = static_cast<char>(file[at] ^ bit);
      write_bytes(entry_path(cache, key), file);
      CHECK_FALSE(cache.load(key).has_value());
      CHECK_FALSE(fs::exists(entry_path(cache, key)));
    }
  }
  REQUIRE(cache.store(key, bytes, description));
  CHECK(cache.load(key) == bytes);
}

TEST_CASE("a flipped byte in the payload is caught") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("payload-flip");
  const auto bytes = payload(5000, 6);
  const std::size_t header = fusejit::kCacheEntryFixedBytes + 8;  // empty description
  for (std::size_t at : {std::size_t{0}, std::size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    CAPTURE(at);
    REQUIRE(cache.store(key, bytes, ""));
    auto file = read_bytes(entry_path(cache, key));
    file[header + at] = static_cast<char>(file[header + at] ^ 0x10);
    write_bytes(entry_path(cache, key), file);
    const auto warnings = fusejit::log_warning_count();
    CHECK_FALSE(cache.load(key).has_value());
    CHECK(fusejit::log_warning_count() == warnings + 1);
    CHECK_FALSE(fs::exists(entry_path(cache, key)));
  }
  REQUIRE(cache.store(key, bytes, ""));
  CHECK(cache.load(key) == bytes);
}

TEST_CASE("parse_cache_entry rejects every truncation without reading past the buffer") {
  const auto bytes = payload(300, 18);
  const std::string key = key_for("parse");
  const auto entry = fusejit::serialize_cache_entry(bytes, key, "desc");
  const auto parsed = fusejit::parse_cache_entry(entry);
  REQUIRE(parsed.has_value());
  CHECK(std::vector<char>(parsed->payload.begin(), parsed->payload.end()) == bytes);
  CHECK(parsed->description == "desc");
  CHECK(parsed->key == key);
  for (std::size_t size = 0; size < entry.size(); ++size) {
    CAPTURE(size);
    // An exact-size heap copy, so an over-read is out of bounds (and caught under ASan).
    const std::vector<char> prefix(entry.begin(), entry.begin() + static_cast<long>(size));
    std::string problem;
    CHECK_FALSE(fusejit::parse_cache_entry(prefix, &problem).has_value());
    CHECK_FALSE(problem.empty());
  }
  // A header that claims a huge payload or description is rejected, not trusted.
  auto huge = entry;
  huge[16 + 7] = static_cast<char>(0x7f);  // payload length high byte
  CHECK_FALSE(fusejit::parse_cache_entry(huge).has_value());
  huge = entry;
  huge[12 + 3] = static_cast<char>(0x7f);  // description length high byte
  CHECK_FALSE(fusejit::parse_cache_entry(huge).has_value());
}

TEST_CASE("threads of one process storing and loading one key at once all succeed") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("threads");
  const auto bytes = payload(64 * 1024, 19);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        if (!cache.store(key, bytes, "threads")) ++failures;
        const auto loaded = cache.load(key);
        if (!loaded || *loaded != bytes) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(count_temp_files(cache.dir()) == 0);
  CHECK(cache.list().size() == 1);
}

TEST_CASE("a foreign file or a directory under an entry's name is never returned") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string garbage_key = key_for("garbage");
  write_bytes(entry_path(cache, garbage_key), {'n', 'o', 't', ' ', 'o', 'u', 'r', 's'});
  CHECK_FALSE(cache.load(garbage_key).has_value());
  CHECK_FALSE(fs::exists(entry_path(cache, garbage_key)));

  // An empty directory under an entry's name is damage: removed, and the key works again.
  const std::string dir_key = key_for("dir");
  fs::create_directory(entry_path(cache, dir_key));
  CHECK_FALSE(cache.load(dir_key).has_value());
  CHECK_FALSE(fs::exists(entry_path(cache, dir_key)));
  CHECK(cache.store(dir_key, payload(10, 30), "after"));
  CHECK(cache.load(dir_key).has_value());

  // A directory with something inside may hold someone's files: a miss, and it stays; storing
  // that key fails, the cache's other keys still work.
  const std::string full_key = key_for("full-dir");
  fs::create_directory(entry_path(cache, full_key));
  write_bytes(entry_path(cache, full_key) / "precious", {'p'});
  CHECK_FALSE(cache.load(full_key).has_value());
  CHECK(fs::is_regular_file(entry_path(cache, full_key) / "precious"));
  CHECK_FALSE(cache.store(full_key, payload(10, 31), "blocked"));
  const std::string other_key = key_for("other-after-dir");
  CHECK(cache.store(other_key, payload(10, 32), "other"));
  CHECK(cache.load(other_key).has_value());
}

TEST_CASE("list() reports each entry with its verification status") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string good = key_for("good");
  const std::string bad = key_for("bad");
  REQUIRE(cache.store(good, payload(300, 7), "good kernel"));
  REQUIRE(cache.store(bad, payload(300, 8), "bad kernel"));
  auto file = read_bytes(entry_path(cache, bad));
  file.back() = static_cast<char>(file.back() ^ 0x04);
  write_bytes(entry_path(cache, bad), file);
  write_bytes(tmp.path() / "README.txt", {'h', 'i'});

  const auto entries = cache.list();
  REQUIRE(entries.size() == 2);
  for (const auto& e : entries) {
    CAPTURE(e.key);
    if (e.key == good) {
      CHECK(e.valid);
      CHECK(e.problem.empty());
      CHECK(e.description == "good kernel");
      CHECK(e.bytes == fs::file_size(entry_path(cache, good)));
    } else {
      CHECK(e.key == bad);
      CHECK_FALSE(e.valid);
      CHECK(e.problem.find("checksum") != std::string::npos);
    }
  }
  // list() reports; it does not repair.
  CHECK(fs::exists(entry_path(cache, bad)));
  CHECK(DiskCache(tmp.path() / "missing").list().empty());
}

TEST_CASE("16 processes storing and loading one key at once all succeed") {
  TempDir tmp;
  const DiskCache cache(tmp.path() / "shared");  // the processes also race to create it
  const std::string key = key_for("contended");
  const auto bytes = payload(256 * 1024, 9);
  constexpr int kProcesses = 16;
  constexpr int kRounds = 20;

  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      char c;
      // Blocks until the parent closes its end, so all start together.
      while (::read(gate[0], &c, 1) < 0 && errno == EINTR) {
      }
      int code = 0;
      for (int round = 0; round < kRounds && code == 0; ++round) {
        if (!cache.store(key, bytes, "contended")) code = 1;
        const auto loaded = cache.load(key);
        if (!loaded)
          code = 2;
        else if (*loaded != bytes)
          code = 3;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CAPTURE(pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const auto entries = cache.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].key == key);
  CHECK(entries[0].valid);
  CHECK(count_temp_files(cache.dir()) == 0);
  CHECK(cache.load(key) == bytes);
}

TEST_CASE("a directory that cannot be created: store fails with one warning, load misses") {
  TempDir tmp;
  write_bytes(tmp.path() / "a-file", {'x'});
  const fs::path dir = tmp.path() / "a-file" / "cache";  // create_directories: ENOTDIR
  const int code = in_child([&] {
    const auto before = fusejit::log_warning_count();
    const DiskCache cache(dir);
    const DiskCache other(dir / "deeper");
    if (cache.store(key_for("a"), payload(10, 10), "")) return 1;
    if (cache.store(key_for("b"), payload(10, 11), "")) return 2;
    if (other.store(key_for("c"), payload(10, 12), "")) return 3;
    if (fusejit::log_warning_count() != before + 1) return 4;
    if (cache.load(key_for("a")).has_value()) return 5;
    if (!cache.list().empty()) return 6;
    if (cache.clear() != 0) return 7;
    return 0;
  });
  CHECK(code == 0);
  CHECK(fs::is_regular_file(tmp.path() / "a-file"));
}

TEST_CASE("a read-only directory: store fails with one warning, existing entries still load") {
  TempDir tmp;
  const DiskCache cache(tmp.path() / "ro");
  const std::string existing = key_for("existing");
  const auto bytes = payload(500, 13);
  REQUIRE(cache.store(existing, bytes, ""));
  fs::permissions(cache.dir(), fs::perms::owner_read | fs::perms::owner_exec |
                                   fs::perms::group_read | fs::perms::group_exec |
                                   fs::perms::others_read | fs::perms::others_exec);
  // Writable again on the way out, so TempDir can remove what is inside.
  const struct RestoreMode {
    fs::path dir;
    ~RestoreMode() {
      std::error_code ec;
      fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    }
  } restore{cache.dir()};
  if (running_as_root_ignores_modes(cache.dir())) {
    MESSAGE(
        "running as root: mode 0555 does not stop writes; the unwritable case is covered "
        "by the directory-under-a-file test");
    return;
  }
  const int code = in_child([&] {
    const auto before = fusejit::log_warning_count();
    if (cache.store(key_for("new"), payload(10, 14), "")) return 1;
    if (cache.store(key_for("new2"), payload(10, 15), "")) return 2;
    if (fusejit::log_warning_count() != before + 1) return 3;
    if (cache.load(key_for("new")).has_value()) return 4;
    const auto loaded = cache.load(existing);
    if (!loaded || *loaded != bytes) return 5;
    return 0;
  });
  CHECK(code == 0);
  CHECK(count_temp_files(cache.dir()) == 0);
}

TEST_CASE("a write that fails midway (as on a full disk) leaves no temp file behind") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("partial");
  // RLIMIT_FSIZE makes write() fail with EFBIG part way through the payload: the same path
  // ENOSPC takes, without needing a full filesystem.
  const int code = in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100, 100};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    const auto before = fusejit::log_warning_count();
    if (cache.store(key, payload(1 << 20, 16), "big")) return 1;
    if (fusejit::log_warning_count() != before + 1) return 2;
    if (cache.load(key).has_value()) return 3;
    return 0;
  });
  CHECK(code == 0);
  CHECK(count_temp_files(cache.dir()) == 0);
  CHECK_FALSE(fs::exists(entry_path(cache, key)));
}

TEST_CASE("clear() removes entries and stale temp files and nothing else") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  for (const char* name : {"one", "two", "three"}) {
    REQUIRE(cache.store(key_for(name), payload(64, 17), name));
  }
  const std::string k = key_for("temp");
  const fs::path stale = tmp.path() / ("." + k + ".fjc.1234.5678.00ff00ff00ff00ff.tmp");
  const fs::path fresh = tmp.path() / ("." + k + ".fjc.1234.5679.00ff00ff00ff00fe.tmp");
  write_bytes(stale, {'s'});
  write_bytes(fresh, {'f'});
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(2));

  // What a user or another tool might keep there.
  const std::vector<fs::path> keep = {
      tmp.path() / "notes.txt",
      tmp.path() / (std::string(32, 'A') + ".fjc"),  // not a key: uppercase
      tmp.path() / "abc.fjc",                        // not a key: too short
      tmp.path() / (k + ".fjc.bak"),
      tmp.path() / ".foo.tmp",
      tmp.path() / (k + ".tmp"),
      tmp.path() / ("." + k + ".1234.5678.00ff00ff00ff00ff.tmp"),  // not a temp of an entry
      tmp.path() / (".notes.txt.1234.5678.00ff00ff00ff00ff.tmp"),
  };
  for (const auto& p : keep) write_bytes(p, {'u'});
  for (const auto& p : keep)
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::hours(2));
  // Names of entries are the cache's: an empty directory or a link there is damage that clear
  // removes (the link, never what it points to); a directory with contents stays.
  const fs::path dir_named_like_entry = tmp.path() / (key_for("dir") + ".fjc");
  fs::create_directory(dir_named_like_entry);
  const fs::path full_dir_named_like_entry = tmp.path() / (key_for("full-dir") + ".fjc");
  fs::create_directory(full_dir_named_like_entry);
  write_bytes(full_dir_named_like_entry / "precious", {'p'});
  const fs::path link_named_like_entry = tmp.path() / (key_for("link") + ".fjc");
  fs::create_symlink(tmp.path() / "notes.txt", link_named_like_entry);

  // three entries, the stale temp file, the empty directory and the link
  CHECK(cache.clear() == 6);
  for (const char* name : {"one", "two", "three"}) {
    CHECK_FALSE(fs::exists(entry_path(cache, key_for(name))));
  }
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(fresh));  // may belong to a writer in another process right now
  for (const auto& p : keep) {
    CAPTURE(p);
    CHECK(fs::is_regular_file(p));
  }
  CHECK_FALSE(fs::exists(dir_named_like_entry));
  CHECK_FALSE(fs::is_symlink(link_named_like_entry));
  CHECK(fs::is_regular_file(full_dir_named_like_entry / "precious"));
  CHECK(cache.clear() == 0);
  CHECK(DiskCache(tmp.path() / "missing").clear() == 0);
}

TEST_CASE("default_dir follows FUSEJIT_CACHE_DIR, then the build tree") {
  const char* saved = std::getenv("FUSEJIT_CACHE_DIR");
  const std::string saved_value = saved != nullptr ? saved : "";

  ::setenv("FUSEJIT_CACHE_DIR", "/somewhere/else", 1);
  CHECK(DiskCache::default_dir() == fs::path("/somewhere/else"));
  CHECK(DiskCache().dir() == fs::path("/somewhere/else"));
  CHECK(DiskCache(fs::path()).dir() == fs::path("/somewhere/else"));

  // Empty means unset.
  ::setenv("FUSEJIT_CACHE_DIR", "", 1);
  CHECK(DiskCache::default_dir() != fs::path(""));
  // ctest runs this binary against the library in the build tree, so the tree's cache/ wins
  // over the user's cache directory.
  if (const char* source = std::getenv("FUSEJIT_SOURCE_DIR")) {
    CHECK(DiskCache::default_dir() == fs::path(source) / "cache");
  }
  ::unsetenv("FUSEJIT_CACHE_DIR");
  CHECK(DiskCache::default_dir() != fs::path(""));

  if (saved != nullptr) ::setenv("FUSEJIT_CACHE_DIR", saved_value.c_str(), 1);
}
