#include "fusejit/device/event_timer.hpp"

#include <algorithm>
#include <cmath>

#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"

namespace fusejit {

int timing_input_sets(double set_bytes, const Device& device, int min_sets, int max_sets) {
  int sets = static_cast<int>(
      std::clamp(std::ceil(3.0 * static_cast<double>(device.l2_bytes) / std::max(set_bytes, 1.0)),
                 static_cast<double>(min_sets), static_cast<double>(max_sets)));
  std::size_t free = 0, total = 0;
  FJ_CU(cuMemGetInfo(&free, &total));
  while (sets > 1 && sets * set_bytes > 0.5 * static_cast<double>(free)) --sets;
  return sets;
}

double median(std::vector<double> v) {
  if (v.empty()) throw InvalidArgument("values", "the median of nothing");
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

EventTimer::EventTimer(CUstream stream, int max_runs)
    : stream_(stream), events_(static_cast<std::size_t>(max_runs) + 1) {}

void EventTimer::require(int count) const {
  if (count < 0 || static_cast<std::size_t>(count) >= events_.size())
    throw InvalidArgument("count", "more timed runs than the timer was made for");
}

void EventTimer::collect(int count, std::vector<double>& times) {
  const auto n = static_cast<std::size_t>(count);
  events_[n].record(stream_);
  events_[n].synchronize();
  for (std::size_t i = 0; i < n; ++i)
    times.push_back(Event::elapsed_ms(events_[i], events_[i + 1]));
}

}  // namespace fusejit
