// fusejit's logger: one spdlog logger named "fusejit" writing to stderr. Its level comes from
// FUSEJIT_LOG_LEVEL (trace|debug|info|warn|error|off, default warn) so that a library linked
// into someone else's program stays quiet unless something is wrong.
#pragma once
#include <cstdint>
#include <memory>

#include <spdlog/logger.h>

namespace fusejit {

// Created on first use (thread-safe); never null. Not registered in spdlog's global registry,
// so the host program's spdlog settings do not change fusejit's level (set it here instead).
std::shared_ptr<spdlog::logger> log();

// How many messages at warn level or above the logger has emitted in this process. Tests use
// it to assert "warned exactly once" without capturing stderr.
std::uint64_t log_warning_count();

}  // namespace fusejit
