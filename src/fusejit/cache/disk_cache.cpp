#include "fusejit/cache/disk_cache.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "fusejit/cache/entry_format.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/log.hpp"

namespace fusejit {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kEntrySuffix = ".fjc";
// Kernels are a few MB at most; anything this large under our name is damage, and refusing it
// keeps a corrupt or hostile file from making load() allocate without bound.
constexpr std::uintmax_t kMaxEntryBytes = std::uintmax_t{256} << 20;
// A writer holds its temp file for milliseconds; one this old belongs to a process that died
// mid-write. Younger ones may be in flight in another process, so clear() leaves them.
constexpr auto kStaleTempAge = std::chrono::minutes(10);

// load() marks an entry used only when its mark is older than this: a plan made in a loop
// would otherwise write metadata on every call, and eviction needs no finer order.
constexpr std::int64_t kTouchAfterSeconds = 60;
constexpr std::uintmax_t kDefaultMaxBytes = std::uintmax_t{2} << 30;
// store() keeps a running estimate of the directory's total per process and scans only when
// the estimate passes the bound, or after this many stores: other processes' stores are not in
// this process's estimate, and rescanning every so often keeps their share from growing
// unseen, while one directory read per 64 compiles costs nothing next to the compiles.
constexpr unsigned kRescanEveryStores = 64;

std::atomic<bool> g_warned_unusable{false};
std::atomic<std::uintmax_t> g_default_max_bytes{0};  // 0: from the environment

// Per directory: the entries' total as this process last saw it, plus what it stored since.
struct Tally {
  bool known = false;
  std::uintmax_t total = 0;
  unsigned stores_since_scan = 0;
};
std::mutex g_tally_mu;
std::map<std::string, Tally>& tallies() {
  static auto* t = new std::map<std::string, Tally>();  // never destroyed: static-exit safety
  return *t;
}

std::int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// load() and store() promise not to throw, and formatting a message can (bad_alloc).
template <typename... Args>
void log_quietly(spdlog::level::level_enum level, fmt::format_string<Args...> format,
                 Args&&... args) noexcept {
  try {
    log()->log(level, format, std::forward<Args>(args)...);
  } catch (...) {
  }
}

void require_key(const std::string& key) {
  if (!is_cache_key(key)) {
    // Keys become file names: anything else could escape the directory ("../x") or collide.
    const std::string shown = key.size() > 80 ? key.substr(0, 80) + "..." : key;
    throw InvalidArgument("key", "a cache key is 32 lowercase hex digits, got '" + shown + "'");
  }
}

// "<key>.fjc"
bool is_entry_name(std::string_view name) {
  return name.size() == kCacheKeyDigits + kEntrySuffix.size() && name.ends_with(kEntrySuffix) &&
         is_cache_key(name.substr(0, kCacheKeyDigits));
}

// The warning says what is wrong and what happens instead; once per directory and process.
void warn_untrusted_once(const fs::path& dir, const std::string& why) noexcept {
  try {
    static std::mutex mu;
    static auto* warned = new std::set<std::string>();  // never destroyed: static-exit safety
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!warned->insert(dir.string()).second) return;
    }
    log()->warn(
        "kernel cache directory {} is not trusted: {}. Nothing is loaded from or stored there; "
        "kernels are compiled in memory. Use a directory only you (or root) can write, or set "
        "FUSEJIT_CACHE_DIR to one.",
        dir.string(), why);
  } catch (...) {
  }
}

void report_unusable(const fs::path& dir, const std::string& what) noexcept {
  if (!g_warned_unusable.exchange(true)) {
    log_quietly(spdlog::level::warn,
                "kernel cache directory {} is unusable ({}); kernels will be compiled in memory "
                "for this process. Set FUSEJIT_CACHE_DIR to a writable directory to cache them. "
                "Further cache write failures are logged at debug level.",
                dir.string(), what);
  } else {
    log_quietly(spdlog::level::debug, "kernel cache directory {} is unusable ({})", dir.string(),
                what);
  }
}

#if defined(FUSEJIT_BUILD_DIR) && defined(FUSEJIT_TREE_CACHE_DIR)
bool path_has_prefix(const fs::path& path, const fs::path& prefix) {
  auto p = path.begin();
  for (auto q = prefix.begin(); q != prefix.end(); ++q, ++p) {
    if (q->empty()) continue;  // trailing separator
    if (p == path.end() || *p != *q) return false;
  }
  return true;
}

// The library file this code was loaded from lies under the build directory it was built in:
// then tests and examples run from the tree share the tree's cache.
bool running_from_build_tree() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&DiskCache::default_dir), &info) == 0 ||
      info.dli_fname == nullptr || *info.dli_fname == '\0') {
    return false;
  }
  std::error_code ec;
  const fs::path library = fs::weakly_canonical(fs::path(info.dli_fname), ec);
  if (ec) return false;
  const fs::path build = fs::weakly_canonical(fs::path(FUSEJIT_BUILD_DIR), ec);
  if (ec || build.empty()) return false;
  return path_has_prefix(library, build);
}
#endif

const char* non_empty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace

std::optional<std::uintmax_t> parse_byte_size(std::string_view text) {
  std::uintmax_t unit = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        unit = std::uintmax_t{1} << 10;
        break;
      case 'M':
      case 'm':
        unit = std::uintmax_t{1} << 20;
        break;
      case 'G':
      case 'g':
        unit = std::uintmax_t{1} << 30;
        break;
      default:
        break;
    }
    if (unit != 1) text.remove_suffix(1);
  }
  if (text.empty()) return std::nullopt;
  std::uintmax_t n = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  if (n > std::numeric_limits<std::uintmax_t>::max() / unit) return std::nullopt;
  return n * unit;
}

void DiskCache::set_default_max_bytes(std::uintmax_t bytes) {
  g_default_max_bytes = bytes;
}

std::uintmax_t DiskCache::default_max_bytes() {
  if (const std::uintmax_t set = g_default_max_bytes.load(); set != 0) return set;
  // Read on each call (stores are rare next to their compiles), so a changed environment or
  // set_default_max_bytes(0) takes effect; a bad value must not silently lift the bound.
  const char* text = non_empty_env("FUSEJIT_CACHE_MAX_BYTES");
  if (text == nullptr) return kDefaultMaxBytes;
  const std::optional<std::uintmax_t> parsed = parse_byte_size(text);
  if (!parsed || *parsed == 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      log_quietly(spdlog::level::warn,
                  "FUSEJIT_CACHE_MAX_BYTES='{}' is not a positive byte count (like 2G, 500M or "
                  "1048576); using {} bytes",
                  text, kDefaultMaxBytes);
    }
    return kDefaultMaxBytes;
  }
  return *parsed;
}

std::uintmax_t DiskCache::max_bytes() const {
  return max_bytes_ != 0 ? max_bytes_ : default_max_bytes();
}

fs::path DiskCache::default_dir() {
  if (const char* dir = non_empty_env("FUSEJIT_CACHE_DIR")) return fs::path(dir);
#if defined(FUSEJIT_BUILD_DIR) && defined(FUSEJIT_TREE_CACHE_DIR)
  if (running_from_build_tree()) return fs::path(FUSEJIT_TREE_CACHE_DIR);
#endif
  // The XDG spec says relative values are invalid and must be ignored.
  if (const char* xdg = non_empty_env("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return fs::path(xdg) / "fusejit";
  }
  if (const char* home = non_empty_env("HOME")) return fs::path(home) / ".cache" / "fusejit";
  // Services often run without HOME; the password database still knows it.
  std::array<char, 4096> buffer{};
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (::getpwuid_r(::getuid(), &pw, buffer.data(), buffer.size(), &found) == 0 &&
      found != nullptr && found->pw_dir != nullptr && *found->pw_dir != '\0') {
    return fs::path(found->pw_dir) / ".cache" / "fusejit";
  }
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  return tmp / ("fusejit-cache-" + std::to_string(::getuid()));
}

fs::path DiskCache::resolve_dir(const std::string& cache_dir) {
  return cache_dir.empty() ? default_dir() : fs::path(cache_dir);
}

DiskCache::DiskCache(fs::path dir) : dir_(resolve_dir(dir.string())) {
  modes_ = modes_from_env();
  check_access();
}

void DiskCache::check_access() {
  bool exists = false;
  why_ = why_untrusted_directory(dir_, &exists);
  exists_ = exists;
  if (!why_.empty()) {
    access_ = CacheAccess::untrusted;
    warn_untrusted_once(dir_, why_);
  } else if (exists && ::access(dir_.c_str(), W_OK) != 0 && (errno == EACCES || errno == EROFS)) {
    // A deployment image's cache (root's, mounted read-only): load from it, write nothing.
    access_ = CacheAccess::read_only;
  } else {
    access_ = CacheAccess::read_write;
  }
}

std::optional<std::vector<char>> DiskCache::load(const std::string& key) const {
  require_key(key);
  if (access_ == CacheAccess::untrusted) return std::nullopt;
  try {
    const fs::path path = dir_ / (key + std::string(kEntrySuffix));
    Inspected entry = inspect(path, key);
    switch (entry.status) {
      case FileStatus::missing:
        return std::nullopt;
      case FileStatus::error:
        // An I/O error says nothing about the bytes on disk: leave the file, rebuild this time.
        log_quietly(spdlog::level::warn, "cache entry {}: {}", path.string(), entry.problem);
        return std::nullopt;
      case FileStatus::foreign:
        // Not ours to remove; a trusted directory only holds one when root put it there.
        log_quietly(spdlog::level::warn, "cache entry {} is {}; not loading it", path.string(),
                    entry.problem);
        return std::nullopt;
      case FileStatus::ok:
        if (entry.problem.empty()) {
          // The mtime is the entry's last use, which prune() evicts by. A failure (an entry
          // root stored in our directory) only makes it look older than it is.
          if (access_ == CacheAccess::read_write &&
              now_seconds() - static_cast<std::int64_t>(entry.st.st_mtime) > kTouchAfterSeconds) {
            const struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
            (void)::futimens(entry.fd.get(), times);
          }
          entry.bytes.erase(entry.bytes.begin(), entry.bytes.begin() + static_cast<std::ptrdiff_t>(
                                                                           entry.payload_offset));
          return std::move(entry.bytes);
        }
        [[fallthrough]];
      case FileStatus::not_regular:
      case FileStatus::too_large:
        break;
    }
    if (access_ == CacheAccess::read_only) {
      log_quietly(spdlog::level::warn, "damaged cache entry {} ({}); ignoring it (read-only cache)",
                  path.string(), entry.problem);
      return std::nullopt;
    }
    log_quietly(spdlog::level::warn, "damaged cache entry {} ({}); removing it", path.string(),
                entry.problem);
    if (const std::string why = remove_if_same(path, entry.st); !why.empty()) {
      log_quietly(spdlog::level::warn, "cannot remove damaged cache entry {}: {}", path.string(),
                  why);
    }
    return std::nullopt;
  } catch (...) {
    // Only allocation can get here; a miss is always a correct answer.
    return std::nullopt;
  }
}

DiskCache::Inspected DiskCache::inspect(const fs::path& path, std::string_view key) {
  Inspected out;
  OpenFile file = open_regular_file(path);
  out.status = file.status;
  out.st = file.st;
  out.problem = std::move(file.why);
  if (file.status != FileStatus::ok) return out;
  const auto on_disk = static_cast<std::uintmax_t>(file.st.st_size);
  if (on_disk > kMaxEntryBytes) {
    out.status = FileStatus::too_large;
    out.problem = "larger than " + std::to_string(kMaxEntryBytes) + " bytes";
    return out;
  }
  // The header says how long the entry is: a file of another size is damage, found without
  // reading (or allocating) more than the header.
  std::vector<char> head(kCacheEntryFixedBytes);
  const ssize_t got = ::pread(file.fd.get(), head.data(), head.size(), 0);
  if (got < 0) {
    out.status = FileStatus::error;
    out.problem = "cannot read: " + errno_text(errno);
    return out;
  }
  head.resize(static_cast<std::size_t>(got));
  const std::optional<std::uint64_t> declared = cache_entry_declared_size(head, &out.problem);
  if (!declared) return out;
  if (*declared != on_disk) {
    out.problem = fmt::format("{} bytes on disk, the header declares {} ({})", on_disk, *declared,
                              on_disk < *declared ? "truncated" : "trailing bytes");
    return out;
  }
  if (::lseek(file.fd.get(), 0, SEEK_SET) != 0) {
    out.status = FileStatus::error;
    out.problem = "cannot seek: " + errno_text(errno);
    return out;
  }
  ReadBytes whole = read_at_most(file.fd.get(), static_cast<std::size_t>(*declared));
  if (whole.status != FileStatus::ok) {
    out.status = whole.status == FileStatus::error ? FileStatus::error : FileStatus::ok;
    out.problem = whole.status == FileStatus::error ? whole.why : "grew while it was read";
    return out;
  }
  out.bytes = std::move(whole.bytes);
  const std::optional<CacheEntryView> entry = parse_cache_entry(out.bytes, &out.problem);
  if (!entry) return out;
  if (entry->key != key) {
    out.problem = fmt::format("built for key {}, stored under {}", entry->key, key);
    return out;
  }
  out.description = std::string(entry->description);
  out.payload_offset = entry->payload_offset;
  out.problem.clear();
  out.fd = std::move(file.fd);
  return out;
}

bool DiskCache::store(const std::string& key, const std::vector<char>& payload,
                      const std::string& description) const {
  require_key(key);
  if (access_ == CacheAccess::untrusted) return false;  // warned once already
  if (access_ == CacheAccess::read_only) {
    report_unusable(dir_, "it is read-only for this user");
    return false;
  }
  try {
    if (!exists_) {
      if (const std::string why = create_directories(dir_, modes_.dir); !why.empty()) {
        report_unusable(dir_, why);
        return false;
      }
      // What we created must pass the same checks as what we found (a parent may not).
      bool exists = false;
      if (const std::string why = why_untrusted_directory(dir_, &exists); !why.empty()) {
        warn_untrusted_once(dir_, why);
        return false;
      }
    }
    const std::string_view text =
        std::string_view(description)
            .substr(0, std::min<std::size_t>(description.size(), kMaxCacheDescriptionBytes));
    const std::vector<char> header = cache_entry_header(payload, key, text);
    const fs::path path = dir_ / (key + std::string(kEntrySuffix));
    // Racing writers of the same key store the same bytes, so whichever rename lands last is
    // as good.
    const std::string why = write_file_atomically(path, {header, payload}, modes_.file);
    if (!why.empty()) {
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        // One bad name costs one entry, not the whole cache.
        log_quietly(spdlog::level::warn, "cannot store cache entry {}: a directory has its name",
                    path.string());
      } else {
        report_unusable(dir_, why);
      }
      return false;
    }
    bound_after_store(key, header.size() + payload.size());
    return true;
  } catch (const std::exception& e) {
    report_unusable(dir_, e.what());
    return false;
  } catch (...) {
    report_unusable(dir_, "unknown error");
    return false;
  }
}

std::vector<CacheEntryInfo> DiskCache::list() const {
  std::vector<CacheEntryInfo> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_entry_name(name)) continue;
    CacheEntryInfo info;
    info.key = name.substr(0, kCacheKeyDigits);
    Inspected entry = inspect(it->path(), info.key);
    if (entry.status == FileStatus::missing) continue;  // removed since the directory was read
    info.bytes = entry.status == FileStatus::ok || entry.status == FileStatus::too_large
                     ? static_cast<std::uintmax_t>(entry.st.st_size)
                     : 0;
    info.valid = entry.status == FileStatus::ok && entry.problem.empty();
    info.problem = std::move(entry.problem);
    info.description = std::move(entry.description);
    if (entry.status != FileStatus::error) info.last_use = entry.st.st_mtime;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) { return a.key < b.key; });
  return out;
}

std::size_t DiskCache::clear() const {
  // As prune: nothing in a directory we do not trust (another user's files may be there) or
  // cannot write.
  if (access_ != CacheAccess::read_write) return 0;
  std::vector<fs::path> doomed;
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_entry_name(name)) {
      // Whatever holds an entry's name goes: a link or FIFO there is damage, and removing the
      // name never touches what a link points to.
      doomed.push_back(it->path());
    } else if (auto target = temp_file_target(name); target && is_entry_name(*target)) {
      std::error_code entry_ec;
      const auto status = it->symlink_status(entry_ec);
      if (entry_ec || !fs::is_regular_file(status)) continue;
      const auto written = fs::last_write_time(it->path(), entry_ec);
      if (!entry_ec && now - written > kStaleTempAge) doomed.push_back(it->path());
    }
  }
  std::size_t removed = 0;
  for (const fs::path& path : doomed) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    // A directory is removed only when empty: what is inside may be someone's.
    const int rc = S_ISDIR(st.st_mode) ? ::rmdir(path.c_str()) : ::unlink(path.c_str());
    if (rc == 0) {
      ++removed;
    } else if (errno != ENOENT) {
      log_quietly(spdlog::level::warn, "cannot remove {}: {}", path.string(), errno_text(errno));
    }
  }
  return removed;
}

CachePruneResult DiskCache::prune(std::uintmax_t max_bytes) const {
  if (access_ != CacheAccess::read_write) return {};
  const CachePruneResult r = prune_entries(max_bytes, max_bytes, {});
  // What this process knows of the directory is exact now: store() need not rescan soon.
  try {
    std::lock_guard<std::mutex> lock(g_tally_mu);
    Tally& t = tallies()[dir_.string()];
    t = Tally{true, r.bytes_left, 0};
  } catch (...) {
  }
  return r;
}

void DiskCache::bound_after_store(const std::string& key, std::uintmax_t bytes) const noexcept {
  try {
    const std::uintmax_t bound = max_bytes();
    {
      std::lock_guard<std::mutex> lock(g_tally_mu);
      Tally& t = tallies()[dir_.string()];
      // A store over an existing entry counts twice: the estimate errs toward scanning early.
      t.total += bytes;
      if (t.known && t.total <= bound && ++t.stores_since_scan < kRescanEveryStores) return;
      t.stores_since_scan = 0;
    }
    // Down to 90%, not to the bound itself: a cache at its bound would otherwise rescan on
    // every store, while this leaves room for many stores between scans.
    const CachePruneResult r =
        prune_entries(bound, bound - bound / 10, key + std::string(kEntrySuffix));
    if (r.removed != 0) {
      log_quietly(spdlog::level::debug,
                  "kernel cache {}: removed {} least recently used entries ({} bytes) to stay "
                  "within {} bytes",
                  dir_.string(), r.removed, r.bytes_removed, bound);
    }
    std::lock_guard<std::mutex> lock(g_tally_mu);
    Tally& t = tallies()[dir_.string()];
    t.known = true;
    t.total = r.bytes_left;
  } catch (...) {
    // Bounding the cache is housekeeping: the entry is stored whatever happens here.
  }
}

CachePruneResult DiskCache::prune_entries(std::uintmax_t trigger, std::uintmax_t target,
                                          std::string_view keep) const {
  struct Candidate {
    fs::path path;
    struct stat st;
  };
  CachePruneResult out;
  std::vector<Candidate> candidates;
  const uid_t me = ::geteuid();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_entry_name(name)) continue;
    struct stat st {};
    // lstat: a link counts (and goes) as itself, never as what it points to.
    if (::lstat(it->path().c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
    out.bytes_left += static_cast<std::uintmax_t>(st.st_size);
    if (name == keep || st.st_uid != me) continue;
    candidates.push_back({it->path(), st});
  }
  if (out.bytes_left <= trigger) return out;
  // Oldest mark first; the name breaks ties so the order does not depend on the directory's.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.st.st_mtim.tv_sec != b.st.st_mtim.tv_sec)
      return a.st.st_mtim.tv_sec < b.st.st_mtim.tv_sec;
    if (a.st.st_mtim.tv_nsec != b.st.st_mtim.tv_nsec)
      return a.st.st_mtim.tv_nsec < b.st.st_mtim.tv_nsec;
    return a.path < b.path;
  });
  for (const Candidate& c : candidates) {
    if (out.bytes_left <= target) break;
    struct stat now {};
    // Only the file that was scanned, and only if nobody used it since: another process may
    // have renamed a fresh entry into the name or loaded this one meanwhile.
    if (::lstat(c.path.c_str(), &now) != 0 || now.st_dev != c.st.st_dev ||
        now.st_ino != c.st.st_ino || now.st_mtim.tv_sec != c.st.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != c.st.st_mtim.tv_nsec) {
      continue;
    }
    if (::unlink(c.path.c_str()) != 0) {
      if (errno != ENOENT)
        log_quietly(spdlog::level::warn, "cannot remove {}: {}", c.path.string(),
                    errno_text(errno));
      continue;
    }
    ++out.removed;
    out.bytes_removed += static_cast<std::uintmax_t>(c.st.st_size);
    out.bytes_left -= std::min(out.bytes_left, static_cast<std::uintmax_t>(c.st.st_size));
  }
  return out;
}

}  // namespace fusejit
