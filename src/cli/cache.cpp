// fusejit cache ls|verify|clear|prune
#include <fmt/format.h>
#include <time.h>

#include <ctime>
#include <memory>
#include <string>

#include "cli/verbs.hpp"
#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/error.hpp"

namespace fusejit::cli {
namespace {

// UTC, so listings from machines in different zones compare as they read.
std::string utc_text(std::int64_t seconds) {
  const auto t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (seconds <= 0 || ::gmtime_r(&t, &tm) == nullptr) return "-";
  char text[32];
  const std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return n == 0 ? "-" : std::string(text, n);
}

}  // namespace

void add_cache(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("cache", "List, verify or clear the kernel cache");
  cmd->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--cache-dir", *dir, "Cache directory (default: see README)");
  auto open = [dir] { return DiskCache(DiskCache::resolve_dir(*dir)); };
  auto* ls = cmd->add_subcommand(
      "ls", "One line per entry: key, bytes, last use (UTC), status, description");
  auto* verify =
      cmd->add_subcommand("verify", "Check every entry's checksum; exit 1 if any is damaged");
  auto* clear = cmd->add_subcommand("clear", "Remove every entry");
  auto* prune = cmd->add_subcommand(
      "prune", "Remove least recently used entries until the cache holds at most --max-bytes");
  auto max_bytes = std::make_shared<std::string>();
  prune->add_option("--max-bytes", *max_bytes, "Bound: bytes, or with a K, M or G suffix")
      ->required();
  for (auto* sub : {ls, verify, clear, prune})
    sub->add_option("--cache-dir", *dir, "Cache directory");
  ls->callback([&action, open] {
    action = [open] {
      const DiskCache c = open();
      const auto entries = c.list();
      std::uintmax_t bytes = 0;
      for (const auto& e : entries) {
        bytes += e.bytes;
        fmt::print("{}  {:>9}  {:<20}  {:<7}  {}\n", e.key, e.bytes, utc_text(e.last_use),
                   e.valid ? "ok" : "DAMAGED", e.valid ? e.description : e.problem);
      }
      fmt::print("{} entries, {} bytes in {}\n", entries.size(), bytes, c.dir().string());
      return 0;
    };
  });
  verify->callback([&action, open] {
    action = [open] {
      const DiskCache c = open();
      // "0 entries, 0 damaged" for a directory that is not there would pass a check that
      // checked nothing (a typo in --cache-dir, an image built without its cache).
      if (!c.exists()) {
        fmt::print("no cache directory at {}\n", c.dir().string());
        return 1;
      }
      if (c.access() == CacheAccess::untrusted) {
        fmt::print("cache directory {} is not trusted: {}\n", c.dir().string(), c.why_untrusted());
        return 1;
      }
      int bad = 0;
      const auto entries = c.list();
      for (const auto& e : entries)
        if (!e.valid) {
          ++bad;
          fmt::print("DAMAGED {}: {}\n", e.key, e.problem);
        }
      fmt::print("{} entries verified, {} damaged, in {}\n", entries.size(), bad, c.dir().string());
      return bad ? 1 : 0;
    };
  });
  clear->callback([&action, open] {
    action = [open] {
      const DiskCache c = open();
      if (c.access() == CacheAccess::untrusted) {
        fmt::print("cache directory {} is not trusted, nothing removed: {}\n", c.dir().string(),
                   c.why_untrusted());
        return 1;
      }
      if (c.access() == CacheAccess::read_only) {
        fmt::print("cache directory {} is read-only, nothing removed\n", c.dir().string());
        return 1;
      }
      fmt::print("removed {} files from {}\n", c.clear(), c.dir().string());
      return 0;
    };
  });
  prune->callback([&action, open, max_bytes] {
    action = [open, max_bytes] {
      const auto bound = parse_byte_size(*max_bytes);
      if (!bound) {
        throw InvalidArgument("max-bytes",
                              "expected bytes, or a number with a K, M or G suffix; "
                              "got '" +
                                  *max_bytes + "'");
      }
      const DiskCache c = open();
      // Saying "removed 0" for a cache we may not touch would read as "already small enough".
      if (c.access() == CacheAccess::untrusted) {
        fmt::print("cache directory {} is not trusted: {}\n", c.dir().string(), c.why_untrusted());
        return 1;
      }
      if (c.access() == CacheAccess::read_only) {
        fmt::print("cache directory {} is read-only for this user; nothing removed\n",
                   c.dir().string());
        return 1;
      }
      const CachePruneResult r = c.prune(*bound);
      fmt::print("removed {} entries ({} bytes); {} bytes left in {}\n", r.removed, r.bytes_removed,
                 r.bytes_left, c.dir().string());
      return 0;
    };
  });
}

}  // namespace fusejit::cli
