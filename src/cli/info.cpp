#include <fmt/format.h>

#include <numeric>

#include "cli/verbs.hpp"
#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/driver.hpp"

namespace fusejit::cli {

void add_info(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("info", "GPU, NVRTC and cache summary");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--cache-dir", *dir, "Cache directory (default: see README)");
  cmd->callback([&action, dir] {
    action = [dir] {
      std::string why;
      if (driver_available(&why)) {
        int count = 0;
        check(driver().cuDeviceGetCount(&count), "cuDeviceGetCount");
        fmt::print("driver:   CUDA {}.{}\n", driver().version / 1000, driver().version % 1000 / 10);
        for (int i = 0; i < count; ++i) {
          try {
            const Device d = Device::get(i);
            fmt::print("gpu {}:    {} (sm_{}, target {}), {} SMs, {} KiB smem/block, {} MiB L2\n",
                       i, d.name, d.cc(), d.arch(), d.sm_count, d.smem_per_block_optin / 1024,
                       d.l2_bytes >> 20);
          } catch (const std::exception& e) {
            fmt::print("gpu {}:    unusable: {}\n", i, e.what());
          }
        }
      } else {
        fmt::print("gpu:      none ({})\n", why);
      }
      std::string archs;
      for (int a : nvrtc_supported_archs()) archs += (archs.empty() ? "" : " ") + std::to_string(a);
      fmt::print("nvrtc:    {} (archs: {})\n", nvrtc_version(), archs);
      const DiskCache cache(DiskCache::resolve_dir(*dir));
      const auto entries = cache.list();
      std::uintmax_t bytes = 0;
      for (const auto& e : entries) bytes += e.bytes;
      const char* access = cache.access() == CacheAccess::untrusted   ? ", NOT TRUSTED: "
                           : cache.access() == CacheAccess::read_only ? ", read-only"
                                                                      : "";
      fmt::print("cache:    {} ({} entries, {} bytes{}{})\n", cache.dir().string(), entries.size(),
                 bytes, access, cache.why_untrusted());
      return 0;
    };
  });
}

}  // namespace fusejit::cli
