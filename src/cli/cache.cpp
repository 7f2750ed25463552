// fusejit cache ls|verify|clear
#include <fmt/format.h>

#include "cli/verbs.hpp"
#include "fusejit/cache/disk_cache.hpp"

namespace fusejit::cli {

void add_cache(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("cache", "List, verify or clear the kernel cache");
  cmd->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--cache-dir", *dir, "Cache directory (default: see README)");
  auto open = [dir] { return DiskCache(DiskCache::resolve_dir(*dir)); };
  auto* ls = cmd->add_subcommand("ls", "One line per entry: key, bytes, status, description");
  auto* verify =
      cmd->add_subcommand("verify", "Check every entry's checksum; exit 1 if any is damaged");
  auto* clear = cmd->add_subcommand("clear", "Remove every entry");
  for (auto* sub : {ls, verify, clear}) sub->add_option("--cache-dir", *dir, "Cache directory");
  ls->callback([&action, open] {
    action = [open] {
      const DiskCache c = open();
      const auto entries = c.list();
      std::uintmax_t bytes = 0;
      for (const auto& e : entries) {
        bytes += e.bytes;
        fmt::print("{}  {:>9}  {:<7}  {}\n", e.key, e.bytes, e.valid ? "ok" : "DAMAGED",
                   e.valid ? e.description : e.problem);
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
      fmt::print("removed {} files from {}\n", c.clear(), c.dir().string());
      return 0;
    };
  });
}

}  // namespace fusejit::cli
