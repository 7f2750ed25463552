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
//
// Size: the entries' total is bounded (set_default_max_bytes, FUSEJIT_CACHE_MAX_BYTES, else
// 2 GiB). An entry's mtime is its last use: written by store(), refreshed by load() (at most
// once a minute per entry, so hot loops write no metadata); store() removes the least recently
// used entries when the bound is passed, and prune() does so on demand.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/util/durable_file.hpp"

namespace fusejit {

enum class CacheAccess {
  read_write,
  read_only,  // trusted, but this user may not write it (a deployment image's cache)
  untrusted,  // not used at all: see why()
};

struct CacheEntryInfo {
  std::string key;            // file name stem: the 32-hex-digit cache key
  std::string description;    // what the writer said it is (kernel name, arch)
  std::uintmax_t bytes = 0;   // file size
  bool valid = false;         // header, key, length and checksums verified
  std::string problem;        // why not valid (empty when valid)
  std::int64_t last_use = 0;  // mtime, seconds since the epoch: stored or last loaded
};

struct CachePruneResult {
  std::size_t removed = 0;  // entry names removed
  std::uintmax_t bytes_removed = 0;
  std::uintmax_t bytes_left = 0;  // entry files still there (may exceed the bound when what
                                  // is left is another user's or the entry just stored)
};

// A byte count as users write one: digits with an optional K, M or G suffix (either case;
// powers of 1024). nullopt for anything else, overflow included.
std::optional<std::uintmax_t> parse_byte_size(std::string_view text);

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
  // may be another process's write in flight); returns how many names were removed. Never in a
  // read-only or untrusted cache.
  std::size_t clear() const;

  // Removes entries (valid or damaged, links and FIFOs as names) least recently used first
  // until the entry files total at most `max_bytes`. Never in a read-only or untrusted cache;
  // another user's entries are counted but left. Temp files are not entries: clear() has them.
  CachePruneResult prune(std::uintmax_t max_bytes) const;

  // The bound store() keeps: this object's if set_max_bytes gave one, else the process's.
  std::uintmax_t max_bytes() const;
  void set_max_bytes(std::uintmax_t bytes) { max_bytes_ = bytes; }  // 0: the process's
  // The process-wide bound for every DiskCache. 0 restores the default: FUSEJIT_CACHE_MAX_BYTES
  // (parse_byte_size; a bad value warns once and is ignored), else 2 GiB.
  static void set_default_max_bytes(std::uintmax_t bytes);
  static std::uintmax_t default_max_bytes();

 private:
  struct Inspected {
    FileStatus status = FileStatus::missing;
    struct stat st {};
    Fd fd{-1};  // the file read, kept open so load() can mark its use on exactly that file
    std::vector<char> bytes;
    std::size_t payload_offset = 0;
    std::string description;
    std::string problem;  // empty only for a verified entry of the asked key
  };
  static Inspected inspect(const std::filesystem::path& path, std::string_view key);
  void check_access();
  // Scans the directory; when the entries total more than `trigger`, removes the least
  // recently used (never `keep`) until they total at most `target`.
  CachePruneResult prune_entries(std::uintmax_t trigger, std::uintmax_t target,
                                 std::string_view keep) const;
  void bound_after_store(const std::string& key, std::uintmax_t bytes) const noexcept;

  std::filesystem::path dir_;
  FileModes modes_;
  CacheAccess access_ = CacheAccess::read_write;
  bool exists_ = false;
  std::string why_;
  std::uintmax_t max_bytes_ = 0;
};

}  // namespace fusejit
