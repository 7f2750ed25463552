// The bytes of one on-disk cache entry. Every field is checked on read, so a file that was
// truncated, bit-flipped, written by another format version or by another tool, or stored
// under another key (renamed, swapped, restored from elsewhere) is rejected instead of handed
// to the driver.
//
//   offset  size  field
//   0       8     magic "FJCACHE1"
//   8       4     format version, u32 little-endian (kCacheEntryVersion)
//   12      4     description length d, u32 LE (at most kMaxCacheDescriptionBytes)
//   16      8     payload length p, u64 LE
//   24      8     XXH3-64 of the payload, u64 LE
//   32      32    the cache key the entry was built for (32 lowercase hex digits): the loader
//                 compares it with the key it asked for, so an entry is bound to its request
//   64      d     description text (not NUL-terminated)
//   64+d    8     XXH3-64 of bytes [0, 64+d), u64 LE: the header checks itself, so a flipped
//                 bit in the key, the description or a length is caught even when sizes agree
//   72+d    p     payload
// The entry is exactly 72 + d + p bytes: anything after the payload is damage too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fusejit {

inline constexpr std::string_view kCacheEntryMagic = "FJCACHE1";
// 2: the key in the header. Version-1 entries are rejected (and so rebuilt), never trusted.
inline constexpr std::uint32_t kCacheEntryVersion = 2;
inline constexpr std::size_t kCacheKeyDigits = 32;
inline constexpr std::size_t kCacheEntryFixedBytes = 64;    // magic .. key
inline constexpr std::size_t kCacheEntryChecksumBytes = 8;  // the header's own checksum
inline constexpr std::uint32_t kMaxCacheDescriptionBytes = 64 * 1024;

// True for 32 lowercase hex digits: keys become file names, so nothing else may be one.
bool is_cache_key(std::string_view key);

// Header bytes for `key` + `description` + `payload` (everything before the payload, so a
// writer can send the payload without copying it). Throws InvalidArgument("key") for a key
// is_cache_key refuses and InvalidArgument("description") when the description is longer than
// kMaxCacheDescriptionBytes.
std::vector<char> cache_entry_header(std::span<const char> payload, std::string_view key,
                                     std::string_view description);

// The whole entry: header followed by payload.
std::vector<char> serialize_cache_entry(std::span<const char> payload, std::string_view key,
                                        std::string_view description);

// The whole entry's size as its first kCacheEntryFixedBytes declare it (magic, version and
// lengths checked, checksums not), so a reader can refuse a file whose size disagrees before
// reading it. nullopt (and why, when `problem` is given) when the prefix is already damage.
std::optional<std::uint64_t> cache_entry_declared_size(std::span<const char> prefix,
                                                       std::string* problem = nullptr);

// A verified entry; the views point into the buffer given to parse_cache_entry.
struct CacheEntryView {
  std::string_view key;
  std::string_view description;
  std::span<const char> payload;
  std::size_t payload_offset = 0;  // where the payload starts in that buffer
};

// Checks magic, version, lengths, the key's form and both checksums without reading outside
// `bytes`. Returns nullopt on any inconsistency and, when `problem` is given, says which.
// Whether the key is the one asked for is the caller's check (DiskCache::load).
std::optional<CacheEntryView> parse_cache_entry(std::span<const char> bytes,
                                                std::string* problem = nullptr);

}  // namespace fusejit
