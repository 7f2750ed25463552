// A directory of compiled kernels that many processes share. Entries are written to a temp
// file in the same directory, fsynced and renamed into place, and carry a header with their
// length and checksum that every read verifies: a damaged entry is logged, removed and
// reported as a miss, never returned.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fusejit {

struct CacheEntryInfo {
  std::string key;           // file name stem: the 32-hex-digit cache key
  std::string description;   // what the writer said it is (kernel name, arch)
  std::uintmax_t bytes = 0;  // file size
  bool valid = false;        // header, length and checksum verified
  std::string problem;       // why not valid (empty when valid)
};

class DiskCache {
 public:
  // FUSEJIT_CACHE_DIR; else the source tree's cache/ when this library runs from its build
  // tree; else $XDG_CACHE_HOME/fusejit; else ~/.cache/fusejit.
  static std::filesystem::path default_dir();

  // Never throws: an unusable directory turns the cache into a no-op that warns once.
  // An empty `dir` means default_dir().
  explicit DiskCache(std::filesystem::path dir = default_dir());

  const std::filesystem::path& dir() const { return dir_; }

  // load/store throw InvalidArgument("key") for a key that is not 32 lowercase hex digits
  // (their only exception). The verified payload under `key`, or nullopt (miss, or damaged
  // entry removed).
  std::optional<std::vector<char>> load(const std::string& key) const;
  // Stores atomically; returns false (after one warning per process) when the directory
  // cannot be written (read-only, no permission, disk full). Leaves no temp file behind.
  bool store(const std::string& key, const std::vector<char>& payload,
             const std::string& description) const;

  // Every entry, checksums verified (entries from other tools in the dir are ignored).
  std::vector<CacheEntryInfo> list() const;
  // Removes every entry and our temp files older than 10 minutes (younger ones may be another
  // process's write in flight); returns how many files were removed.
  std::size_t clear() const;

 private:
  std::filesystem::path dir_;
};

}  // namespace fusejit
