#include "fusejit/util/log.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>

#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace fusejit {
namespace {

std::atomic<std::uint64_t> g_warnings{0};

// Counts instead of writing; it sees exactly what the stderr sink sees.
class WarningCounter final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::warn && msg.level != spdlog::level::off) {
      g_warnings.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void flush_() override {}
};

std::optional<spdlog::level::level_enum> parse_level(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (text == "trace") return spdlog::level::trace;
  if (text == "debug") return spdlog::level::debug;
  if (text == "info") return spdlog::level::info;
  if (text == "warn" || text == "warning") return spdlog::level::warn;
  if (text == "error") return spdlog::level::err;
  if (text == "critical") return spdlog::level::critical;
  if (text == "off") return spdlog::level::off;
  return std::nullopt;
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto stderr_sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto counter = std::make_shared<WarningCounter>();
  auto logger =
      std::make_shared<spdlog::logger>("fusejit", spdlog::sinks_init_list{stderr_sink, counter});
  logger->set_pattern("[%n] [%l] %v");

  const char* env = std::getenv("FUSEJIT_LOG_LEVEL");
  const std::optional<spdlog::level::level_enum> level =
      env != nullptr && *env != '\0' ? parse_level(env) : spdlog::level::warn;
  logger->set_level(level.value_or(spdlog::level::warn));
  // Flushing on warnings keeps them ordered with the program's own stderr output.
  logger->flush_on(spdlog::level::warn);
  if (!level) {
    logger->warn("FUSEJIT_LOG_LEVEL='{}' is not one of trace|debug|info|warn|error|off; using warn",
                 env);
  }
  return logger;
}

}  // namespace

std::shared_ptr<spdlog::logger> log() {
  // Never destroyed: code running in other static destructors may still log.
  static const auto* const logger = new std::shared_ptr<spdlog::logger>(make_logger());
  return *logger;
}

std::uint64_t log_warning_count() {
  return g_warnings.load(std::memory_order_relaxed);
}

}  // namespace fusejit
