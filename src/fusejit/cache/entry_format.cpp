#include "fusejit/cache/entry_format.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "fusejit/error.hpp"
#include "fusejit/util/hash.hpp"

namespace fusejit {
namespace {

constexpr std::size_t kHeaderChecksumBytes = kCacheEntryChecksumBytes;
constexpr std::size_t kKeyOffset = 32;

void put_le(std::vector<char>& out, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>(static_cast<unsigned char>(value >> (8 * i))));
  }
}

// Callers check the bounds first: `at + bytes <= data.size()`.
std::uint64_t get_le(std::span<const char> data, std::size_t at, std::size_t bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    value |= std::uint64_t{static_cast<unsigned char>(data[at + i])} << (8 * i);
  }
  return value;
}

std::optional<CacheEntryView> reject(std::string* problem, std::string why) {
  if (problem != nullptr) *problem = std::move(why);
  return std::nullopt;
}

}  // namespace

bool is_cache_key(std::string_view key) {
  return key.size() == kCacheKeyDigits && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::vector<char> cache_entry_header(std::span<const char> payload, std::string_view key,
                                     std::string_view description) {
  if (!is_cache_key(key)) {
    throw InvalidArgument("key", "a cache key is 32 lowercase hex digits");
  }
  if (description.size() > kMaxCacheDescriptionBytes) {
    throw InvalidArgument("description", "cache entry descriptions are limited to " +
                                             std::to_string(kMaxCacheDescriptionBytes) +
                                             " bytes, got " + std::to_string(description.size()));
  }
  std::vector<char> header;
  header.reserve(kCacheEntryFixedBytes + description.size() + kHeaderChecksumBytes);
  header.insert(header.end(), kCacheEntryMagic.begin(), kCacheEntryMagic.end());
  put_le(header, kCacheEntryVersion, 4);
  put_le(header, description.size(), 4);
  put_le(header, payload.size(), 8);
  put_le(header, xxh3_64(payload.data(), payload.size()), 8);
  header.insert(header.end(), key.begin(), key.end());
  header.insert(header.end(), description.begin(), description.end());
  put_le(header, xxh3_64(header.data(), header.size()), kHeaderChecksumBytes);
  return header;
}

std::vector<char> serialize_cache_entry(std::span<const char> payload, std::string_view key,
                                        std::string_view description) {
  std::vector<char> entry = cache_entry_header(payload, key, description);
  entry.insert(entry.end(), payload.begin(), payload.end());
  return entry;
}

std::optional<std::uint64_t> cache_entry_declared_size(std::span<const char> bytes,
                                                       std::string* problem) {
  const std::size_t size = bytes.size();
  auto fail = [problem](std::string why) -> std::optional<std::uint64_t> {
    if (problem != nullptr) *problem = std::move(why);
    return std::nullopt;
  };
  if (size < kCacheEntryFixedBytes) {
    return fail("truncated: " + std::to_string(size) + " bytes, the header alone needs " +
                std::to_string(kCacheEntryFixedBytes));
  }
  if (std::memcmp(bytes.data(), kCacheEntryMagic.data(), kCacheEntryMagic.size()) != 0) {
    return fail("not a fusejit cache entry (bad magic)");
  }
  const std::uint64_t version = get_le(bytes, 8, 4);
  if (version != kCacheEntryVersion) {
    return fail("format version " + std::to_string(version) + ", this fusejit reads " +
                std::to_string(kCacheEntryVersion));
  }
  const std::uint64_t description_size = get_le(bytes, 12, 4);
  if (description_size > kMaxCacheDescriptionBytes) {
    return fail("description length " + std::to_string(description_size) +
                " exceeds the limit of " + std::to_string(kMaxCacheDescriptionBytes));
  }
  const std::uint64_t payload_size = get_le(bytes, 16, 8);
  const std::uint64_t header_size = kCacheEntryFixedBytes + description_size + kHeaderChecksumBytes;
  if (payload_size > std::numeric_limits<std::uint64_t>::max() - header_size) {
    return fail("payload length " + std::to_string(payload_size) + " overflows");
  }
  return header_size + payload_size;
}

std::optional<CacheEntryView> parse_cache_entry(std::span<const char> bytes, std::string* problem) {
  const std::size_t size = bytes.size();
  if (!cache_entry_declared_size(bytes, problem)) return std::nullopt;
  const std::uint64_t description_size = get_le(bytes, 12, 4);
  // Cannot overflow: both terms are small.
  const std::size_t header_size =
      kCacheEntryFixedBytes + static_cast<std::size_t>(description_size) + kHeaderChecksumBytes;
  if (size < header_size) {
    return reject(problem, "truncated: " + std::to_string(size) + " bytes, the header needs " +
                               std::to_string(header_size));
  }
  const std::size_t checked_size = header_size - kHeaderChecksumBytes;
  if (xxh3_64(bytes.data(), checked_size) != get_le(bytes, checked_size, kHeaderChecksumBytes)) {
    return reject(problem, "header checksum mismatch");
  }
  const std::uint64_t payload_size = get_le(bytes, 16, 8);
  const std::size_t available = size - header_size;
  if (payload_size != available) {
    return reject(problem, "payload length " + std::to_string(payload_size) + " but " +
                               std::to_string(available) + " bytes follow the header (" +
                               (payload_size > available ? "truncated" : "trailing bytes") + ")");
  }
  const std::span<const char> payload = bytes.subspan(header_size);
  if (xxh3_64(payload.data(), payload.size()) != get_le(bytes, 24, 8)) {
    return reject(problem, "payload checksum mismatch");
  }
  const std::string_view key(bytes.data() + kKeyOffset, kCacheKeyDigits);
  if (!is_cache_key(key)) return reject(problem, "the key in the header is not 32 hex digits");
  CacheEntryView view;
  view.key = key;
  view.description = std::string_view(bytes.data() + kCacheEntryFixedBytes,
                                      static_cast<std::size_t>(description_size));
  view.payload = payload;
  view.payload_offset = header_size;
  return view;
}

}  // namespace fusejit
