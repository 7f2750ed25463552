// The kernel cache and the tuning database never serve what was not built for the request
// from a place no other user controls: entries bound to their key, directories and files
// trusted as ssh trusts ~/.ssh, only regular files opened (a FIFO never hangs a reader), reads
// bounded by what the header declares. Each case is a repro of issue 22 turned into a test.
#include <doctest/doctest.h>

#include "test_bytes.hpp"
#include "test_process.hpp"
#include "test_tempdir.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/cache/entry_format.hpp"
#include "fusejit/error.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/durable_file.hpp"
#include "fusejit/util/hash.hpp"
#include "fusejit/util/log.hpp"

namespace fs = std::filesystem;
using fusejit::CacheAccess;
using fusejit::DiskCache;
using fusejit::test::in_child;
using fusejit::test::key_for;
using fusejit::test::payload;
using fusejit::test::TempDir;

namespace {

const bool kLogLevelSet = fusejit::test::log_warnings_for_tests();

// A uid no account here uses, standing for "another user".
constexpr uid_t kOtherUser = 12345;
using fusejit::test::kNobody;

fs::path entry_path(const fs::path& dir, const std::string& key) {
  return dir / (key + ".fjc");
}

unsigned mode_of(const fs::path& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Bytes this process has read through read(2) and friends so far (/proc/self/io "rchar"), or
// -1 where the kernel does not say.
long long bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string name;
  long long value = 0;
  while (io >> name >> value)
    if (name == "rchar:") return value;
  return -1;
}

fusejit::TuningIdentity identity() {
  fusejit::TuningIdentity id;
  id.name = "Test GPU";
  id.cc = 90;
  id.driver = 13000;
  id.nvrtc = "13.0";
  id.fusejit = "test";
  id.fingerprint = "Test GPU|cc90|driver13000|nvrtc13.0|fusejittest";
  return id;
}

fusejit::TuningEntry tuning_entry() {
  fusejit::TuningEntry e;
  e.problem.M = 256, e.problem.N = 128, e.problem.K = 64;
  e.winner = "tiled.128x128x64.w2x2.s3.g8";
  e.winner_ms = 0.5;
  e.reference_ms = 0.7;
  e.best_fused = e.winner;
  e.best_fused_ms = 0.5;
  e.runner_up = "reference";
  e.runner_up_ms = 0.7;
  e.error = 1e-3;
  e.candidates = 4;
  e.timestamp = 1700000000;
  return e;
}

// Runs `body` in a child that SIGALRM kills after `seconds`: a hang becomes exit code 142.
int in_child_with_deadline(unsigned seconds, const std::function<int()>& body) {
  return in_child([&] {
    ::alarm(seconds);
    return body();
  });
}

}  // namespace

TEST_CASE("an entry stored under another key is rebuilt, not served, and verify reports it") {
  REQUIRE(kLogLevelSet);
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string a = key_for("fp16 kernel"), b = key_for("bf16 kernel");
  REQUIRE(cache.store(a, payload(3000, 1), "fp16"));
  REQUIRE(cache.store(b, payload(3000, 2), "bf16"));
  // What `mv D/A.fjc D/B.fjc` did: B's name, A's kernel (same length, valid checksums).
  fs::rename(entry_path(tmp.path(), a), entry_path(tmp.path(), b));

  const auto listed = cache.list();
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(listed[0].problem.find("built for key " + a) != std::string::npos);

  const auto warnings = fusejit::log_warning_count();
  CHECK_FALSE(cache.load(b).has_value());
  CHECK(fusejit::log_warning_count() == warnings + 1);
  CHECK_FALSE(fs::exists(entry_path(tmp.path(), b)));
  // The caller rebuilds; the rebuilt entry is served.
  REQUIRE(cache.store(b, payload(3000, 2), "bf16"));
  CHECK(cache.load(b) == payload(3000, 2));
}

TEST_CASE("entries of the previous format version are rejected, not trusted") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("old format");
  REQUIRE(cache.store(key, payload(500, 3), "old"));
  // Rewrite the version field to 1 (and re-sign the header, so only the version is wrong).
  std::vector<char> bytes;
  {
    std::ifstream in(entry_path(tmp.path(), key), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[8] = 1;
  const std::size_t signed_bytes = fusejit::kCacheEntryFixedBytes + 3;  // "old"
  const std::uint64_t sum = fusejit::xxh3_64(bytes.data(), signed_bytes);
  for (int i = 0; i < 8; ++i)
    bytes[signed_bytes + static_cast<std::size_t>(i)] = static_cast<char>(sum >> (8 * i));
  std::ofstream(entry_path(tmp.path(), key), std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const auto listed = cache.list();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].problem.find("format version 1") != std::string::npos);
  CHECK_FALSE(cache.load(key).has_value());
  CHECK_FALSE(fs::exists(entry_path(tmp.path(), key)));
}

TEST_CASE("directories are created 0700 and entries 0600 whatever the umask") {
  TempDir tmp;
  const int code = in_child([&] {
    ::umask(0);
    ::unsetenv("FUSEJIT_CACHE_SHARED");
    const DiskCache cache(tmp.path() / "a" / "b");
    if (!cache.store(key_for("m"), payload(10, 4), "")) return 1;
    return 0;
  });
  REQUIRE(code == 0);
  CHECK(mode_of(tmp.path() / "a") == 0700);
  CHECK(mode_of(tmp.path() / "a" / "b") == 0700);
  CHECK(mode_of(entry_path(tmp.path() / "a" / "b", key_for("m"))) == 0600);
  // No umask widens what the library promises, and none narrows it below what it needs.
  const int narrow = in_child([&] {
    ::umask(0777);
    const DiskCache cache(tmp.path() / "c");
    return cache.store(key_for("n"), payload(10, 5), "") ? 0 : 1;
  });
  REQUIRE(narrow == 0);
  CHECK(mode_of(tmp.path() / "c") == 0700);
  CHECK(mode_of(entry_path(tmp.path() / "c", key_for("n"))) == 0600);
}

TEST_CASE("FUSEJIT_CACHE_SHARED=1 writes a cache other users can read (0755/0644)") {
  TempDir tmp;
  const int code = in_child([&] {
    ::umask(0077);
    ::setenv("FUSEJIT_CACHE_SHARED", "1", 1);
    const DiskCache cache(tmp.path() / "deploy");
    return cache.store(key_for("s"), payload(10, 6), "") ? 0 : 1;
  });
  REQUIRE(code == 0);
  CHECK(mode_of(tmp.path() / "deploy") == 0755);
  CHECK(mode_of(entry_path(tmp.path() / "deploy", key_for("s"))) == 0644);
}

TEST_CASE("a cache directory others may write is not used: nothing loaded, stored or removed") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "open";
  const std::string key = key_for("planted");
  REQUIRE(DiskCache(dir).store(key, payload(100, 7), "planted"));
  for (const unsigned mode : {0777u, 0770u, 0702u}) {
    CAPTURE(mode);
    fs::permissions(dir, static_cast<fs::perms>(mode));
    const int code = in_child([&] {
      const auto before = fusejit::log_warning_count();
      const DiskCache cache(dir);
      if (cache.access() != CacheAccess::untrusted) return 1;
      if (cache.why_untrusted().find("writable by its group or by everyone") == std::string::npos)
        return 2;
      if (cache.load(key).has_value()) return 3;
      if (cache.store(key_for("new"), payload(10, 8), "")) return 4;
      if (DiskCache(dir).load(key).has_value()) return 5;
      if (fusejit::log_warning_count() != before + 1) return 6;  // once per directory
      if (cache.clear() != 0) return 7;  // `fusejit cache clear` there: the planted entry stays
      return 0;
    });
    CHECK(code == 0);
    CHECK(fs::exists(entry_path(dir, key)));
    CHECK_FALSE(fs::exists(entry_path(dir, key_for("new"))));
  }
  fs::permissions(dir, fs::perms::owner_all);
  CHECK(DiskCache(dir).access() == CacheAccess::read_write);
  CHECK(DiskCache(dir).load(key).has_value());
}

TEST_CASE("a directory above the cache that others may rename in makes it untrusted") {
  TempDir tmp;
  const fs::path up = tmp.path() / "up";
  const fs::path dir = up / "cache";
  REQUIRE(DiskCache(dir).store(key_for("x"), payload(10, 9), ""));
  fs::permissions(up, static_cast<fs::perms>(0777));
  {
    const DiskCache cache(dir);
    CHECK(cache.access() == CacheAccess::untrusted);
    CHECK(cache.why_untrusted().find("not sticky") != std::string::npos);
  }
  // The sticky bit (as on /tmp) forbids renaming other users' entries: safe again.
  fs::permissions(up, static_cast<fs::perms>(01777));
  CHECK(DiskCache(dir).access() == CacheAccess::read_write);
  CHECK(DiskCache(dir).load(key_for("x")).has_value());
}

TEST_CASE("a symlinked cache directory is as trusted as where it leads") {
  TempDir tmp;
  const fs::path real = tmp.path() / "real";
  REQUIRE(DiskCache(real).store(key_for("l"), payload(10, 10), ""));
  fs::create_directory_symlink(real, tmp.path() / "link");
  CHECK(DiskCache(tmp.path() / "link").access() == CacheAccess::read_write);
  CHECK(DiskCache(tmp.path() / "link").load(key_for("l")).has_value());
  fs::permissions(real, static_cast<fs::perms>(0777));
  CHECK(DiskCache(tmp.path() / "link").access() == CacheAccess::untrusted);
  fs::permissions(real, fs::perms::owner_all);
}

TEST_CASE("another user's directory or entry is not used (root: files chowned to that user)") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: giving a file to another user needs root; the mode checks run as anyone");
    return;
  }
  TempDir tmp;
  const fs::path dir = tmp.path() / "theirs";
  const std::string key = key_for("theirs");
  REQUIRE(DiskCache(dir).store(key, payload(100, 11), ""));
  REQUIRE(::chown(dir.c_str(), kOtherUser, kOtherUser) == 0);
  {
    const DiskCache cache(dir);
    CHECK(cache.access() == CacheAccess::untrusted);
    CHECK(cache.why_untrusted().find("owned by uid 12345") != std::string::npos);
    CHECK_FALSE(cache.load(key).has_value());
  }
  REQUIRE(::chown(dir.c_str(), 0, 0) == 0);
  // A trusted directory, but an entry another user owns: refused, and not ours to remove.
  REQUIRE(::chown(entry_path(dir, key).c_str(), kOtherUser, kOtherUser) == 0);
  const DiskCache cache(dir);
  CHECK(cache.access() == CacheAccess::read_write);
  CHECK_FALSE(cache.load(key).has_value());
  CHECK(fs::exists(entry_path(dir, key)));
  const auto listed = cache.list();
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(listed[0].problem.find("owned by uid 12345") != std::string::npos);
  // A symlink another user owns, even to a good directory, can be re-pointed after the check.
  REQUIRE(::chown(entry_path(dir, key).c_str(), 0, 0) == 0);
  const fs::path link = tmp.path() / "their-link";
  fs::create_directory_symlink(dir, link);
  REQUIRE(::lchown(link.c_str(), kOtherUser, kOtherUser) == 0);
  CHECK(DiskCache(link).access() == CacheAccess::untrusted);
}

TEST_CASE("a non-root process refuses a cache another user planted for it") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: switching to another user needs root (run the suite as root to cover it)");
    return;
  }
  TempDir tmp;
  // The unprivileged child must be able to reach the directories at all.
  fs::permissions(tmp.path(), static_cast<fs::perms>(0755));
  const fs::path planted = tmp.path() / "fusejit-cache-65534";
  const fs::path own = tmp.path() / "own";
  const std::string key = key_for("victim's kernel");
  {
    const int code = in_child([&] {
      ::setenv("FUSEJIT_CACHE_SHARED", "1", 1);  // readable by the victim
      return DiskCache(planted).store(key, payload(100, 12), "planted") &&
                     DiskCache(own).store(key, payload(100, 13), "own")
                 ? 0
                 : 1;
    });
    REQUIRE(code == 0);
  }
  // The attacker owns the planted directory; the victim owns its own.
  for (const auto& p : {planted, entry_path(planted, key)})
    REQUIRE(::chown(p.c_str(), kOtherUser, kOtherUser) == 0);
  for (const auto& p : {own, entry_path(own, key)})
    REQUIRE(::chown(p.c_str(), kNobody, kNobody) == 0);
  const int code = in_child([&] {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 50;
    if (::geteuid() != kNobody) return 51;
    const DiskCache attacker(planted);
    if (attacker.access() != CacheAccess::untrusted) return 1;
    if (attacker.load(key).has_value()) return 2;
    const DiskCache victim(own);
    if (victim.access() != CacheAccess::read_write) return 3;
    const auto loaded = victim.load(key);
    if (!loaded || *loaded != payload(100, 13)) return 4;
    return 0;
  });
  CHECK(code == 0);
}

TEST_CASE("a trusted directory this user cannot write is a read-only cache") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ro";
  const std::string key = key_for("ro");
  auto read_only_use = [&] {
    const DiskCache cache(dir);
    if (cache.access() != CacheAccess::read_only) return 1;
    const auto loaded = cache.load(key);
    if (!loaded || *loaded != payload(10, 14)) return 2;
    if (cache.store(key_for("other"), payload(10, 15), "")) return 3;
    return 0;
  };
  if (::geteuid() == 0) {
    // The deployment image: root warms a shared cache, an unprivileged service reads it.
    fs::permissions(tmp.path(), static_cast<fs::perms>(0755));
    REQUIRE(in_child([&] {
              ::setenv("FUSEJIT_CACHE_SHARED", "1", 1);
              return DiskCache(dir).store(key, payload(10, 14), "") ? 0 : 1;
            }) == 0);
    CHECK(in_child([&] {
            if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 50;
            return read_only_use();
          }) == 0);
  } else {
    REQUIRE(DiskCache(dir).store(key, payload(10, 14), ""));
    fs::permissions(dir, static_cast<fs::perms>(0555));
    CHECK(in_child(read_only_use) == 0);
    fs::permissions(dir, fs::perms::owner_all);
  }
  CHECK_FALSE(fs::exists(entry_path(dir, key_for("other"))));
}

TEST_CASE("FIFOs, links and directories named like entries never hang, are reported, cleared") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string fifo = key_for("fifo"), link = key_for("link"), good = key_for("good");
  REQUIRE(cache.store(good, payload(100, 16), "good"));
  REQUIRE(::mkfifo(entry_path(tmp.path(), fifo).c_str(), 0600) == 0);
  // A link to a valid entry of the same key elsewhere: still not followed.
  const DiskCache elsewhere(tmp.path() / "elsewhere");
  REQUIRE(elsewhere.store(link, payload(100, 17), "elsewhere"));
  fs::create_symlink(entry_path(elsewhere.dir(), link), entry_path(tmp.path(), link));

  // Opening a FIFO for reading waits for a writer: before, load, list and clear hung here.
  const int listing_first =
      in_child_with_deadline(20, [&] { return cache.list().size() == 3 ? 0 : 1; });
  CHECK(listing_first == 0);
  const int loading =
      in_child_with_deadline(20, [&] { return cache.load(fifo).has_value() ? 1 : 0; });
  CHECK(loading == 0);
  CHECK_FALSE(fs::exists(entry_path(tmp.path(), fifo)));  // removed as damage
  REQUIRE(::mkfifo(entry_path(tmp.path(), fifo).c_str(), 0600) == 0);
  const int listing = in_child_with_deadline(20, [&] {
    const auto listed = cache.list();
    int fifos = 0, links = 0, ok = 0;
    for (const auto& e : listed) {
      if (e.key == fifo && !e.valid && e.problem == "a FIFO") ++fifos;
      if (e.key == link && !e.valid && e.problem == "a symbolic link") ++links;
      if (e.key == good && e.valid) ++ok;
    }
    return fifos == 1 && links == 1 && ok == 1 ? 0 : 1;
  });
  CHECK(listing == 0);
  CHECK_FALSE(cache.load(link).has_value());
  CHECK_FALSE(fs::is_symlink(entry_path(tmp.path(), link)));
  CHECK(fs::exists(entry_path(elsewhere.dir(), link)));  // what the link pointed to is intact
  const int clearing = in_child_with_deadline(20, [&] { return cache.clear() == 2 ? 0 : 1; });
  CHECK(clearing == 0);
  CHECK_FALSE(fs::exists(entry_path(tmp.path(), fifo)));
}

TEST_CASE("a file longer than its header declares is refused without reading it") {
  TempDir tmp;
  const DiskCache cache(tmp.path());
  const std::string key = key_for("padded");
  REQUIRE(cache.store(key, payload(70000, 18), "71 KB"));
  // 200 MB on disk (sparse) behind a header that declares 70 KB.
  fs::resize_file(entry_path(tmp.path(), key), std::uintmax_t{200} << 20);
  const long long before = bytes_read_so_far();
  const auto listed = cache.list();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].problem.find("the header declares") != std::string::npos);
  CHECK_FALSE(cache.load(key).has_value());
  const long long after = bytes_read_so_far();
  if (before < 0 || after < 0) {
    MESSAGE("/proc/self/io is not available: the read volume was not measured");
  } else {
    CHECK(after - before < (1 << 20));
  }
  CHECK_FALSE(fs::exists(entry_path(tmp.path(), key)));
}

TEST_CASE("write_file_atomically's temp names are recognized, and only they") {
  using fusejit::temp_file_target;
  CHECK(temp_file_target(".abc.fjc.12.34.00112233445566ff.tmp") == "abc.fjc");
  CHECK(temp_file_target(".a.b.c.json.1.2.0123456789abcdef.tmp") == "a.b.c.json");
  CHECK_FALSE(temp_file_target(".abc.12.34.0011.tmp").has_value());  // short random part
  CHECK_FALSE(temp_file_target("abc.12.34.00112233445566ff.tmp").has_value());
  CHECK_FALSE(temp_file_target(".abc.x2.34.00112233445566ff.tmp").has_value());
  CHECK_FALSE(temp_file_target("..12.34.00112233445566ff.tmp").has_value());
  CHECK_FALSE(temp_file_target(".foo.tmp").has_value());
}

TEST_CASE("text inputs named by the user are bounded: /dev/zero fails fast with the argument") {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)fusejit::read_text_input("/dev/zero", "shapes-file");
    FAIL("read /dev/zero to the end");
  } catch (const fusejit::InvalidArgument& e) {
    CHECK(e.argument() == "shapes-file");
    CHECK(std::string(e.what()).find("larger than") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  TempDir tmp;
  try {
    (void)fusejit::read_text_input(tmp.path(), "sweep");
    FAIL("read a directory");
  } catch (const fusejit::InvalidArgument& e) {
    CHECK(e.argument() == "sweep");
  }
  std::ofstream(tmp.path() / "shapes") << "1x2x3\n";
  CHECK(fusejit::read_text_input(tmp.path() / "shapes", "shapes-file") == "1x2x3\n");
}

TEST_CASE("the tuning database: a FIFO under its name never hangs; an untrusted dir is unused") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "tuning";
  const fusejit::TuningDb db(dir, identity());
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all);
  REQUIRE(::mkfifo(db.path().c_str(), 0600) == 0);
  const int code = in_child_with_deadline(20, [&] {
    if (!db.table()->entries.empty()) return 1;
    try {
      (void)fusejit::read_tuning_file(db.path());
      return 2;
    } catch (const fusejit::Error& e) {
      if (std::string(e.what()).find("not a regular file") == std::string::npos) return 3;
    }
    return 0;
  });
  CHECK(code == 0);
  fs::remove(db.path());

  // Files 0600 whatever the umask; an untrusted directory is neither read nor written.
  const int record = in_child([&] {
    ::umask(0);
    return db.record(tuning_entry()) ? 0 : 1;
  });
  REQUIRE(record == 0);
  CHECK(mode_of(db.path()) == 0600);
  fs::permissions(dir, static_cast<fs::perms>(0777));
  const int untrusted = in_child([&] {
    const fusejit::TuningDb fresh(dir, identity());
    if (!fresh.table()->entries.empty()) return 1;  // the recorded entry is not trusted
    if (fresh.record(tuning_entry())) return 2;     // kept in memory only
    if (fresh.table()->entries.size() != 1) return 3;
    return 0;
  });
  CHECK(untrusted == 0);
  fs::permissions(dir, fs::perms::owner_all);
  CHECK(fusejit::TuningDb(dir, identity()).table()->entries.size() == 1);
}
