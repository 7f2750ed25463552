#include "fusejit/util/durable_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"

namespace fusejit {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempSuffix = ".tmp";

bool is_digits(std::string_view text, bool hex) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [hex](char c) {
    return (c >= '0' && c <= '9') || (hex && c >= 'a' && c <= 'f');
  });
}

bool owner_trusted(uid_t owner) {
  return owner == ::geteuid() || owner == 0;
}

std::string owner_text(uid_t owner) {
  return fmt::format("uid {}, not you (uid {}) or root", owner, ::geteuid());
}

}  // namespace

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
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

FileModes modes_from_env() {
  const char* shared = std::getenv("FUSEJIT_CACHE_SHARED");
  return shared != nullptr && std::string_view(shared) == "1" ? kSharedModes : kPrivateModes;
}

OpenFile open_regular_file(const fs::path& path) {
  OpenFile out;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  out.fd = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!out.fd) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      out.status = FileStatus::missing;
    } else if (err == ELOOP) {
      out.status = FileStatus::not_regular;
      out.why = "a symbolic link";
      ::lstat(path.c_str(), &out.st);
    } else if (err == ENXIO || err == EISDIR) {
      out.status = FileStatus::not_regular;
      out.why = err == EISDIR ? "a directory" : "a socket or device";
      ::lstat(path.c_str(), &out.st);
    } else {
      out.status = FileStatus::error;
      out.why = "cannot open: " + errno_text(err);
    }
    return out;
  }
  if (::fstat(out.fd.get(), &out.st) != 0) {
    out.status = FileStatus::error;
    out.why = "cannot stat: " + errno_text(errno);
    return out;
  }
  if (!S_ISREG(out.st.st_mode)) {
    out.status = FileStatus::not_regular;
    out.why = S_ISDIR(out.st.st_mode)    ? "a directory"
              : S_ISFIFO(out.st.st_mode) ? "a FIFO"
                                         : "not a regular file";
    return out;
  }
  if (!owner_trusted(out.st.st_uid)) {
    out.status = FileStatus::foreign;
    out.why = "owned by " + owner_text(out.st.st_uid);
    return out;
  }
  // Regular files never block; back to blocking reads so read() has no EAGAIN to handle.
  const int flags = ::fcntl(out.fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(out.fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  out.status = FileStatus::ok;
  return out;
}

ReadBytes read_at_most(int fd, std::size_t limit) {
  ReadBytes out;
  std::size_t filled = 0;
  out.bytes.resize(std::min<std::size_t>(limit, std::size_t{64} << 10) + 1);
  for (;;) {
    if (filled == out.bytes.size()) {
      if (filled > limit) {
        out.status = FileStatus::too_large;
        out.why = fmt::format("larger than {} bytes", limit);
        out.bytes.clear();
        return out;
      }
      out.bytes.resize(std::min(limit + 1, out.bytes.size() * 2));
    }
    const ssize_t n = ::read(fd, out.bytes.data() + filled, out.bytes.size() - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      out.status = FileStatus::error;
      out.why = "cannot read: " + errno_text(errno);
      out.bytes.clear();
      return out;
    }
    if (n == 0) break;
    filled += static_cast<std::size_t>(n);
  }
  if (filled > limit) {
    out.status = FileStatus::too_large;
    out.why = fmt::format("larger than {} bytes", limit);
    out.bytes.clear();
    return out;
  }
  out.bytes.resize(filled);
  return out;
}

FileRead read_regular_file(const fs::path& path, std::size_t limit) {
  FileRead out;
  OpenFile file = open_regular_file(path);
  out.status = file.status;
  out.st = file.st;
  out.why = std::move(file.why);
  if (file.status != FileStatus::ok) return out;
  // Refuse before allocating: a hostile file must not make us read gigabytes to learn its size.
  if (static_cast<std::uintmax_t>(file.st.st_size) > limit) {
    out.status = FileStatus::too_large;
    out.why = fmt::format("larger than {} bytes", limit);
    return out;
  }
  ReadBytes read = read_at_most(file.fd.get(), limit);
  out.status = read.status;
  out.bytes = std::move(read.bytes);
  out.why = std::move(read.why);
  return out;
}

std::string read_text_input(const fs::path& path, std::string_view argument, std::size_t limit) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    throw InvalidArgument(std::string(argument),
                          fmt::format("cannot read '{}': {}", path.string(), errno_text(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw InvalidArgument(std::string(argument),
                          fmt::format("'{}' is a directory, not a file", path.string()));
  }
  ReadBytes read = read_at_most(fd.get(), limit);
  if (read.status != FileStatus::ok) {
    throw InvalidArgument(std::string(argument),
                          fmt::format("cannot read '{}': {}", path.string(), read.why));
  }
  return std::string(read.bytes.begin(), read.bytes.end());
}

std::string remove_if_same(const fs::path& path, const struct stat& read) {
  struct stat now {};
  if (::lstat(path.c_str(), &now) != 0 || now.st_dev != read.st_dev || now.st_ino != read.st_ino) {
    return {};
  }
  const int rc = S_ISDIR(now.st_mode) ? ::rmdir(path.c_str()) : ::unlink(path.c_str());
  if (rc != 0 && errno != ENOENT) return errno_text(errno);
  return {};
}

std::string write_file_atomically(const fs::path& path,
                                  std::initializer_list<std::span<const char>> parts, mode_t mode) {
  const fs::path dir = path.parent_path();
  fs::path temp;
  Fd fd(-1);
  // O_EXCL: the name is meant to be unique already; never write into someone else's file.
  for (int attempt = 0; attempt < 8 && !fd; ++attempt) {
    temp = dir / fmt::format(".{}.{}.{}.{:016x}{}", path.filename().string(), ::getpid(),
                             ::gettid(), random_u64(), kTempSuffix);
    // Test-only (util/fault.hpp): a directory we may not write into.
    if (fault::fire(Fault::disk_read_only)) {
      errno = EACCES;
      break;
    }
    fd = Fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode));
    if (!fd && errno != EEXIST) break;
  }
  if (!fd) return "cannot create a file in " + dir.string() + ": " + errno_text(errno);
  std::string why;
  bool first = true;
  // The umask may have removed bits; the mode is what we promise, not what the umask allows.
  if (::fchmod(fd.get(), mode) != 0) why = "cannot set the file mode: " + errno_text(errno);
  for (std::span<const char> part : parts) {
    if (!why.empty()) break;
    // Test-only (util/fault.hpp): the disk filling up after the first part went out.
    const int err = (!first && fault::fire(Fault::disk_full)) ? ENOSPC : write_all(fd.get(), part);
    if (err != 0) why = "cannot write: " + errno_text(err);
    first = false;
  }
  // Without it a crash after the rename could leave a named file with missing blocks.
  if (why.empty() && ::fsync(fd.get()) != 0) why = "cannot sync: " + errno_text(errno);
  if (why.empty()) {
    if (int err = fd.close(); err != 0) why = "cannot close: " + errno_text(err);
  }
  if (why.empty() && ::rename(temp.c_str(), path.c_str()) != 0) {
    why = "cannot rename into place: " + errno_text(errno);
  }
  if (!why.empty()) {
    ::unlink(temp.c_str());
    return why;
  }
  // Best effort: makes the rename itself durable. A failure here loses at most this file after
  // a power cut.
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd) ::fsync(dir_fd.get());
  return {};
}

std::optional<std::string_view> temp_file_target(std::string_view name) {
  if (!name.starts_with('.') || !name.ends_with(kTempSuffix)) return std::nullopt;
  name.remove_prefix(1);
  name.remove_suffix(kTempSuffix.size());
  // <target>.<pid>.<tid>.<16 hex>, split from the right: the target may contain dots.
  for (int field = 0; field < 3; ++field) {
    const std::size_t dot = name.rfind('.');
    if (dot == std::string_view::npos) return std::nullopt;
    const std::string_view digits = name.substr(dot + 1);
    if (field == 0 ? !(digits.size() == 16 && is_digits(digits, true))
                   : !is_digits(digits, false)) {
      return std::nullopt;
    }
    name = name.substr(0, dot);
  }
  if (name.empty()) return std::nullopt;
  return name;
}

FileLock::FileLock(const fs::path& path, mode_t mode) {
  const fs::path lock = fs::path(path.string() + ".lock");
  fd_ = Fd(::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode));
  if (!fd_) {
    error_ = "cannot open the lock file " + lock.string() + ": " + errno_text(errno);
    return;
  }
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    error_ = "the lock file " + lock.string() + " is not a regular file";
    fd_ = Fd(-1);
    return;
  }
  while (::flock(fd_.get(), LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    error_ = "cannot lock " + lock.string() + ": " + errno_text(errno);
    fd_ = Fd(-1);
    return;
  }
}

std::string why_untrusted_directory(const fs::path& dir, bool* exists) {
  *exists = false;
  std::error_code ec;
  const fs::path absolute = fs::absolute(dir, ec).lexically_normal();
  if (ec) return "cannot resolve " + dir.string() + ": " + ec.message();
  struct stat st {};
  if (::lstat(absolute.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return {};
    return "cannot stat " + absolute.string() + ": " + errno_text(errno);
  }
  *exists = true;
  // A link another user owns can be pointed elsewhere after we checked where it leads.
  fs::path prefix;
  for (const fs::path& part : absolute) {
    prefix /= part;
    struct stat link {};
    if (::lstat(prefix.c_str(), &link) == 0 && S_ISLNK(link.st_mode) &&
        !owner_trusted(link.st_uid)) {
      return fmt::format("{} is a symbolic link owned by {}", prefix.string(),
                         owner_text(link.st_uid));
    }
  }
  char* resolved = ::realpath(absolute.c_str(), nullptr);
  if (resolved == nullptr) return "cannot resolve " + absolute.string() + ": " + errno_text(errno);
  const fs::path real(resolved);
  std::free(resolved);
  if (::stat(real.c_str(), &st) != 0) return "cannot stat " + real.string();
  if (!S_ISDIR(st.st_mode)) return real.string() + " is not a directory";
  if (!owner_trusted(st.st_uid)) {
    return fmt::format("{} is owned by {}", real.string(), owner_text(st.st_uid));
  }
  if ((st.st_mode & 022) != 0) {
    return fmt::format("{} is writable by its group or by everyone (mode {:o})", real.string(),
                       st.st_mode & 07777);
  }
  // Whoever may rename a directory above ours may replace ours with one of theirs. The sticky
  // bit (as on /tmp) forbids renaming other users' entries.
  for (fs::path up = real.parent_path();; up = up.parent_path()) {
    struct stat above {};
    if (::stat(up.c_str(), &above) != 0) return "cannot stat " + up.string();
    if (!owner_trusted(above.st_uid)) {
      return fmt::format("{} (above {}) is owned by {}", up.string(), real.string(),
                         owner_text(above.st_uid));
    }
    if ((above.st_mode & 022) != 0 && (above.st_mode & S_ISVTX) == 0) {
      return fmt::format("{} (above {}) is writable by others and not sticky (mode {:o})",
                         up.string(), real.string(), above.st_mode & 07777);
    }
    if (up == up.root_path()) break;
  }
  return {};
}

std::string create_directories(const fs::path& dir, mode_t mode) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(dir, ec).lexically_normal();
  if (ec) return "cannot resolve " + dir.string() + ": " + ec.message();
  fs::path prefix;
  for (const fs::path& part : absolute) {
    if (part.empty()) continue;  // trailing separator
    prefix /= part;
    if (::mkdir(prefix.c_str(), mode) == 0) {
      // mkdir's mode passes through the umask; ours must not.
      if (::chmod(prefix.c_str(), mode) != 0) {
        return "cannot set the mode of " + prefix.string() + ": " + errno_text(errno);
      }
      continue;
    }
    if (errno == EEXIST) continue;
    if (errno == EACCES || errno == EPERM) {
      // An existing parent we may not write into is fine; a missing one is the failure.
      struct stat st {};
      if (::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    }
    return "cannot create " + prefix.string() + ": " + errno_text(errno);
  }
  struct stat st {};
  if (::stat(absolute.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absolute.string() + " exists and is not a directory";
  }
  return {};
}

}  // namespace fusejit
