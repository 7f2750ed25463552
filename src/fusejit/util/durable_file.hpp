// Files that several processes share and that another user or a clumsy operator may tamper
// with: the kernel cache's entries and the tuning database. One home for how they are
//   read     bounded, regular files only (never following a link, never blocking on a FIFO),
//            owned by this user or root;
//   written  a temp file of exactly the requested mode beside the target, fsynced, renamed
//            over it, the directory fsynced;
//   locked   an flock on a side file for read-modify-write cycles;
//   trusted  directories checked the way ssh checks ~/.ssh: owned by this user or root, not
//            writable by others, reached through no directory another user could swap.
#pragma once
#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/util/fd.hpp"

namespace fusejit {

std::string errno_text(int err);
// Random bits for unique temp names (getrandom; a clock-and-counter mix without entropy).
std::uint64_t random_u64();

// Directory and file modes. Private is the default; shared (0755/0644) is for a deployment
// cache that other users read but never write (FUSEJIT_CACHE_SHARED=1 when warming it).
struct FileModes {
  mode_t dir = 0700;
  mode_t file = 0600;
};
inline constexpr FileModes kPrivateModes{0700, 0600};
inline constexpr FileModes kSharedModes{0755, 0644};
// kSharedModes when FUSEJIT_CACHE_SHARED is "1", else kPrivateModes.
FileModes modes_from_env();

enum class FileStatus {
  ok,
  missing,      // no such file (ENOENT/ENOTDIR)
  not_regular,  // a symlink, FIFO, socket, device or directory under the name
  foreign,      // owned by a user who is neither this one nor root
  too_large,    // larger than the caller's limit
  error,        // could not open/stat/read: says nothing about the bytes on disk
};

// An open regular file, or why not. `st` describes what was opened (valid unless missing or
// error), so callers can later remove exactly that file and nothing that replaced it.
struct OpenFile {
  FileStatus status = FileStatus::missing;
  Fd fd{-1};
  struct stat st {};
  std::string why;  // for every status but ok and missing
};

// Opens `path` with O_NOFOLLOW | O_NONBLOCK, so a symlink or FIFO under the name is reported,
// not followed or waited on.
OpenFile open_regular_file(const std::filesystem::path& path);

// Reads from `fd`'s current position up to `limit` bytes; more than that is too_large. Reads to
// EOF rather than trusting st_size, so a file that changes under us fails its length checks
// instead of being cut.
struct ReadBytes {
  FileStatus status = FileStatus::ok;  // ok, too_large or error
  std::vector<char> bytes;
  std::string why;
};
ReadBytes read_at_most(int fd, std::size_t limit);

// open_regular_file + read_at_most(limit).
struct FileRead {
  FileStatus status = FileStatus::missing;
  struct stat st {};
  std::vector<char> bytes;
  std::string why;
};
FileRead read_regular_file(const std::filesystem::path& path, std::size_t limit);

// A text file a user named (--shapes-file, --sweep FILE): links are followed and pipes read,
// as the user asked, but never more than `limit` bytes, so /dev/zero or a huge file fails fast.
// Throws InvalidArgument(argument) naming the file and what was wrong.
inline constexpr std::size_t kMaxTextInputBytes = std::size_t{4} << 20;
std::string read_text_input(const std::filesystem::path& path, std::string_view argument,
                            std::size_t limit = kMaxTextInputBytes);

// Removes `path` only if it is still the file `read` describes: another process may have
// renamed a fresh, valid file into its place since. Symlinks and FIFOs are removed as links
// (never followed). Returns "" or why it could not.
std::string remove_if_same(const std::filesystem::path& path, const struct stat& read);

// Writes the concatenation of `parts` to `path` atomically: readers see the old file, no file,
// or the new one whole. The temp file (".<name>.<pid>.<tid>.<random>.tmp" beside `path`) gets
// exactly `mode`, whatever the umask. Returns "" or why it failed; never leaves the temp file.
// Test hooks: Fault::disk_read_only (creating the temp file), Fault::disk_full (before each
// part after the first: a disk filling up halfway through).
std::string write_file_atomically(const std::filesystem::path& path,
                                  std::initializer_list<std::span<const char>> parts, mode_t mode);
// The target file name when `name` is a temp file write_file_atomically made, so cleaners can
// tell their temp files from anything else in a directory.
std::optional<std::string_view> temp_file_target(std::string_view name);

// An exclusive flock on `<path>.lock` (created with `mode`, never through a symlink) for one
// read-modify-write. Other processes' readers never take it.
class FileLock {
 public:
  FileLock(const std::filesystem::path& path, mode_t mode);
  const std::string& error() const { return error_; }

 private:
  Fd fd_{-1};
  std::string error_;
};

// "" when code loaded from `dir` can be trusted: it is a directory (or a symlink owned by this
// user or root to one) owned by this user or root and writable by no one else, and every
// directory above its real path is owned by this user or root and is writable by no one else
// unless it has the sticky bit (as /tmp has). Otherwise why not, naming the directory at fault.
// A missing `dir` is "" here with *exists = false.
std::string why_untrusted_directory(const std::filesystem::path& dir, bool* exists);

// Creates `dir` and any missing parents with exactly `mode` (not masked by the umask). "" or
// why it failed. An existing directory is left as it is.
std::string create_directories(const std::filesystem::path& dir, mode_t mode);

}  // namespace fusejit
