#include "fusejit/util/fault.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>

#include "fusejit/util/log.hpp"

namespace fusejit::fault {
namespace {

constexpr std::array<std::string_view, kFaultCount> kNames = {
    "nvrtc_compile",  "module_load",           "kernel_launch",   "disk_full",
    "disk_read_only", "cooperative_too_large", "lt_no_algorithm", "lt_rows_refused"};
static_assert(std::none_of(kNames.begin(), kNames.end(),
                           [](std::string_view n) { return n.empty(); }),
              "a name for each of the kFaultCount faults");

// Bit i: fault i is armed. kEnvPending: FUSEJIT_FAULTS has not been read yet. Kept in one word
// so that fire() on the fast path is one relaxed load and a test.
constexpr unsigned kEnvPending = 1u << 31;
std::atomic<unsigned> g_armed{kEnvPending};

// The slow path (something armed) takes a lock: firings must be counted exactly, and a test
// that arms a fault while another thread fires it must not lose the arming.
std::mutex g_mu;
std::array<int, kFaultCount> g_remaining{};  // kAlways, or firings left; guarded by g_mu
std::array<std::atomic<int>, kFaultCount> g_fired{};

unsigned bit(Fault f) {
  return 1u << static_cast<unsigned>(f);
}
std::size_t index(Fault f) {
  return static_cast<std::size_t>(f);
}

void set_locked(Fault f, int times) {
  g_remaining[index(f)] = times;
  if (times == 0)
    g_armed.fetch_and(~bit(f), std::memory_order_relaxed);
  else
    g_armed.fetch_or(bit(f), std::memory_order_relaxed);
}

// Reads FUSEJIT_FAULTS once. Unknown names are reported, not thrown: fire() runs inside code
// that must not fail for reasons of its own.
void read_env_locked() {
  if (!(g_armed.load(std::memory_order_relaxed) & kEnvPending)) return;
  g_armed.fetch_and(~kEnvPending, std::memory_order_relaxed);
  const char* env = std::getenv("FUSEJIT_FAULTS");
  if (env == nullptr || *env == '\0') return;
  std::string_view rest(env);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
    if (item.empty()) continue;
    int times = kAlways;
    bool ok = true;
    if (const std::size_t colon = item.find(':'); colon != std::string_view::npos) {
      const std::string_view count = item.substr(colon + 1);
      auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), times);
      ok = ec == std::errc() && end == count.data() + count.size() && times >= 0;
      item = item.substr(0, colon);
    }
    const std::optional<Fault> f = parse(item);
    try {
      if (!f || !ok) {
        log()->warn(
            "FUSEJIT_FAULTS: ignoring '{}' (expected NAME or NAME:COUNT with NAME one of {})", item,
            fmt::join(kNames, ", "));
        continue;
      }
      // Loud on purpose: a fault armed from the environment must never go unnoticed.
      log()->warn("FUSEJIT_FAULTS: fault injection armed: {} ({})", item,
                  times == kAlways ? std::string("every call") : std::to_string(times) + " times");
    } catch (...) {
      // Logging can only fail for lack of memory; arming still happens.
    }
    if (f && ok) set_locked(*f, times);
  }
}

}  // namespace

bool fire(Fault f) {
  const unsigned armed = g_armed.load(std::memory_order_relaxed);
  if (!(armed & (bit(f) | kEnvPending))) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  read_env_locked();
  int& left = g_remaining[index(f)];
  if (left == 0) return false;
  if (left > 0 && --left == 0) g_armed.fetch_and(~bit(f), std::memory_order_relaxed);
  g_fired[index(f)].fetch_add(1, std::memory_order_relaxed);
  try {
    log()->info("fault injection: {} fired", name(f));
  } catch (...) {
  }
  return true;
}

void arm(Fault f, int times) {
  std::lock_guard<std::mutex> lock(g_mu);
  read_env_locked();  // so a later first fire() cannot re-arm from the environment over this
  set_locked(f, times < 0 ? kAlways : times);
}

void disarm_all() {
  std::lock_guard<std::mutex> lock(g_mu);
  read_env_locked();
  for (int i = 0; i < kFaultCount; ++i) set_locked(static_cast<Fault>(i), 0);
}

int fired(Fault f) {
  return g_fired[index(f)].load(std::memory_order_relaxed);
}

std::string_view name(Fault f) {
  return kNames[index(f)];
}

std::optional<Fault> parse(std::string_view text) {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (text == kNames[i]) return static_cast<Fault>(i);
  return std::nullopt;
}

}  // namespace fusejit::fault
