#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/util/fd.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "fusejit/cache/entry_format.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"
#include "fusejit/util/log.hpp"

namespace fusejit {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kKeyDigits = 32;
constexpr std::string_view kEntrySuffix = ".fjc";
constexpr std::string_view kTempSuffix = ".tmp";
// Kernels are a few MB at most; anything this large under our name is damage, and refusing it
// keeps a corrupt or hostile file from making load() allocate without bound.
constexpr std::uintmax_t kMaxEntryBytes = std::uintmax_t{1} << 30;
// A writer holds its temp file for milliseconds; one this old belongs to a process that died
// mid-write. Younger ones may be in flight in another process, so clear() leaves them.
constexpr auto kStaleTempAge = std::chrono::minutes(10);

std::atomic<bool> g_warned_unusable{false};

// load() and store() promise not to throw, and formatting a message can (bad_alloc).
template <typename... Args>
void log_quietly(spdlog::level::level_enum level, fmt::format_string<Args...> format,
                 Args&&... args) noexcept {
  try {
    log()->log(level, format, std::forward<Args>(args)...);
  } catch (...) {
  }
}

bool is_hex_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

bool is_decimal(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_key(std::string_view key) {
  return key.size() == kKeyDigits && is_hex_digits(key);
}

void require_key(const std::string& key) {
  if (!is_key(key)) {
    // Keys become file names: anything else could escape the directory ("../x") or collide.
    const std::string shown = key.size() > 80 ? key.substr(0, 80) + "..." : key;
    throw InvalidArgument("key", "a cache key is 32 lowercase hex digits, got '" + shown + "'");
  }
}

// "<key>.fjc"
bool is_entry_name(std::string_view name) {
  return name.size() == kKeyDigits + kEntrySuffix.size() && name.ends_with(kEntrySuffix) &&
         is_key(name.substr(0, kKeyDigits));
}

// ".<key>.<pid>.<tid>.<random hex>.tmp", exactly what temp_name() makes.
bool is_temp_name(std::string_view name) {
  if (!name.starts_with('.') || !name.ends_with(kTempSuffix)) return false;
  name.remove_prefix(1);
  name.remove_suffix(kTempSuffix.size());
  std::array<std::string_view, 4> parts;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::size_t dot = name.find('.');
    if ((dot == std::string_view::npos) != (i + 1 == parts.size())) return false;
    parts[i] = name.substr(0, dot);
    name.remove_prefix(dot == std::string_view::npos ? name.size() : dot + 1);
  }
  return is_key(parts[0]) && is_decimal(parts[1]) && is_decimal(parts[2]) &&
         is_hex_digits(parts[3]);
}

std::string hex64(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4)
    out[static_cast<std::size_t>(i)] = kDigits[value & 0xF];
  return out;
}

std::uint64_t random_u64() {
  std::uint64_t value = 0;
  if (::getrandom(&value, sizeof(value), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(value))) {
    return value;
  }
  // Without entropy the name is still unique per process and thread (pid, tid, counter);
  // O_EXCL catches the rest.
  static std::atomic<std::uint64_t> counter{0};
  const auto now =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return now ^ (counter.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B97F4A7C15ull);
}

std::string temp_name(const std::string& key) {
  return "." + key + "." + std::to_string(::getpid()) + "." + std::to_string(::gettid()) + "." +
         hex64(random_u64()) + std::string(kTempSuffix);
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// Unlinks the temp file unless the rename went through, whichever way store() leaves.
class TempFileGuard {
 public:
  explicit TempFileGuard(fs::path path) : path_(std::move(path)) {}
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  ~TempFileGuard() {
    if (!committed_) ::unlink(path_.c_str());
  }
  void commit() { committed_ = true; }

 private:
  fs::path path_;
  bool committed_ = false;
};

struct FileRead {
  bool opened = false;   // false: missing (or unreadable: see error)
  bool regular = false;  // a directory or device under our name is not ours to judge
  struct stat st {};     // identity of what was read, to remove only that file
  std::vector<char> bytes;
  std::string error;       // why reading failed (empty when it did not)
  bool too_large = false;  // damage, unlike error
};

FileRead read_file(const fs::path& path) {
  FileRead out;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno != ENOENT && errno != ENOTDIR) out.error = "cannot open: " + errno_text(errno);
    return out;
  }
  out.opened = true;
  if (::fstat(fd.get(), &out.st) != 0) {
    out.error = "cannot stat: " + errno_text(errno);
    return out;
  }
  out.regular = S_ISREG(out.st.st_mode);
  if (!out.regular) return out;
  if (static_cast<std::uintmax_t>(out.st.st_size) > kMaxEntryBytes) {
    out.too_large = true;
    return out;
  }
  // Entries are immutable once renamed into place, but read to EOF anyway rather than trust
  // st_size: a file that changed under us then fails the length check instead of being cut.
  out.bytes.resize(static_cast<std::size_t>(out.st.st_size) + 1);
  std::size_t filled = 0;
  for (;;) {
    if (filled == out.bytes.size()) {
      if (out.bytes.size() > kMaxEntryBytes) {
        out.too_large = true;
        out.bytes.clear();
        return out;
      }
      out.bytes.resize(out.bytes.size() * 2);
    }
    const ssize_t n = ::read(fd.get(), out.bytes.data() + filled, out.bytes.size() - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      out.error = "cannot read: " + errno_text(errno);
      out.bytes.clear();
      return out;
    }
    if (n == 0) break;
    filled += static_cast<std::size_t>(n);
  }
  out.bytes.resize(filled);
  return out;
}

// Removes `path` only if it is still the file we read: another process may have renamed a
// fresh, valid entry into its place since.
void remove_damaged(const fs::path& path, const struct stat& read) {
  struct stat now {};
  if (::stat(path.c_str(), &now) != 0 || now.st_dev != read.st_dev || now.st_ino != read.st_ino) {
    return;
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    log_quietly(spdlog::level::warn, "cannot remove damaged cache entry {}: {}", path.string(),
                errno_text(errno));
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

// Best effort: makes the rename itself durable. A failure here loses at most this entry after
// a power cut, and the next load rebuilds it.
void sync_directory(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) ::fsync(fd.get());
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

DiskCache::DiskCache(fs::path dir) : dir_(std::move(dir)) {
  // An empty path means "wherever the defaults say" (compile_cached's cache_dir = {}).
  if (dir_.empty()) dir_ = default_dir();
}

std::optional<std::vector<char>> DiskCache::load(const std::string& key) const {
  require_key(key);
  try {
    const fs::path path = dir_ / (key + std::string(kEntrySuffix));
    FileRead file = read_file(path);
    if (!file.opened) {
      if (!file.error.empty()) {
        log_quietly(spdlog::level::debug, "cache entry {}: {}", path.string(), file.error);
      }
      return std::nullopt;
    }
    if (!file.regular) {
      log_quietly(spdlog::level::warn, "cache entry {} is not a regular file; ignoring it",
                  path.string());
      return std::nullopt;
    }
    if (!file.error.empty()) {
      // An I/O error says nothing about the bytes on disk: leave the file, rebuild this time.
      log_quietly(spdlog::level::warn, "cache entry {}: {}", path.string(), file.error);
      return std::nullopt;
    }
    std::string problem = "larger than " + std::to_string(kMaxEntryBytes) + " bytes";
    std::optional<CacheEntryView> entry;
    if (!file.too_large) entry = parse_cache_entry(file.bytes, &problem);
    if (!entry) {
      log_quietly(spdlog::level::warn, "damaged cache entry {} ({}); removing it", path.string(),
                  problem);
      remove_damaged(path, file.st);
      return std::nullopt;
    }
    const std::size_t offset = entry->payload_offset;
    file.bytes.erase(file.bytes.begin(), file.bytes.begin() + static_cast<std::ptrdiff_t>(offset));
    return std::move(file.bytes);
  } catch (...) {
    // Only allocation can get here; a miss is always a correct answer.
    return std::nullopt;
  }
}

bool DiskCache::store(const std::string& key, const std::vector<char>& payload,
                      const std::string& description) const {
  require_key(key);
  try {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) {
      std::error_code ignored;
      // Another process may have created it between our check and mkdir.
      if (!fs::is_directory(dir_, ignored)) {
        report_unusable(dir_, "cannot create it: " + ec.message());
        return false;
      }
    }

    const std::string_view text =
        std::string_view(description)
            .substr(0, std::min<std::size_t>(description.size(), kMaxCacheDescriptionBytes));
    const std::vector<char> header = cache_entry_header(payload, text);

    // O_EXCL: the name is meant to be unique already; never write into someone else's file.
    fs::path temp;
    int fd_value = -1;
    for (int attempt = 0; attempt < 8 && fd_value < 0; ++attempt) {
      temp = dir_ / temp_name(key);
      // Test-only (util/fault.hpp): a directory we may not write into.
      if (fault::fire(Fault::disk_read_only)) {
        errno = EACCES;
        break;
      }
      fd_value = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_value < 0 && errno != EEXIST) break;
    }
    if (fd_value < 0) {
      report_unusable(dir_, "cannot create a file in it: " + errno_text(errno));
      return false;
    }
    Fd fd(fd_value);
    TempFileGuard guard(temp);

    if (int err = write_all(fd.get(), header); err != 0) {
      report_unusable(dir_, "cannot write: " + errno_text(err));
      return false;
    }
    // Test-only (util/fault.hpp): the disk filling up halfway through the entry.
    if (int err = fault::fire(Fault::disk_full) ? ENOSPC : write_all(fd.get(), payload); err != 0) {
      report_unusable(dir_, "cannot write: " + errno_text(err));
      return false;
    }
    // Without it a crash after the rename could leave a named entry with missing blocks; the
    // checksum would catch that, but only at the cost of a rebuild.
    if (::fsync(fd.get()) != 0) {
      report_unusable(dir_, "cannot sync: " + errno_text(errno));
      return false;
    }
    if (int err = fd.close(); err != 0) {
      report_unusable(dir_, "cannot close: " + errno_text(err));
      return false;
    }
    const fs::path final_path = dir_ / (key + std::string(kEntrySuffix));
    // Atomic: readers see the old entry, no entry, or this one whole. Racing writers of the
    // same key store the same bytes, so whichever rename lands last is as good.
    if (::rename(temp.c_str(), final_path.c_str()) != 0) {
      report_unusable(dir_, "cannot rename into place: " + errno_text(errno));
      return false;
    }
    guard.commit();
    sync_directory(dir_);
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
    info.key = name.substr(0, kKeyDigits);
    FileRead file = read_file(it->path());
    if (!file.opened) {
      if (file.error.empty()) continue;  // removed since the directory was read
      info.problem = file.error;
    } else if (!file.regular) {
      continue;
    } else {
      info.bytes = static_cast<std::uintmax_t>(file.st.st_size);
      if (!file.error.empty()) {
        info.problem = file.error;
      } else if (file.too_large) {
        info.problem = "larger than " + std::to_string(kMaxEntryBytes) + " bytes";
      } else if (auto entry = parse_cache_entry(file.bytes, &info.problem)) {
        info.valid = true;
        info.description = std::string(entry->description);
      }
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const CacheEntryInfo& a, const CacheEntryInfo& b) { return a.key < b.key; });
  return out;
}

std::size_t DiskCache::clear() const {
  std::vector<fs::path> doomed;
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    // symlink_status: a link named like an entry is not ours; never follow it to delete.
    if (!fs::is_regular_file(it->symlink_status(entry_ec)) || entry_ec) continue;
    const std::string name = it->path().filename().string();
    if (is_entry_name(name)) {
      doomed.push_back(it->path());
    } else if (is_temp_name(name)) {
      const auto written = fs::last_write_time(it->path(), entry_ec);
      if (!entry_ec && now - written > kStaleTempAge) doomed.push_back(it->path());
    }
  }
  std::size_t removed = 0;
  for (const fs::path& path : doomed) {
    std::error_code remove_ec;
    if (fs::remove(path, remove_ec)) {
      ++removed;
    } else if (remove_ec) {
      log_quietly(spdlog::level::warn, "cannot remove {}: {}", path.string(), remove_ec.message());
    }
  }
  return removed;
}

}  // namespace fusejit
