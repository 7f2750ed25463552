// GPU time of repeated runs, as the tuner and `fusejit bench` both measure it: back-to-back
// runs on one stream with one event between each pair, rotating through several input sets so
// a small problem is not timed out of a warm L2. One harness, so the tuner's milliseconds and
// bench's mean the same thing.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/device_memory.hpp"

namespace fusejit {

// How many input sets of `set_bytes` each the runs rotate through: enough to cover three times
// the L2, within [min_sets, max_sets] and within half of the free device memory (never below
// one).
int timing_input_sets(double set_bytes, const Device& device, int min_sets, int max_sets);

double median(std::vector<double> values);

class EventTimer {
 public:
  // Up to `max_runs` timed runs per call of time().
  EventTimer(CUstream stream, int max_runs);

  // `warmup` untimed runs, then `count` (<= max_runs) timed ones of run(set, stream), `set`
  // counting on from the previous call modulo `sets`; appends each timed run's milliseconds.
  template <class Run>
  void time(Run&& run, int sets, int warmup, int count, std::vector<double>& times) {
    require(count);
    for (int i = 0; i < warmup; ++i) run(next_set(sets), stream_);
    for (int i = 0; i < count; ++i) {
      events_[static_cast<std::size_t>(i)].record(stream_);
      run(next_set(sets), stream_);
    }
    collect(count, times);
  }

 private:
  int next_set(int sets) { return static_cast<int>(cursor_++ % static_cast<std::size_t>(sets)); }
  void require(int count) const;
  void collect(int count, std::vector<double>& times);

  CUstream stream_;
  std::vector<Event> events_;
  std::size_t cursor_ = 0;
};

}  // namespace fusejit
