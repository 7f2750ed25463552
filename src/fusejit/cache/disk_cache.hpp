// A directory of compiled kernels that many processes share. Entries are written to a temp
// file in the same directory, fsynced and renamed into place (util/durable_file), and carry a
// header with their key, length and checksums that every read verifies: a damaged entry, or
// one stored under another key, is logged, removed and reported as a miss, never returned.
//
// Trust: the directory is used only when util/durable_file's why_untrusted_directory passes
// (owned by this user or root, writable by no one else, no other user's directory or link on
// the way); otherwise the cache warns once and is a no-op (kernels compiled in memory).
// Entries must be regular files owned by this user or root. Directories it creates get 0700
// and entries 0600, or 0755/0644 with FUSEJIT_CACHE_SHARED=1 (warming a deployment cache that
// other users read). A trusted directory this user cannot write is a read-only cache: entries
// load, nothing is stored or removed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/util/durable_file.hpp"

namespace fusejit {

enum class CacheAccess {
  read_write,
  read_only,  // trusted, but this user may not write it (a deployment image's cache)
  untrusted,  // not used at all: see why()
};

struct CacheEntryInfo {
  std::string key;           // file name stem: the 32-hex-digit cache key
  std::string description;   // what the writer said it is (kernel name, arch)
  std::uintmax_t bytes = 0;  // file size
  bool valid = false;        // header, key, length and checksums verified
  std::string problem;       // why not valid (empty when valid)
};

class DiskCache {
 public:
  // FUSEJIT_CACHE_DIR; else the source tree's cache/ when this library runs from its build
  // tree; else $XDG_CACHE_HOME/fusejit; else ~/.cache/fusejit.
  static std::filesystem::path default_dir();
  // The one rule for an option that names a cache directory: empty means default_dir().
  static std::filesystem::path resolve_dir(const std::string& cache_dir);

  // Never throws: an unusable directory turns the cache into a no-op that warns once.
  // An empty `dir` means default_dir().
  explicit DiskCache(std::filesystem::path dir = default_dir());

  const std::filesystem::path& dir() const { return dir_; }
  // What the trust check found when this object was made.
  CacheAccess access() const { return access_; }
  bool exists() const { return exists_; }
  const std::string& why_untrusted() const { return why_; }

  // load/store throw InvalidArgument("key") for a key that is not 32 lowercase hex digits
  // (their only exception). The verified payload under `key`, or nullopt (miss, or damaged
  // entry removed).
  std::optional<std::vector<char>> load(const std::string& key) const;
  // Stores atomically; returns false (after one warning per process) when the directory
  // cannot be written (untrusted, read-only, no permission, disk full). Leaves no temp file.
  bool store(const std::string& key, const std::vector<char>& payload,
             const std::string& description) const;

  // Everything named like an entry, verified as load() would (key against file name, header
  // against payload); links, FIFOs and foreign files named like entries are listed as damaged.
  // Files not named like entries are ignored.
  std::vector<CacheEntryInfo> list() const;
  // Removes everything named like an entry (links and FIFOs as names, never what they point
  // to; directories only when empty) and our temp files older than 10 minutes (younger ones
  // may be another process's write in flight); returns how many names were removed.
  std::size_t clear() const;

 private:
  struct Inspected {
    FileStatus status = FileStatus::missing;
    struct stat st {};
    std::vector<char> bytes;
    std::size_t payload_offset = 0;
    std::string description;
    std::string problem;  // empty only for a verified entry of the asked key
  };
  static Inspected inspect(const std::filesystem::path& path, std::string_view key);
  void check_access();

  std::filesystem::path dir_;
  FileModes modes_;
  CacheAccess access_ = CacheAccess::read_write;
  bool exists_ = false;
  std::string why_;
};

}  // namespace fusejit
