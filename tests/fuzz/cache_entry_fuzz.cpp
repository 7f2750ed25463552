// parse_cache_entry over arbitrary bytes and over damaged valid entries. Properties:
//  - it never reads outside the buffer (ASan) and never accepts a buffer whose stored payload or
//    header checksum does not match its bytes (recomputed here, independently of the parser);
//  - what it accepts is canonical: serializing the parsed key, description and payload gives
//    back exactly the input bytes;
//  - flipping any one bit of an accepted entry makes it rejected.
// The first input byte picks the mode: raw bytes (most fail at the magic or a checksum), or a
// valid entry built from the input and then damaged in input-chosen ways, with the header
// checksum optionally recomputed so the length and payload checks behind it are reached.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fusejit/cache/entry_format.hpp"
#include "fusejit/util/hash.hpp"
#include "fuzz_check.hpp"

namespace {

using fusejit::kCacheEntryFixedBytes;

std::uint64_t get_le(const std::vector<char>& b, std::size_t at, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i)
    v |= std::uint64_t{static_cast<unsigned char>(b[at + i])} << (8 * i);
  return v;
}

void put_le(std::vector<char>& b, std::size_t at, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

void check_accepted(const std::vector<char>& bytes) {
  std::string problem;
  const auto view = fusejit::parse_cache_entry(bytes, &problem);
  if (!view) {
    FJ_FUZZ_CHECK(!problem.empty(), "rejected without saying why");
    return;
  }
  // Independent re-derivation of what the format says must hold.
  FJ_FUZZ_CHECK(bytes.size() >= kCacheEntryFixedBytes + 8, "accepted a short buffer");
  const std::size_t d = get_le(bytes, 12, 4);
  const std::size_t header = kCacheEntryFixedBytes + d + 8;
  FJ_FUZZ_CHECK(header <= bytes.size(), "description runs past the end");
  FJ_FUZZ_CHECK(get_le(bytes, 16, 8) == bytes.size() - header, "payload length mismatch accepted");
  FJ_FUZZ_CHECK(
      fusejit::xxh3_64(bytes.data() + header, bytes.size() - header) == get_le(bytes, 24, 8),
      "payload checksum mismatch accepted");
  FJ_FUZZ_CHECK(fusejit::xxh3_64(bytes.data(), header - 8) == get_le(bytes, header - 8, 8),
                "header checksum mismatch accepted");
  FJ_FUZZ_CHECK(view->payload_offset == header && view->payload.size() == bytes.size() - header &&
                    view->payload.data() == bytes.data() + header,
                "payload view does not match the layout");
  FJ_FUZZ_CHECK(fusejit::is_cache_key(view->key), "accepted a header key that is no key");
  const auto again = fusejit::serialize_cache_entry(view->payload, view->key, view->description);
  FJ_FUZZ_CHECK(again == bytes, "accepted a non-canonical entry");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  ++data, --size;
  if (mode % 2 == 0) {
    check_accepted(std::vector<char>(data, data + size));
    return 0;
  }
  // Structured: [d_len][damage ops: 4 bytes each, count in the next byte][description][payload]
  if (size < 2) return 0;
  const std::size_t d_len = std::min<std::size_t>(data[0], size - 2);
  const std::size_t ops = data[1];
  data += 2, size -= 2;
  const std::size_t op_bytes = std::min(size - d_len, ops * 4);
  const std::span<const std::uint8_t> op_data(data, op_bytes);
  const std::string_view description(reinterpret_cast<const char*>(data + op_bytes),
                                     std::min(d_len, size - op_bytes));
  const std::span<const char> payload(
      reinterpret_cast<const char*>(data + op_bytes + description.size()),
      size - op_bytes - description.size());
  // The key: the first 16 payload bytes as hex digits where there are enough, a fixed one else.
  std::string key(fusejit::kCacheKeyDigits, '0');
  for (std::size_t i = 0; i < key.size() && i / 2 < payload.size(); ++i)
    key[i] =
        "0123456789abcdef"[(static_cast<unsigned char>(payload[i / 2]) >> (i % 2 ? 0 : 4)) & 0xF];
  std::vector<char> entry = fusejit::serialize_cache_entry(payload, key, description);
  {
    // Undamaged: accepted, and every single-bit flip of it rejected.
    std::string problem;
    const auto view = fusejit::parse_cache_entry(entry, &problem);
    FJ_FUZZ_CHECK(view.has_value(), "a freshly serialized entry is rejected: %s", problem.c_str());
    FJ_FUZZ_CHECK(
        view->description == description && view->key == key &&
            std::equal(view->payload.begin(), view->payload.end(), payload.begin(), payload.end()),
        "round trip changed the contents");
    check_accepted(entry);
    const std::size_t bit = op_data.empty() ? 0 : (op_data[0] * 7919u) % (entry.size() * 8);
    std::vector<char> flipped = entry;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    FJ_FUZZ_CHECK(!fusejit::parse_cache_entry(flipped).has_value(), "accepted with bit %zu flipped",
                  bit);
  }
  // Damage: each op is (kind, position hi, position lo, value).
  bool fix_header = false;
  for (std::size_t i = 0; i + 4 <= op_data.size(); i += 4) {
    const std::uint8_t kind = op_data[i];
    const std::size_t at =
        entry.empty() ? 0 : ((op_data[i + 1] << 8) | op_data[i + 2]) % entry.size();
    const std::uint8_t v = op_data[i + 3];
    switch (kind % 6) {
      case 0:
        if (!entry.empty()) entry[at] = static_cast<char>(v);
        break;
      case 1:
        entry.resize(at);  // truncate
        break;
      case 2:
        entry.insert(entry.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(v));
        break;
      case 3:  // overwrite a length field with something nearby or huge
        if (entry.size() >= kCacheEntryFixedBytes) {
          if (v % 2)
            put_le(entry, 12, get_le(entry, 12, 4) + (v >> 1) - 64, 4);
          else
            put_le(entry, 16, get_le(entry, 16, 8) + (v >> 1) - 64, 8);
        }
        break;
      case 4:
        entry.push_back(static_cast<char>(v));
        break;
      case 5:
        fix_header = true;
        break;
    }
  }
  if (fix_header && entry.size() >= kCacheEntryFixedBytes) {
    // Re-sign the header as a careless writer would, so the checks behind it are reached.
    const std::size_t d = get_le(entry, 12, 4);
    if (d <= fusejit::kMaxCacheDescriptionBytes && kCacheEntryFixedBytes + d + 8 <= entry.size())
      put_le(entry, kCacheEntryFixedBytes + d,
             fusejit::xxh3_64(entry.data(), kCacheEntryFixedBytes + d), 8);
  }
  check_accepted(entry);
  return 0;
}
