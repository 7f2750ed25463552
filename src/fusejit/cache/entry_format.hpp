// The bytes of one on-disk cache entry. Every field is checked on read, so a file that was
// truncated, bit-flipped, written by another format version or by another tool is rejected
// instead of handed to the driver.
//
//   offset  size  field
//   0       8     magic "FJCACHE1"
//   8       4     format version, u32 little-endian (kCacheEntryVersion)
//   12      4     description length d, u32 LE (at most kMaxCacheDescriptionBytes)
//   16      8     payload length p, u64 LE
//   24      8     XXH3-64 of the payload, u64 LE
//   32      d     description text (not NUL-terminated)
//   32+d    8     XXH3-64 of bytes [0, 32+d), u64 LE: the header checks itself, so a flipped
//                 bit in the description or a length is caught even when sizes still agree
//   40+d    p     payload
// The entry is exactly 40 + d + p bytes: anything after the payload is damage too.
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
inline constexpr std::uint32_t kCacheEntryVersion = 1;
inline constexpr std::size_t kCacheEntryFixedBytes = 32;  // magic .. payload checksum
inline constexpr std::uint32_t kMaxCacheDescriptionBytes = 64 * 1024;

// Header bytes for `description` + `payload` (everything before the payload, so a writer can
// send the payload without copying it). Throws InvalidArgument("description") when the
// description is longer than kMaxCacheDescriptionBytes.
std::vector<char> cache_entry_header(std::span<const char> payload, std::string_view description);

// The whole entry: header followed by payload.
std::vector<char> serialize_cache_entry(std::span<const char> payload,
                                        std::string_view description);

// A verified entry; both views point into the buffer given to parse_cache_entry.
struct CacheEntryView {
  std::string_view description;
  std::span<const char> payload;
  std::size_t payload_offset = 0;  // where the payload starts in that buffer
};

// Checks magic, version, lengths and both checksums without reading outside `bytes`. Returns
// nullopt on any inconsistency and, when `problem` is given, says which.
std::optional<CacheEntryView> parse_cache_entry(std::span<const char> bytes,
                                                std::string* problem = nullptr);

}  // namespace fusejit
